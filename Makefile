# codelegate — the two Quick start commands (`make run`, `make test`) and their helpers.
# Everything is installed inside the checkout: Python deps into .venv, the pinned Claude Code CLI
# into .tools/claude. The one exception: the CLI's sandbox needs bubblewrap and socat, which
# `make test` installs with apt-get when they are missing (see sandbox-tools).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CLAUDE_VERSION := 2.1.332
CLAUDE_DIR := .tools/claude
CLAUDE_BIN := $(CLAUDE_DIR)/node_modules/.bin/claude
PYTEST_ARGS ?=

.PHONY: all setup run test lint typecheck bench clean sandbox-tools

all: test

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test,bench]'
	touch $@

# The pinned CLI, from the npm registry, into a local folder (its native binary comes in the
# platform's optional dependency).
$(CLAUDE_BIN):
	mkdir -p $(CLAUDE_DIR)
	npm install --silent --no-audit --no-fund --prefix $(CLAUDE_DIR) @anthropic-ai/claude-code@$(CLAUDE_VERSION)
	$(CLAUDE_BIN) --version

# Development defaults: socket var/codelegate.sock, store under var/, this directory as the only
# workspace root. A `claude` already on PATH is used; otherwise the pinned one is installed.
run: setup
	@if command -v claude >/dev/null 2>&1; then cli=$$(command -v claude); \
	else $(MAKE) --no-print-directory $(CLAUDE_BIN) >&2 && cli=$(CURDIR)/$(CLAUDE_BIN); fi; \
	CODELEGATE_CLAUDE=$$cli exec $(BIN)/codelegate serve

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

typecheck: setup
	$(BIN)/mypy

# The CLI's sandbox (tests/security/test_isolation.py) runs commands under bubblewrap and
# proxies their network through socat: system packages, installed when missing.
sandbox-tools:
	@command -v bwrap >/dev/null 2>&1 && command -v socat >/dev/null 2>&1 || { \
	  sudo=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$sudo apt-get update -qq && $$sudo apt-get install -y -qq bubblewrap socat; }

# The tests always use the pinned CLI: golden transcripts are of that version.
# translator/ and policy/ are held at 100 % branch coverage.
test: setup $(CLAUDE_BIN) sandbox-tools
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	CODELEGATE_TEST_CLAUDE=$(CURDIR)/$(CLAUDE_BIN) $(BIN)/pytest \
		--cov=translator --cov=policy --cov-branch --cov-report=term-missing:skip-covered \
		--cov-fail-under=100 $(PYTEST_ARGS)

bench: setup $(CLAUDE_BIN)
	CODELEGATE_TEST_CLAUDE=$(CURDIR)/$(CLAUDE_BIN) $(BIN)/python -m bench

clean:
	rm -rf $(VENV) .tools var .pytest_cache .mypy_cache .ruff_cache .coverage
