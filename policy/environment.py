"""The child environment's vocabulary: which variables exist to Claude Code, and which never pass.

A run's environment is an allowlist, never the daemon's environment minus a denylist: only the
variables of DESIGN "Child environment" reach Claude, plus what the operator names in
``[claude] pass_env`` (never a name that could switch permission checks off or inject code into
the CLI), plus two that policy sets itself: ``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1`` and the
run marker ``CODELEGATE_RUN_ID``, which every descendant inherits so that the daemon can find a
run's processes even after they leave its process tree.

The names live here, below the config schema, which refuses a bad ``pass_env`` with them;
``policy.child_env`` applies them to one config.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

RUN_MARKER_VAR: Final = "CODELEGATE_RUN_ID"
NONESSENTIAL_TRAFFIC_VAR: Final = "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"

BASE_VARS: Final = frozenset({"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "TZ", "TMPDIR"})
AUTH_VARS: Final = frozenset(
    {
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_AUTH_TOKEN",
        "ANTHROPIC_BASE_URL",
        "CLAUDE_CODE_OAUTH_TOKEN",
        "CLAUDE_CONFIG_DIR",
    }
)
BEDROCK_VARS: Final = frozenset(
    {
        "CLAUDE_CODE_USE_BEDROCK",
        "CLAUDE_CODE_SKIP_BEDROCK_AUTH",
        "ANTHROPIC_BEDROCK_BASE_URL",
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
        "AWS_PROFILE",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_BEARER_TOKEN_BEDROCK",
        "AWS_CONFIG_FILE",
        "AWS_SHARED_CREDENTIALS_FILE",
        "AWS_ROLE_ARN",
        "AWS_ROLE_SESSION_NAME",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_CONTAINER_AUTHORIZATION_TOKEN",
    }
)
VERTEX_VARS: Final = frozenset(
    {
        "CLAUDE_CODE_USE_VERTEX",
        "CLAUDE_CODE_SKIP_VERTEX_AUTH",
        "ANTHROPIC_VERTEX_PROJECT_ID",
        "ANTHROPIC_VERTEX_BASE_URL",
        "CLOUD_ML_REGION",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "GOOGLE_CLOUD_PROJECT",
        "GCLOUD_PROJECT",
        "CLOUDSDK_CONFIG",
    }
)
# Vertex reads per-model regions from VERTEX_REGION_CLAUDE_<MODEL>.
_VERTEX_PREFIX: Final = "VERTEX_REGION_CLAUDE_"
_LOCALE: Final = re.compile(r"LC_[A-Z_]{1,32}", re.ASCII)
_ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}", re.ASCII)

# Names policy sets itself: an operator's copy would override them.
_OWN_VARS: Final = frozenset({RUN_MARKER_VAR, NONESSENTIAL_TRAFFIC_VAR, "CLAUDE_CODE_SAFE_MODE"})
# Variables that load code into the CLI or a shell before permission checks run; passing one
# would let whoever controls the daemon's environment rewrite the CLI's behaviour.
_CODE_INJECTION_VARS: Final = frozenset(
    {
        "BASH_ENV",
        "ENV",
        "SHELLOPTS",
        "BASHOPTS",
        "PROMPT_COMMAND",
        "PS4",
        "PYTHONSTARTUP",
        "PYTHONPATH",
        "PYTHONHOME",
        "PERL5OPT",
        "PERL5LIB",
        "RUBYOPT",
        "GCONV_PATH",
        "HOSTALIASES",
    }
)
_CODE_INJECTION_PREFIXES: Final = ("LD_", "DYLD_", "NODE_", "NPM_CONFIG_", "BUN_")
_PERMISSION_WORDS: Final = ("BYPASS", "DANGEROUS", "PERMISSION", "SKIP_PERM")


def always_passed(name: str) -> bool:
    """Whether every run gets ``name`` (when the daemon has it): the base, auth and locale ones."""
    return name in BASE_VARS or name in AUTH_VARS or _LOCALE.fullmatch(name) is not None


def is_vertex_var(name: str) -> bool:
    """Whether ``name`` is one of Vertex's, which only ``claude.enable_vertex`` passes."""
    return name in VERTEX_VARS or name.startswith(_VERTEX_PREFIX)


def refused_pass_env(name: str) -> str | None:
    """Why ``name`` may not be listed in ``[claude] pass_env``, or None when it may."""
    if not _ENV_NAME.fullmatch(name):
        return f"expected an environment variable name; got {name!r}"
    upper = name.upper()
    if upper in _OWN_VARS or upper.startswith("CODELEGATE_"):
        return f"{name} is set by codelegate itself and cannot be passed"
    if any(word in upper for word in _PERMISSION_WORDS):
        return f"{name} could change permission checks and is never passed"
    if upper in _CODE_INJECTION_VARS or upper.startswith(_CODE_INJECTION_PREFIXES):
        return f"{name} could load code into the CLI and is never passed"
    if upper in BEDROCK_VARS:
        return f"{name} is a Bedrock variable: set claude.enable_bedrock = true instead"
    if is_vertex_var(upper):
        return f"{name} is a Vertex variable: set claude.enable_vertex = true instead"
    return None


# Variables whose values are credentials: the daemon masks these exact values (and their
# encodings) wherever a run's output carries them, whatever their shape.
SECRET_VARS: Final = frozenset(
    {
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_AUTH_TOKEN",
        "CLAUDE_CODE_OAUTH_TOKEN",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_BEARER_TOKEN_BEDROCK",
        "AWS_CONTAINER_AUTHORIZATION_TOKEN",
    }
)
# An operator's pass_env variable with one of these in its name is taken for a credential too.
_SECRET_NAME_WORDS: Final = ("TOKEN", "SECRET", "PASSW", "KEY", "CREDENTIAL", "AUTH", "COOKIE")


def secret_values(env: Mapping[str, str]) -> tuple[str, ...]:
    """The values of ``env`` (a child environment) that are credentials, sorted, no empty ones."""
    return tuple(
        sorted(
            {
                value
                for name, value in env.items()
                if value
                and (
                    name in SECRET_VARS or any(word in name.upper() for word in _SECRET_NAME_WORDS)
                )
            }
        )
    )
