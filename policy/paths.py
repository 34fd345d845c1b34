"""Path containment by whole components: the one test both the workspace check of a run's cwd
and the config's check of the daemon's own files use (pure string logic, paths already resolved).
"""

from __future__ import annotations


def is_inside(path: str, root: str) -> bool:
    """True when ``path`` is ``root`` or below it, by whole components (both already resolved)."""
    return path == root or path.startswith(root.rstrip("/") + "/")
