"""Workspace containment against a real directory tree with symlinks (os.path.realpath in)."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from codelegate.policy.config import Config
from codelegate.policy.errors import PolicyError
from codelegate.policy.paths import is_inside
from codelegate.policy.workspace import resolve_workspace
from tests.policy.conftest import make_config


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """base/{ws/{a, b/c, file.txt, links…}, ws2, outside, rootlink -> ws}."""
    base = tmp_path_factory.mktemp("containment").resolve()
    ws = base / "ws"
    for folder in (ws / "a", ws / "b" / "c", base / "ws2", base / "outside"):
        folder.mkdir(parents=True)
    (ws / "file.txt").write_text("x")
    (ws / "link_in").symlink_to("a")
    (ws / "link_out").symlink_to("../outside")
    (ws / "link_abs_out").symlink_to(base / "ws2")
    (ws / "link_up").symlink_to("..")
    (ws / "link_file").symlink_to("file.txt")
    (ws / "dangling").symlink_to("nowhere")
    (ws / "loop").symlink_to("loop")
    (ws / "b" / "link_back").symlink_to("../a")
    (base / "rootlink").symlink_to("ws")
    return base


def enterable(path: str) -> bool:
    return os.access(path, os.X_OK)


def yes(path: str) -> bool:
    return True


def resolve(config: Config, requested: str) -> str:
    return resolve_workspace(
        config, requested, realpath=os.path.realpath, isdir=os.path.isdir, can_enter=enterable
    )


def in_tree(tree: Path) -> Config:
    return make_config(roots=(str(tree / "ws"),))


ACCEPTED = [
    (".", "ws"),
    ("a", "ws/a"),
    ("a/", "ws/a"),
    ("./a//", "ws/a"),
    ("b/c", "ws/b/c"),
    ("link_in", "ws/a"),
    ("b/link_back", "ws/a"),
    ("{base}/ws", "ws"),
    ("{base}/ws/b/c", "ws/b/c"),
    ("{base}/rootlink/a", "ws/a"),
]


@pytest.mark.parametrize(("requested", "expected"), ACCEPTED)
def test_accepted(tree: Path, requested: str, expected: str) -> None:
    assert resolve(in_tree(tree), requested.format(base=tree)) == str(tree / expected)


REFUSED = [
    ("link_out", "workspace_outside_roots", "outside every workspace root"),
    ("link_abs_out", "workspace_outside_roots", "outside"),
    ("link_up", "workspace_outside_roots", "outside"),
    ("{base}/ws2", "workspace_outside_roots", "outside"),  # shares the root's string prefix
    ("{base}/outside", "workspace_outside_roots", "outside"),
    ("{base}", "workspace_outside_roots", "outside"),
    ("/etc", "workspace_outside_roots", "outside"),
    ("..", "workspace_invalid", "'..'"),
    ("../ws2", "workspace_invalid", "'..'"),
    ("a/../../outside", "workspace_invalid", "'..'"),
    ("{base}/ws/../ws2", "workspace_invalid", "'..'"),
    ("a\x00", "workspace_invalid", "NUL"),
    ("", "workspace_invalid", "empty"),
    ("  ", "workspace_invalid", "empty"),
    ("/proc/self/cwd", "workspace_invalid", "/proc"),
    ("/proc/self/root{base}/ws/a", "workspace_invalid", "/proc"),
    ("/proc/1/cwd", "workspace_invalid", "/proc"),
    ("/dev/shm", "workspace_invalid", "/dev"),
    ("/sys", "workspace_invalid", "/sys"),
    ("//proc/self/cwd", "workspace_invalid", "/proc"),
    ("file.txt", "workspace_not_directory", "not an existing directory"),
    ("link_file", "workspace_not_directory", "not an existing directory"),
    ("missing", "workspace_not_directory", "not an existing directory"),
    ("dangling", "workspace_not_directory", "not an existing directory"),
    ("loop", "workspace_not_directory", "not an existing directory"),
]


@pytest.mark.parametrize(("requested", "code", "words"), REFUSED)
def test_refused(tree: Path, requested: str, code: str, words: str) -> None:
    with pytest.raises(PolicyError) as caught:
        resolve(in_tree(tree), requested.format(base=tree))
    assert (caught.value.status, caught.value.code) == (403, code)
    assert words in caught.value.message


def test_relative_paths_resolve_against_the_first_root(tree: Path) -> None:
    config = make_config(roots=(str(tree / "ws2"), str(tree / "ws")))
    assert resolve(config, ".") == str(tree / "ws2")
    assert resolve(config, str(tree / "ws" / "a")) == str(tree / "ws" / "a")
    with pytest.raises(PolicyError, match="workspace_not_directory"):
        resolve(config, "a")


def test_no_roots_in_a_hand_built_config(config: Config) -> None:
    empty = msgspec.structs.replace(
        config, policy=msgspec.structs.replace(config.policy, workspaces=())
    )
    with pytest.raises(PolicyError, match="no workspace roots"):
        resolve(empty, ".")


def test_a_realpath_that_fails_is_a_refusal(config: Config) -> None:
    def failing(path: str) -> str:
        raise OSError(40, "Too many levels of symbolic links")

    with pytest.raises(PolicyError) as caught:
        resolve_workspace(config, "x", realpath=failing, isdir=yes, can_enter=yes)
    assert caught.value.code == "workspace_not_directory"
    assert "cannot be resolved" in caught.value.message


def test_a_path_resolving_into_proc_is_refused_even_under_a_wide_root(config: Config) -> None:
    wide = msgspec.structs.replace(
        config, policy=msgspec.structs.replace(config.policy, workspaces=("/",))
    )
    fake = {"/srv/x": "/proc/1/cwd"}
    with pytest.raises(PolicyError, match="workspace_outside_roots"):
        resolve_workspace(
            wide, "/srv/x", realpath=lambda p: fake.get(p, p), isdir=yes, can_enter=yes
        )
    assert resolve_workspace(wide, "/srv/y", realpath=lambda p: p, isdir=yes, can_enter=yes) == (
        "/srv/y"
    )


@pytest.mark.parametrize(
    ("requested", "closed"),
    [
        ("b/c", "ws/b"),  # a folder on the way
        ("b", "ws/b"),  # the cwd itself
        (".", "ws"),  # the root
        ("{base}/rootlink/b/c", "ws/b"),  # named through a link: the resolved folder is named
    ],
)
def test_a_cwd_the_daemons_user_may_not_enter_is_refused_naming_the_folder_closed_to_it(
    tree: Path, requested: str, closed: str
) -> None:
    # "cannot start claude: Permission denied" was the chdir into it, not the CLI.
    shut = str(tree / closed)
    with pytest.raises(PolicyError) as caught:
        resolve_workspace(
            in_tree(tree),
            requested.format(base=tree),
            realpath=os.path.realpath,
            isdir=os.path.isdir,
            can_enter=lambda p: p != shut and enterable(p),
        )
    assert (caught.value.status, caught.value.code) == (403, "workspace_permission_denied")
    assert f"may not enter {shut} (Permission denied" in caught.value.message


def test_a_folder_above_the_root_closed_to_the_daemon_is_named_too(tree: Path) -> None:
    with pytest.raises(PolicyError, match=f"may not enter {tree} ") as caught:
        resolve_workspace(
            in_tree(tree),
            "a",
            realpath=os.path.realpath,
            isdir=os.path.isdir,
            can_enter=lambda p: p != str(tree) and enterable(p),
        )
    assert caught.value.code == "workspace_permission_denied"


@pytest.mark.parametrize("requested", ["missing", "file.txt", "missing/deeper"])
def test_what_is_no_directory_stays_not_a_directory_though_it_cannot_be_entered(
    tree: Path, requested: str
) -> None:
    with pytest.raises(PolicyError) as caught:
        resolve_workspace(
            in_tree(tree),
            requested,
            realpath=os.path.realpath,
            isdir=os.path.isdir,
            can_enter=enterable,  # False for a path that is not there, as os.access says
        )
    assert caught.value.code == "workspace_not_directory"


@pytest.mark.parametrize(
    ("path", "root", "inside"),
    [
        ("/srv/ws", "/srv/ws", True),
        ("/srv/ws/a", "/srv/ws", True),
        ("/srv/ws2", "/srv/ws", False),
        ("/srv/w", "/srv/ws", False),
        ("/srv", "/srv/ws", False),
        ("/srv/ws/a", "/srv/ws/", True),
        ("/anything", "/", True),
    ],
)
def test_is_inside(path: str, root: str, inside: bool) -> None:
    assert is_inside(path, root) is inside


SEGMENTS = st.sampled_from(
    [
        "a",
        "b",
        "c",
        "link_in",
        "link_out",
        "link_abs_out",
        "link_up",
        "link_back",
        "file.txt",
        "missing",
        "dangling",
        "loop",
        ".",
        "",
        "..",
        "ws",
        "ws2",
        "outside",
        "rootlink",
    ]
)


@given(
    prefix=st.sampled_from(["", "{base}/", "{base}/ws/", "{base}/rootlink/", "{base}/ws2/"]),
    segments=st.lists(SEGMENTS | st.text(max_size=4), max_size=6),
)
def test_containment_property(tree: Path, prefix: str, segments: list[str]) -> None:
    """Accepted ⇔ the real path is a directory inside the real root (checked by commonpath)."""
    config = in_tree(tree)
    requested = prefix.format(base=tree) + "/".join(segments)
    real_root = os.path.realpath(tree / "ws")
    accepted: str | None
    refusal: PolicyError | None = None
    try:
        accepted = resolve(config, requested)
    except PolicyError as exc:
        accepted, refusal = None, exc
    assert refusal is None or refusal.status == 403
    if "\x00" in requested or not requested.strip() or ".." in requested.split("/"):
        assert accepted is None
        return
    candidate = requested if requested.startswith("/") else os.path.join(real_root, requested)
    real = os.path.realpath(candidate)
    expected = os.path.isdir(real) and os.path.commonpath([real, real_root]) == real_root
    if expected:
        assert accepted == real
    else:
        assert accepted is None
    if accepted is not None:
        assert os.path.realpath(accepted) == accepted
        assert os.path.isdir(accepted)
