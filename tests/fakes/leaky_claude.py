#!/usr/bin/env python3
"""A fake Claude CLI that plants credentials everywhere it can (stdlib only).

The prompt's first line is ``leak file=<json of planted secrets> exit=<code>``. It prints them in
tool arguments (as values and under credential-shaped keys), in tool output (an env dump with
its own real environment, .env and YAML text, a PEM key, a JWT), in assistant text, in a
permission denial, in a malformed and an unknown line, in the final result, and on stderr.

Also what the model or the CLI chooses (a tool name, a written file's path, a denied tool's name,
a subagent's last tool, the session id it reports), the credentials the daemon passed to it
(printed bare, base64- and hex-encoded, JSON- and URL-escaped), shapes the redactor once missed
(JSON-escaped keys, URL userinfo, AIza, docker auth, PGP, AccountKey, a service account's
private_key), and on stderr a PEM key over several lines and a line cut by the daemon in the
middle of a token.
"""

from __future__ import annotations

import base64
import json
import os
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

# A script of its own, started by path: the fakes' stdin reader is found from the repository.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.fakes.fake_claude import VERSION, read_prompt

STDERR_LINE_CHARS = 2000  # the daemon's cut (supervision.supervisor): the token straddles it


def main() -> int:
    if "--version" in sys.argv:
        print(f"{VERSION} (Claude Code)")
        return 0
    words = read_prompt().split("\n", 1)[0].split()
    params = dict(w.split("=", 1) for w in words[1:] if "=" in w)
    with open(params["file"]) as fh:
        s: dict[str, str] = json.load(fh)
    code = int(params.get("exit", "0"))
    args = sys.argv[1:]
    session = args[args.index("--session-id") + 1]
    out = sys.stdout.buffer

    def emit(obj: dict[str, Any]) -> None:
        out.write(json.dumps(obj).encode() + b"\n")
        out.flush()

    base = {"parent_tool_use_id": None, "session_id": session}
    emit({"type": "system", "subtype": "init", "cwd": os.getcwd(), "tools": ["Bash"]} | base)
    text = f"I will use {s['ant']} and {s['ghp']} for this."
    emit(
        {"type": "assistant", "message": {"id": "m1", "content": [{"type": "text", "text": text}]}}
        | base
    )
    use = {
        "type": "tool_use",
        "id": "toolu_leak1",
        "name": "Bash",
        "input": {
            "command": f"curl -H 'Authorization: Bearer {s['bearer']}' https://api.example.com",
            "api_key": s["keyed"],
            "headers": {"Cookie": s["cookie"], "X-Auth-Token": s["keyed2"]},
        },
    }
    emit({"type": "assistant", "message": {"id": "m2", "content": [use]}} | base)
    env_dump = "\n".join(f"{k}={v}" for k, v in sorted(os.environ.items()))
    dump = "\n".join(
        [
            env_dump,
            f"GITHUB_TOKEN={s['ghp']}",
            f"DB_PASSWORD={s['password']}",
            f"AWS_ACCESS_KEY_ID={s['akia']}",
            f"AWS_SECRET_ACCESS_KEY={s['aws_secret']}",
            s["pem"],
            f"session jwt {s['jwt']}",
        ]
    )
    result = {
        "type": "tool_result",
        "tool_use_id": "toolu_leak1",
        "content": dump,
        "is_error": False,
    }
    emit(
        {
            "type": "user",
            "message": {"role": "user", "content": [result]},
            "tool_use_result": {"stdout": dump, "stderr": f"token={s['token']}"},
        }
        | base
    )
    use2 = {"type": "tool_use", "id": "toolu_leak2", "name": "Read", "input": {"file_path": ".env"}}
    emit({"type": "assistant", "message": {"id": "m3", "content": [use2]}} | base)
    env_file = f'password: "{s["password2"]}"\nclient_secret = {s["client_secret"]}\n'
    result2 = {"type": "tool_result", "tool_use_id": "toolu_leak2", "content": env_file}
    emit({"type": "user", "message": {"role": "user", "content": [result2]}} | base)
    emit(
        {
            "type": "system",
            "subtype": "permission_denied",
            "tool_name": "Bash",
            "tool_use_id": "toolu_leak3",
            "message": f"denied: export API_KEY={s['denied']}",
        }
        | base
    )
    out.write(b'{"broken": "' + s["malformed"].encode() + b'", \n')
    emit({"type": "weird_new_type", "secret": s["unknown"], "note": s["ant"]} | base)
    chosen(emit, base, s)
    sys.stderr.write(
        f"ERROR auth failed: ANTHROPIC_API_KEY={os.environ.get('ANTHROPIC_API_KEY')}\n"
    )
    sys.stderr.write(f"retrying with Bearer {s['bearer']} and {s['ant2']}\n")
    sys.stderr.write(f"loaded key:\n{s['pem_stderr']}\n")
    # 14 characters of the token's core before the daemon's cut: too few for its shape.
    head = "x" * (STDERR_LINE_CHARS - 1 - 4 - 14)
    sys.stderr.write(f"{head} {s['cut_ghp']} and more\n")
    sys.stderr.write(f"the token was {os.environ.get('ANTHROPIC_AUTH_TOKEN')}\n")
    sys.stderr.flush()
    emit(
        {
            "type": "result",
            "subtype": "success",
            "is_error": code != 0,
            "result": f"Done. Used {s['ant2']}. password={s['password']}",
            "num_turns": 2,
            "permission_denials": [
                {
                    "tool_name": "Bash",
                    "tool_use_id": "toolu_leak3",
                    "tool_input": {
                        "command": f"export TOKEN={s['denied']}",
                        "secret": s["denied2"],
                    },
                }
            ],
        }
        | base
    )
    return code


