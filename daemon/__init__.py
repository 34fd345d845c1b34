"""The imperative shell of codelegate, one sub-package per role (DESIGN "Packages").

- ``serving``: the aiohttp surface: listeners, access, routes, NDJSON and WebSocket streams;
- ``supervision``: one CLI process per run, followed to its last descendant;
- ``store``: the SQLite run store on its own thread;
- ``clients``: what runs outside the daemon and only talks to it (the ``claude_code`` tool, the
  terminal client, the fleet reader): it imports nothing of the server.

The modules at this level join them: a run's life (``runs``, ``record``, ``recovery``), the fan-out
(``hub``, ``fanout``), logs, metrics and the command line.
"""
