"""Helpers for the policy tests: configs built from TOML text, the way operators write them."""

from __future__ import annotations

import uuid

import pytest

from codelegate.policy.config import Config, parse_config

SOURCE = "/etc/codelegate/config.toml"
ROOT = "/srv/workspaces/demo"


def make_config(extra: str = "", *, roots: tuple[str, ...] = (ROOT,)) -> Config:
    """A parsed config with ``roots`` as workspaces and ``extra`` TOML appended to [policy]."""
    listed = ", ".join(f'"{root}"' for root in roots)
    text = f"[policy]\nworkspaces = [{listed}]\n{extra}"
    return parse_config(text.encode(), SOURCE)


def flag_values(argv: tuple[str, ...], flag: str) -> list[str]:
    """The value after each ``flag`` in ``argv``, in order."""
    return [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == flag]


@pytest.fixture
def config() -> Config:
    return make_config()


@pytest.fixture
def session_id() -> str:
    return str(uuid.uuid4())
