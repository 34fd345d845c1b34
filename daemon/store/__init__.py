"""The run store: runs, results, session ids and every frame, in SQLite on its own thread."""
