"""The imperative shell of codelegate: HTTP and WebSocket server, run supervision, fan-out hub,
run store, command line, logging."""

__version__ = "0.1.0"
