# codelegate: the daemon and the pinned Claude Code CLI in one image.
#   docker build -t codelegate .
#   docker run (see README "Docker"): credentials come from the environment at run time; nothing
#   secret is baked in. No Docker engine runs on the project's CI machines: build it elsewhere.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG NODE_IMAGE=node:22-bookworm-slim

# --- the pinned CLI, from the npm registry ------------------------------------------------
FROM ${NODE_IMAGE} AS claude
# Empty = the version the project pins and tests, read from daemon/pinned.py (its one place).
ARG CLAUDE_CODE_VERSION=
WORKDIR /opt/claude
COPY daemon/pinned.py /tmp/pinned.py
# The CLI is a native binary shipped in a platform package (an optional dependency);
# --ignore-scripts: nothing from the registry runs at build time, we copy the binary ourselves.
RUN pinned="$(sed -n 's/^CLAUDE_CODE_VERSION: Final = "\(.*\)"$/\1/p' /tmp/pinned.py)" \
    && npm install --ignore-scripts --omit=dev --no-audit --no-fund --prefix /opt/claude \
        "@anthropic-ai/claude-code@${CLAUDE_CODE_VERSION:-$pinned}" \
    && cp node_modules/@anthropic-ai/claude-code-linux-*/claude /opt/claude/claude \
    && /opt/claude/claude --version

# --- the daemon, installed from this project into a venv -----------------------------------
# The translator compiled by mypyc (setup.py, README "Translator speed"): the compiler and mypy
# stay in this stage, only the built wheel goes into the daemon's venv.
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py constraints.txt README.md ./
COPY daemon ./daemon
COPY translator ./translator
COPY policy ./policy
# codelegate/ is the one import name: symlinks onto the three folders above (pyproject.toml).
COPY codelegate ./codelegate
RUN python -m venv /opt/build \
    && /opt/build/bin/pip install -c constraints.txt mypy setuptools msgspec \
    && CODELEGATE_COMPILE=1 /opt/build/bin/pip wheel -c constraints.txt --no-deps \
        --no-build-isolation --wheel-dir /tmp/wheel . \
    && python -m venv /opt/codelegate/venv \
    && /opt/codelegate/venv/bin/pip install -c constraints.txt /tmp/wheel/codelegate-*.whl \
    && /opt/codelegate/venv/bin/python -c "import codelegate.translator as t; assert t.compiled()"

# --- runtime -------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE}
# git and bash: Claude Code's tools run them in the workspace. tini: PID 1 that forwards
# signals and reaps what the daemon does not own. Debian's versions follow the base image.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends bash ca-certificates git tini \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 codelegate \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/codelegate \
        --shell /usr/sbin/nologin codelegate \
    && install -d -o codelegate -g codelegate -m 0750 \
        /var/lib/codelegate /run/codelegate /srv/codelegate/workspaces \
    && install -d -o root -g root -m 0755 /etc/codelegate

COPY --from=claude /opt/claude/claude /usr/local/bin/claude
COPY --from=build /opt/codelegate/venv /opt/codelegate/venv
# World-readable on purpose: it holds no secret, and the daemon reads it under whatever group
# `docker run --user "10001:<your gid>"` gives it (README "Docker": how the host shares the socket).
COPY --chmod=0644 systemd/config.container.toml /etc/codelegate/config.toml

ENV PATH=/opt/codelegate/venv/bin:$PATH \
    HOME=/var/lib/codelegate \
    CODELEGATE_SOCKET=/run/codelegate/codelegate.sock \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

# Numeric, so the host (and Kubernetes runAsNonRoot) can tell it is not root.
USER 10001:10001
WORKDIR /var/lib/codelegate
# config (mount your own config.toml), the run store and the CLI's state, the socket
# directory (bind-mount it to reach the daemon from the host), the workspaces.
VOLUME ["/etc/codelegate", "/var/lib/codelegate", "/run/codelegate", "/srv/codelegate/workspaces"]

HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["/opt/codelegate/venv/bin/python", "-m", "codelegate.daemon.clients.tool", "health", "/run/codelegate/codelegate.sock"]

ENTRYPOINT ["/usr/bin/tini", "--", "/opt/codelegate/venv/bin/codelegate"]
CMD ["serve", "--config", "/etc/codelegate/config.toml"]
