"""The one build step pyproject.toml cannot say: the translator compiled, when asked.

``CODELEGATE_COMPILE=1`` compiles the translator modules that ``[tool.codelegate] compiled``
lists with mypyc (the mypy in constraints.txt, and a C compiler). The source stays the same
Python: mypyc turns its type annotations into native code, and the translator spends a fifth to
a third less CPU a line (bench/RESULTS.md §1). Without it, or with ``0``, the build is pure
Python and does exactly the same, more slowly. Modules that define msgspec Structs stay Python:
mypyc would compile their classes as its own, and a Struct must stay msgspec's. The compiled
build also carries the credential screen in C (``translator/_screen.c``): the one piece of the
rules that reads every character of every text, which no interpreter nor mypyc reads as fast.

Compile only wheels (``make wheel``, the Dockerfile, README "systemd"): an editable install
compiles next to the sources, where the shared objects would shadow the code the tests cover.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

from setuptools import Extension, setup

ROOT = Path(__file__).resolve().parent


def compiled_modules() -> list[str]:
    """The paths of the modules to compile, as pyproject.toml lists them."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        names: list[str] = tomllib.load(f)["tool"]["codelegate"]["compiled"]
    return [f"codelegate/translator/{name}.py" for name in names]


def ext_modules() -> list[Extension]:
    asked = os.environ.get("CODELEGATE_COMPILE", "")
    if asked not in ("", "0", "1"):
        raise SystemExit(f"CODELEGATE_COMPILE must be 0 or 1, not {asked!r}")
    if asked != "1":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        raise SystemExit(
            "CODELEGATE_COMPILE=1 needs mypyc in the build environment: pip install -c"
            " constraints.txt mypy setuptools, then build with --no-build-isolation"
        ) from None
    screen = Extension(
        "codelegate.translator._screen",
        ["codelegate/translator/_screen.c"],
        extra_compile_args=["-O3"],
    )
    return [*mypycify(compiled_modules(), opt_level="3"), screen]


setup(ext_modules=ext_modules())
