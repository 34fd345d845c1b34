# codelegate — the two Quick start commands (`make run`, `make test`) and their helpers.
# Everything is installed inside the checkout: Python deps into .venv, the pinned Claude Code CLI
# into .tools/claude. Two exceptions, Debian packages that `make test` installs with apt-get when
# they are missing: bubblewrap and socat for the CLI's sandbox (sandbox-tools), and redis-server for
# the [fanout] tests (redis-server).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The pin lives in daemon/pinned.py (doctor and the tests import it; the Dockerfile reads it too).
CLAUDE_VERSION := $(shell sed -n 's/^CLAUDE_CODE_VERSION: Final = "\(.*\)"$$/\1/p' daemon/pinned.py)
CLAUDE_DIR := .tools/claude
CLAUDE_BIN := $(CLAUDE_DIR)/node_modules/.bin/claude
PYTEST_ARGS ?=
# `make run WORKSPACE=~/proj`: the folder runs may work in; `make run CONFIG=file.toml`: a config.
WORKSPACE ?= $(CURDIR)
CONFIG ?=

.PHONY: all setup setup-serve run test lint typecheck bench clean sandbox-tools redis-server wheel compiled c-compiler

all: test

# Two steps: `make run` needs only what serving needs (a small venv, seconds); `make test`,
# `lint` and `bench` add the test and benchmark extras on top.
setup-serve: $(VENV)/.serve
setup: $(VENV)/.installed

# A venv without its own pip, filled by the host's pip (--python, pip >= 22.3), is ready in about
# half the time: seeding pip into a new venv is the slowest step of a first make run. Without a
# host pip that can, the venv gets its own.
PIP_FLAGS := --quiet --disable-pip-version-check -c constraints.txt
$(VENV)/.serve: pyproject.toml constraints.txt
	$(PYTHON) -m venv --without-pip $(VENV)
	@if $(PYTHON) -m pip --python $(BIN)/python --version >/dev/null 2>&1; then set -x; \
		$(PYTHON) -m pip --python $(BIN)/python install $(PIP_FLAGS) --no-compile -e .; \
	else set -x; $(BIN)/python -m ensurepip --default-pip >/dev/null && \
		$(BIN)/pip install $(PIP_FLAGS) --no-compile -e .; fi
	touch $@

$(VENV)/.installed: $(VENV)/.serve
	$(BIN)/python -m pip --version >/dev/null 2>&1 || $(BIN)/python -m ensurepip --default-pip
	$(BIN)/pip install $(PIP_FLAGS) -e '.[test,bench]'
	touch $@

# The build that ships: the translator compiled with mypyc (setup.py, CODELEGATE_COMPILE=1), as a
# wheel for this venv's Python. `make wheel` leaves it in dist/ (README "systemd"); `compiled`
# installs it apart, in the venv's folder, where only what asks for it (the compiled test pass,
# `make bench`) puts it on the path: the development install stays the pure source.
COMPILED := $(VENV)/compiled
PACKAGE_SOURCES := setup.py pyproject.toml $(shell find codelegate daemon policy translator -name '*.py' -o -name '*.c')
$(COMPILED)/.built: $(VENV)/.installed $(PACKAGE_SOURCES) | c-compiler
	rm -rf $(COMPILED) build
	CODELEGATE_COMPILE=1 $(BIN)/pip wheel $(PIP_FLAGS) --no-deps --no-build-isolation \
		--wheel-dir $(COMPILED)/wheel .
	$(BIN)/pip install $(PIP_FLAGS) --no-deps --target $(COMPILED)/site $(COMPILED)/wheel/codelegate-*.whl
	rm -rf build
	touch $@
compiled: $(COMPILED)/.built
# mypyc's C needs a compiler (Debian's gcc, installed as root when missing) and Python's headers.
c-compiler:
	@command -v cc >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" -eq 0 ]; then sudo=; \
	  elif command -v sudo >/dev/null 2>&1; then sudo="sudo -n"; \
	  else echo "no C compiler and this is not root: apt-get install gcc" >&2; exit 1; fi; \
	  $$sudo apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends gcc libc6-dev; }
	@$(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON)) -c 'import os, sysconfig, sys; h = os.path.join(sysconfig.get_path("include"), "Python.h"); \
		sys.exit(None if os.path.exists(h) else "no " + h + ": install the headers of this Python (Debian: python3-dev)")'
wheel: compiled
	mkdir -p dist && cp $(COMPILED)/wheel/codelegate-*.whl dist/
	@ls dist/codelegate-*.whl

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

# Development defaults: `codelegate dev-config` writes WORKSPACE as the only root, the CLI, and
# the socket and store in ~/.local/state/codelegate (outside any workspace) into a config there,
# which `codelegate serve`, `doctor`, `run` and `watch` all find without flags. A `claude`
# already on PATH is used; otherwise the pinned one is installed. CONFIG= serves that file.
# While a daemon serves that state, dev-config writes nothing and exits 1 (so does this make run):
# a refused second `make run` leaves the first one's config as it is.
# The venv and the CLI download run side by side (-j2): together they are most of a first run.
run:
	@if [ -n "$(CONFIG)" ]; then $(MAKE) --no-print-directory setup-serve && \
		exec $(BIN)/codelegate serve --config "$(CONFIG)"; fi; \
	if command -v claude >/dev/null 2>&1; then cli=$$(command -v claude); \
		$(MAKE) --no-print-directory setup-serve || exit 1; \
	else $(MAKE) --no-print-directory -j2 setup-serve $(CLAUDE_BIN) >&2 || exit 1; \
		cli=$(CURDIR)/$(CLAUDE_BIN); fi; \
	$(BIN)/codelegate dev-config --workspace "$(WORKSPACE)" --claude "$$cli" >/dev/null && \
	exec $(BIN)/codelegate serve

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
# translator/ and policy/ are held at 100 % branch coverage (of the pure source: coverage cannot
# see into compiled code). Then the translator's own tests run again on the compiled build, with
# the test that both write the same bytes (tests/compiled) and real-CLI runs through a daemon
# and the tool in this process.
COMPILED_TESTS := tests/translator tests/golden/test_transcripts.py tests/compiled \
	tests/e2e/test_tool_e2e.py \
	tests/e2e/test_daemon_e2e.py::test_live_read_edit_bash_cards_then_result_and_resume \
	tests/e2e/test_approvals_e2e.py::test_an_approved_write_runs_after_the_card_and_its_answer_is_listed
test: setup $(CLAUDE_BIN) sandbox-tools redis-server compiled
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	CODELEGATE_TEST_CLAUDE=$(CURDIR)/$(CLAUDE_BIN) $(BIN)/pytest \
		--cov=codelegate.translator --cov=codelegate.policy --cov-branch --cov-report=term-missing:skip-covered \
		--cov-fail-under=100 $(PYTEST_ARGS)
	CODELEGATE_TEST_CLAUDE=$(CURDIR)/$(CLAUDE_BIN) CODELEGATE_TEST_COMPILED=$(CURDIR)/$(COMPILED)/site \
		PYTHONPATH=$(CURDIR)/$(COMPILED)/site $(BIN)/pytest -p no:cacheprovider --import-mode=append $(COMPILED_TESTS)

bench: setup $(CLAUDE_BIN) redis-server compiled
	CODELEGATE_TEST_CLAUDE=$(CURDIR)/$(CLAUDE_BIN) $(BIN)/python -m bench

clean:
	rm -rf $(VENV) .tools var build dist .pytest_cache .mypy_cache .ruff_cache .coverage
