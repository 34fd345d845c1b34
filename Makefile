# codelegate — the two Quick start commands (`make run`, `make test`) and their helpers.
# Everything is installed inside the checkout: Python deps into .venv, the pinned Claude Code CLI
# into .tools/claude. Nothing else is installed system-wide, except Debian's redis-server for the
# [fanout] tests (`make redis-server`, when missing).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CLAUDE_VERSION := 2.1.332
CLAUDE_DIR := .tools/claude
CLAUDE_BIN := $(CLAUDE_DIR)/node_modules/.bin/claude
PYTEST_ARGS ?=

.PHONY: all setup run test lint typecheck bench clean redis-server

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

# The [fanout] tests start a real Redis of their own (tests/fanout): Debian's redis-server,
# installed as root with apt-get when it is missing (a fresh CI machine). Not needed to run.
redis-server:
	@command -v redis-server >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" -eq 0 ]; then sudo=; \
	  elif command -v sudo >/dev/null 2>&1; then sudo="sudo -n"; \
	  else echo "redis-server is missing and this is not root: apt-get install redis-server" >&2; exit 1; fi; \
	  $$sudo apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends redis-server; }
	@redis-server --version

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

# The tests always use the pinned CLI: golden transcripts are of that version.
# translator/ and policy/ are held at 100 % branch coverage.
test: setup $(CLAUDE_BIN) redis-server
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	CODELEGATE_TEST_CLAUDE=$(CURDIR)/$(CLAUDE_BIN) $(BIN)/pytest \
		--cov=translator --cov=policy --cov-branch --cov-report=term-missing:skip-covered \
		--cov-fail-under=100 $(PYTEST_ARGS)

bench: setup $(CLAUDE_BIN) redis-server
	CODELEGATE_TEST_CLAUDE=$(CURDIR)/$(CLAUDE_BIN) $(BIN)/python -m bench

clean:
	rm -rf $(VENV) .tools var .pytest_cache .mypy_cache .ruff_cache .coverage
