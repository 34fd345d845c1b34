"""Run benchmarks: ``python -m bench [NAME …] [--option …]``.

With no name, every ``bench/bench_*.py`` runs; options go to each module's ``main(argv)``.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    """Run the named benchmarks (all by default); non-zero when one of them fails its bar."""
    # Names first, then options (``translator --rounds 5``).
    split = next((n for n, arg in enumerate(argv) if arg.startswith("-")), len(argv))
    names, options = argv[:split], argv[split:]
    if not names:
        names = sorted(
            path.stem.removeprefix("bench_") for path in Path(__file__).parent.glob("bench_*.py")
        )
    status = 0
    for name in names:
        print(f"== bench {name}", flush=True)
        module = importlib.import_module(f"bench.bench_{name}")
        status = module.main(options) or status
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
