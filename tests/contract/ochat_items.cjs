'use strict';
// What O Chat shows for a stream of frames: each frame's JSON text goes through O Chat's own
// normalizer (mapEventToChatItem of @connectonion/react), accumulated as its RemoteAgent does.
//
//   node ochat_items.cjs <mapper.bundle.cjs>  <  {"feeds": [[frame text, ...], ...]}
//   -> {"feeds": [[items after frame 1, items after frame 2, ...], ...]}
//
// Each feed starts from no items (a fresh client); a reconnect is a feed that repeats frames.
const path = require('node:path');

const { mapEventToChatItem } = require(path.resolve(process.argv[2]));

// RemoteAgent._handleMessage passes only these types to the mapper; the rest are ignored.
const MAPPED = new Set([
  'llm_call', 'llm_result', 'tool_call', 'tool_result', 'tool_call_update',
  'provider_invocation', 'provider_activity', 'provider_artifact', 'provider_message',
  'thinking', 'assistant', 'agent_image', 'intent', 'eval', 'compact', 'tool_blocked',
  'files_received',
]);

function feed(texts) {
  const items = [];
  let unnamed = 0;
  // RemoteAgent._addChatItem: upsert by id, merging into the item already there.
  const addItem = (item) => {
    const id = item.id ?? `unnamed-${++unnamed}`; // O Chat uses a random id: fixed here
    const at = items.findIndex((old) => old.id === id);
    if (at >= 0) items[at] = { ...items[at], ...item, id };
    else items.push({ ...item, id });
  };
  const steps = [];
  for (const text of texts) {
    const event = JSON.parse(text);
    if (MAPPED.has(event.type)) mapEventToChatItem(items, event, addItem);
    steps.push(JSON.parse(JSON.stringify(items)));
  }
  return steps;
}

let input = '';
process.stdin.setEncoding('utf8');
process.stdin.on('data', (chunk) => { input += chunk; });
process.stdin.on('end', () => {
  const { feeds } = JSON.parse(input);
  process.stdout.write(JSON.stringify({ feeds: feeds.map(feed) }));
});
