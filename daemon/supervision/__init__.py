"""Supervision: one Claude CLI process per run, followed to the last process it started."""