def chosen(emit: Any, base: dict[str, Any], s: dict[str, str]) -> None:
    """What the model or the CLI chooses, the credentials passed in, the shapes once missed."""
    cwd = os.getcwd()
    uses = [
        {
            "type": "tool_use",
            "id": "toolu_leak4",
            "name": "Write",
            "input": {"file_path": f"{cwd}/tokens/{s['path_ghp']}/notes.txt", "content": "x"},
        },
        {"type": "tool_use", "id": "toolu_leak5", "name": s["tool_name"], "input": {}},
        {"type": "tool_use", "id": "toolu_leak6", "name": "Task", "input": {"description": "d"}},
        {"type": "tool_use", "id": "toolu_leak7", "name": "Bash", "input": {"command": "env"}},
    ]
    emit({"type": "assistant", "message": {"id": "m4", "content": uses}} | base)

    def result(use_id: str, text: str, extra: Any = None) -> None:
        block = {"type": "tool_result", "tool_use_id": use_id, "content": text}
        line = {"type": "user", "message": {"role": "user", "content": [block]}}
        emit(line | ({"tool_use_result": extra} if extra else {}) | base)

    result("toolu_leak4", "written", {"type": "create", "filePath": "notes.txt"})
    emit(
        {
            "type": "system",
            "subtype": "task_progress",
            "tool_use_id": "toolu_leak6",
            "task_id": "k1",
            "description": "working",
            "last_tool_name": s["last_tool"],
            "usage": {"tool_uses": 1},
        }
        | base
    )
    emit(
        {
            "type": "system",
            "subtype": "permission_denied",
            "tool_use_id": "toolu_leak5",
            "tool_name": s["tool_name"],
            "message": "denied",
        }
        | base
    )
    result("toolu_leak6", "done")
    auth = os.environ.get("ANTHROPIC_AUTH_TOKEN", "")
    oauth = os.environ.get("CLAUDE_CODE_OAUTH_TOKEN", "")
    passed = [
        auth,
        base64.b64encode(b"user:" + auth.encode()).decode(),
        auth.encode().hex(),
        json.dumps({"t": oauth}),
        quote(oauth, safe=""),
        base64.urlsafe_b64encode(oauth.encode()).decode(),
    ]
    shapes = [
        '{\\"api_key\\": \\"' + s["escaped"] + '\\"}',
        f"DATABASE_URL=postgres://app:{s['url_pw']}@db.internal:5432/prod",
        f"git clone https://bob:{s['git_tok']}@github.com/x/y.git",
        f"maps {s['aiza']} key",
        '{"auths": {"ghcr.io": {"auth": "' + s["docker"] + '"}}}',
        s["pgp"],
        f"DefaultEndpointsProtocol=https;AccountName=a;AccountKey={s['account_key']};x=y",
        # `cat` of a cloud service account's key file: the PEM is a JSON string's value.
        json.dumps({"type": "service_account", "private_key": s["account_pem"]}, indent=2),
    ]
    result("toolu_leak7", "\n".join(passed + shapes))
    # The CLI reports a session id of its own choosing.
    emit({"type": "system", "subtype": "init", "session_id": s["session"], "tools": []})


if __name__ == "__main__":
    sys.exit(main())
