"""The house's layout, enforced: one import name, sub-packages by role, no circles, short modules.

Walks the AST of every module of ``codelegate`` (imports in function bodies and under
``TYPE_CHECKING`` count: a circle of types is still a circle of ideas) and checks DESIGN
"Packages":

- everything imports ``codelegate.*``; the folders' own names (``daemon``, ``translator``,
  ``policy``) are not import names, in the code, the tests or the benchmarks;
- ``translator`` and ``policy`` import nothing of the daemon (their purity is
  tests/policy/test_purity.py);
- aiohttp is the serving layer's and the terminal client's alone;
- the clients import nothing of the server, and the ``claude_code`` tool only the standard library;
- the import graph has no circles, of modules nor of the three packages (``policy`` imports
  nothing of ``translator``, which builds on it), and no module is longer than :data:`MAX_LINES`;
- every translator module that defines no msgspec Struct is in the compiled build (setup.py).
"""

from __future__ import annotations

import ast
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("daemon", "translator", "policy")
MAX_LINES = 450
# The tool runs in the agent's venv, which has nothing of ours but this package.
STDLIB_ONLY = (
    "codelegate.daemon.clients.tool",
    "codelegate.daemon.clients.tool_follow",
    "codelegate.daemon.clients.tool_approve",
    "codelegate.daemon.clients.tool_stream",
    "codelegate.daemon.clients.tool_wait",
    "codelegate.daemon.clients.tool_result",
    "codelegate.daemon.clients.unix_http",
)
AIOHTTP_ALLOWED = ("codelegate.daemon.serving", "codelegate.daemon.clients.terminal")
# What a client may import of the project: the pure packages, the other clients, the key scheme.
CLIENT_MAY_IMPORT = (
    "codelegate.translator",
    "codelegate.policy",
    "codelegate.daemon.clients",
    "codelegate.daemon.fanout_keys",
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] == "codelegate":
        parts = parts[1:]
    if parts and parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["codelegate", *parts])


def modules() -> dict[str, Path]:
    found = {module_name(p): p for d in FOLDERS for p in (ROOT / d).rglob("*.py")}
    found["codelegate"] = ROOT / "codelegate" / "__init__.py"
    return found


MODULES = modules()


def imports(name: str, path: Path) -> Iterator[tuple[int, str]]:
    """Every module ``path`` imports, absolute, with its line (``from a import b`` yields
    ``a.b`` as well when that is a module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            yield node.lineno, module
            for alias in node.names:
                if f"{module}.{alias.name}" in MODULES:
                    yield node.lineno, f"{module}.{alias.name}"


def within(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def graph() -> dict[str, set[str]]:
    return {
        name: {m for _, m in imports(name, path) if m in MODULES and m != name}
        for name, path in MODULES.items()
    }


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_the_layout_has_its_roles() -> None:
    for role in ("clients", "supervision", "store", "serving"):
        assert f"codelegate.daemon.{role}" in MODULES


def python_files_outside_the_package() -> list[Path]:
    return sorted(p for d in ("tests", "bench") for p in (ROOT / d).rglob("*.py"))


@pytest.mark.parametrize(
    "path",
    [*MODULES.values(), *python_files_outside_the_package()],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_only_codelegate_is_an_import_name(path: Path) -> None:
    bad = [
        f"{line}: {module}"
        for line, module in imports(module_name(path), path)
        if module.split(".")[0] in FOLDERS
    ]
    assert bad == []


def test_the_pure_packages_import_nothing_of_the_daemon() -> None:
    bad = [
        f"{name} imports {module}"
        for name, path in MODULES.items()
        if within(name, ("codelegate.translator", "codelegate.policy"))
        for _, module in imports(name, path)
        if within(module, ("codelegate.daemon",)) or module == "codelegate"
    ]
    assert bad == []


def test_aiohttp_is_only_in_serving_and_the_terminal_client() -> None:
    bad = [
        name
        for name, path in MODULES.items()
        if not within(name, AIOHTTP_ALLOWED)
        and any(m.split(".")[0] == "aiohttp" for _, m in imports(name, path))
    ]
    assert bad == []


def test_the_clients_import_nothing_of_the_server() -> None:
    bad = [
        f"{name} imports {module}"
        for name, path in MODULES.items()
        if within(name, ("codelegate.daemon.clients",))
        for _, module in imports(name, path)
        if module.startswith("codelegate") and not within(module, CLIENT_MAY_IMPORT)
    ]
    assert bad == []


@pytest.mark.parametrize("name", STDLIB_ONLY)
def test_the_tool_imports_only_the_standard_library(name: str) -> None:
    outside = [
        module
        for _, module in imports(name, MODULES[name])
        if module.split(".")[0] not in sys.stdlib_module_names
        and module.split(".")[0] != "__future__"
        and not within(module, STDLIB_ONLY)
    ]
    assert outside == []


def test_the_import_graph_has_no_circles() -> None:
    assert circles(graph()) == []


def test_the_packages_import_each_other_one_way_only() -> None:
    # The three folders (``codelegate`` itself only names the public API: not a package here).
    packages: dict[str, set[str]] = {f"codelegate.{folder}": set() for folder in FOLDERS}
    for name, children in graph().items():
        package = ".".join(name.split(".")[:2])
        if package in packages:
            packages[package].update(".".join(child.split(".")[:2]) for child in children)
    assert (
        circles({name: packages.keys() & edges - {name} for name, edges in packages.items()}) == []
    )


def test_the_circle_finder_finds_a_circle() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(edges) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_is_longer_than_the_house_allows(name: str) -> None:
    lines = MODULES[name].read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_LINES, f"{MODULES[name].relative_to(ROOT)}: {lines} lines"


def _defines_structs(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ClassDef) and any(
            isinstance(base, ast.Attribute) and base.attr == "Struct" for base in node.bases
        ):
            return True
        if isinstance(node, ast.Attribute) and node.attr == "defstruct":
            return True
    return False


def test_every_translator_module_without_structs_is_compiled() -> None:
    # setup.py compiles what pyproject.toml lists; a module that defines msgspec Structs cannot
    # be (setup.py says why), and any other one must be, so that no new rule runs slowly.
    listed = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["codelegate"]["compiled"]
    modules = {p.stem: p for p in (ROOT / "translator").glob("*.py") if p.stem != "__init__"}
    assert sorted(listed) == sorted(name for name, p in modules.items() if not _defines_structs(p))
    assert _defines_structs(ROOT / "translator" / "wire.py")  # the test can tell
