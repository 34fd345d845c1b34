"""The CLI's argv, as a tuple: never a shell string, never the prompt, never a bypass.

The fixed part pins headless, fail-closed behaviour: ``--safe-mode`` (no CLAUDE.md, hooks,
plugins, MCP servers), ``--disable-slash-commands`` (no text runs a CLI command),
``--setting-sources ""`` (no settings file of HOME or the workspace) and
``--permission-prompts none`` (whatever would prompt is denied). With ``[approvals]`` on, the
last is ``--permission-prompts host --permission-prompt-tool stdio`` instead: the CLI asks on
the control channel and waits (``host`` alone asks nothing and denies, measured on 2.1.332).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from codelegate.policy.codes import BYPASS_REFUSED, MODEL_NOT_ALLOWED
from codelegate.policy.config import MODEL_NAME
from codelegate.policy.errors import PolicyError
from codelegate.policy.modes import DANGEROUS_FLAGS, SAFE_CLI_MODES, Mode, names_bypass
from codelegate.policy.session import parse_session_id
from codelegate.policy.settings import refused_settings, settings_json

if TYPE_CHECKING:
    from codelegate.policy.config import Config

_BASE_FLAGS: Final = (
    "-p",
    "--output-format",
    "stream-json",
    "--verbose",
    # Cards open when a tool_use block starts and text streams (the full lines still follow):
    # a long Write is visible while the model writes it.
    "--include-partial-messages",
    # A subagent's text comes too (with parent_tool_use_id): shown under its Task card.
    "--forward-subagent-text",
    "--safe-mode",
    # A user message starting with "/" is otherwise run as one of the CLI's commands, the prompt
    # and steering alike: /model outside [claude] allowed_models, /effort, /heapdump (the heap,
    # credentials in clear, into HOME), /config (writes HOME's settings). With this flag every
    # command and skill answers "/<name> isn't available in this environment." and runs
    # nothing; the Skill tool is gone too (measured on 2.1.332, docs/cli-control-channel.md §7).
    "--disable-slash-commands",
    # --safe-mode still loads the user, project and local settings files: a cloned repository's
    # .claude/settings*.json (or whatever shares HOME) could add allow rules, set env for tool
    # processes and run an apiKeyHelper at start-up. An empty list loads none of them (measured on
    # 2.1.332, tests/security/test_settings_isolation.py); --restricted would too, but it also
    # removes Bash, which changes what every mode can do.
    "--setting-sources",
    "",
)
PROMPTS_NONE: Final = ("--permission-prompts", "none")
PROMPTS_HOST: Final = ("--permission-prompts", "host", "--permission-prompt-tool", "stdio")
# Every run's flags, with prompts off (fail closed); tests start the CLI with them too
# (tests/stub/claude.py).
FIXED_FLAGS: Final = (*_BASE_FLAGS, *PROMPTS_NONE)
# The control channel (translator.control): the prompt and control requests are stream-json
# lines on stdin, which stays open until the run is over. Apart from FIXED_FLAGS: a test may
# start the CLI one-shot instead (a text prompt on stdin, closed at once).
# --replay-user-messages: the CLI echoes each user message when it takes it in, so that the
# daemon knows when a message written mid-run has been read (translator.control.Channel).
CHANNEL_FLAGS: Final = ("--input-format", "stream-json", "--replay-user-messages")


def build_argv(
    config: Config,
    mode: Mode,
    *,
    session_id: str,
    resumed: bool,
    model: str | None = None,
    max_budget_usd: float | None = None,
) -> tuple[str, ...]:
    """argv for one run; the operator's allow/deny rules go last, callers cannot add any."""
    argv = [config.claude.path, *_BASE_FLAGS, *prompt_flags(config), *CHANNEL_FLAGS]
    if config.claude.settings:
        # Checked again here, not only at config load, in case a Config was built by hand.
        if refused_settings(config.claude.settings):
            raise PolicyError(BYPASS_REFUSED, "refusing [claude.settings] policy does not accept")
        argv += ["--settings", settings_json(config.claude.settings)]
    argv += ["--permission-mode", mode.cli]
    argv += ["--resume" if resumed else "--session-id", parse_session_id(session_id)]
    if model is not None:
        # A value starting with "-" could be read as another option.
        if not MODEL_NAME.fullmatch(model):
            raise PolicyError(MODEL_NOT_ALLOWED, f"model {model!r} is not a model name")
        argv += ["--model", model]
    if max_budget_usd is not None:
        argv += ["--max-budget-usd", repr(float(max_budget_usd))]
    # Variadic options: each rule is its own argument, and config validation guarantees that no
    # rule starts with "-", so a rule can never be read as another option.
    if config.policy.allowed_tools:
        argv += ["--allowed-tools", *config.policy.allowed_tools]
    if config.policy.disallowed_tools:
        argv += ["--disallowed-tools", *config.policy.disallowed_tools]
    _refuse_bypass(argv)
    return tuple(argv)


def prompt_flags(config: Config) -> tuple[str, ...]:
    """How the CLI treats what needs approval: denied (approvals off), or asked on stdio."""
    return PROMPTS_HOST if config.approvals.enabled else PROMPTS_NONE


def _prompts_ok(argv: list[str]) -> bool:
    """Exactly one of the two permission-prompt settings, never in the ``--flag=value`` form."""
    if any(arg.startswith(("--permission-prompts=", "--permission-prompt-tool=")) for arg in argv):
        return False
    prompts = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "--permission-prompts"]
    tools = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "--permission-prompt-tool"]
    return (prompts, tools) in ((["none"], []), (["host"], ["stdio"]))


def _refuse_bypass(argv: list[str]) -> None:
    """Defence in depth: whatever built the pieces, a bypass never reaches the CLI, and no
    settings file of HOME or the workspace is loaded."""
    modes = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "--permission-mode"]
    sources = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "--setting-sources"]
    if (
        len(modes) != 1
        or modes[0] not in SAFE_CLI_MODES
        or sources != [""]
        or not _prompts_ok(argv)
        or any(arg in DANGEROUS_FLAGS or names_bypass(arg) for arg in argv)
        or any(arg.startswith("--setting-sources=") for arg in argv)
    ):
        raise PolicyError(BYPASS_REFUSED, "refusing a launch that would bypass permissions")
