# syntax=docker/dockerfile:1
# tc-server: a standalone Apache Pulsar transaction coordinator.
#
#   docker build -t tc-server .
#   docker run -p 6650:6650 -p 8080:8080 tc-server            # embedded store in the volume
#
# Configuration is the TC_SERVER_* environment (one variable per setting, see tc_server/config.py), a
# TOML file named by TC_SERVER_CONFIG, or flags after `run`.
ARG PYTHON_IMAGE=python:3.11-slim

# --- builder: a virtualenv holding tc-server and its runtime dependencies, nothing else -------------
FROM ${PYTHON_IMAGE} AS builder
WORKDIR /src
# .dockerignore admits only what a build needs (pyproject.toml, uv.lock, uv-requirements.txt, README.md, LICENSE,
# tc_server/, deploy/install.sh).
COPY . .
# The same script `make image-check` runs outside Docker: uv (pinned by hash in uv-requirements.txt)
# installs exactly what uv.lock pins, runtime dependencies only, no dev or audit extras.
RUN PYTHON=python3 ./deploy/install.sh /opt/tc-server /src

# --- runtime ---------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="tc-server" \
      org.opencontainers.image.description="A standalone Apache Pulsar transaction coordinator (PIP-473 layout)" \
      org.opencontainers.image.licenses="Apache-2.0"

# A fixed, non-root uid/gid so that volume ownership and Kubernetes runAsUser agree (10001 is outside the
# range distributions hand out to system and login users).
RUN groupadd --system --gid 10001 tc-server \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/tc-server --no-create-home \
            --shell /usr/sbin/nologin tc-server \
 && mkdir -p /var/lib/tc-server \
 && chown 10001:10001 /var/lib/tc-server

# The venv's interpreter is a symlink to the base image's python3.11, which is why both stages use the
# same base image.
COPY --from=builder /opt/tc-server /opt/tc-server

ENV PATH=/opt/tc-server/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    TC_SERVER_STORE=embedded \
    TC_SERVER_DATA_DIR=/var/lib/tc-server \
    TC_SERVER_LOG_FORMAT=json

USER 10001:10001
WORKDIR /var/lib/tc-server
# The embedded store's SQLite file lives here; with TC_SERVER_STORE=oxia it stays empty.
VOLUME ["/var/lib/tc-server"]

# 6650: Pulsar binary protocol (--listen). 8080: admin HTTP, /metrics, /healthz, /readyz (--admin-listen).
EXPOSE 6650 8080

# GET /healthz where the settings put the admin port (TC_SERVER_* and the TC_SERVER_CONFIG file:
# TC_SERVER_ADMIN_LISTEN on [::] is asked at [::1], TC_SERVER_ADMIN_TLS over HTTPS; tc_server/healthcheck.py).
# Settings given as flags after `run` are not seen by it: such a container needs a matching --health-cmd.
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["tc-server", "healthcheck"]

ENTRYPOINT ["tc-server"]
CMD ["run"]
