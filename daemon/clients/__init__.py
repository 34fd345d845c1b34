"""What runs outside the daemon and talks to it over its socket (or Redis): the ``claude_code``
tool, the terminal client and the fleet reader. Nothing here imports the server."""
