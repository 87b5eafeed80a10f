# Tailgate gateway (HTTP API on 8080), for linux/amd64 and linux/arm64. From the repository
# root (see deploy/README.md for the multi-arch build and push):
#
#   docker buildx build -f deploy/docker/gateway.Dockerfile \
#       -t registry.example.com/tailgate/gateway:0.1.0 .
#   docker run --rm -p 8080:8080 -e TAILGATE_AGENT_TOKEN_FILE=/run/secrets/agent-token \
#       -v ./agent.token:/run/secrets/agent-token:ro registry.example.com/tailgate/gateway:0.1.0
#
# The image holds the Kubernetes client (the autoscaler's kubernetes actuator) and psycopg
# (storage_url = "postgresql+psycopg://..."), with every version from constraints.txt.

ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
# A C compiler for the frame check's C walk (taskserver/_framecheck.c) and the links' frame
# codec (gateway/_hotpath.c); the build fails below if they did not build, rather than ship
# the slower Python twins.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY deploy/docker/constraints.txt deploy/docker/constraints.txt
# The packages pyproject.toml names (setuptools wants every one of them present).
COPY pyproject.toml README.md ./
COPY admission admission
COPY deploy deploy
COPY edge_agent edge_agent
COPY gateway gateway
COPY loadtests loadtests
COPY onnx_models onnx_models
COPY taskserver taskserver
RUN python -m venv /opt/tailgate/venv \
 && /opt/tailgate/venv/bin/pip install --no-cache-dir \
        -c deploy/docker/constraints.txt ".[k8s,postgres]" \
 && /opt/tailgate/venv/bin/python -c "import taskserver._framecheck" \
 && /opt/tailgate/venv/bin/python -c "import gateway._hotpath" \
 && /opt/tailgate/venv/bin/python -m compileall -q /opt/tailgate/venv

FROM ${PYTHON_IMAGE}
RUN groupadd --system --gid 10001 tailgate \
 && useradd --system --uid 10001 --gid tailgate --home-dir /var/lib/tailgate \
        --shell /usr/sbin/nologin tailgate \
 && install -d -o tailgate -g tailgate -m 0750 /var/lib/tailgate
COPY --from=build /opt/tailgate/venv /opt/tailgate/venv
COPY deploy/docker/tailgate.toml /etc/tailgate/tailgate.toml
ENV PATH=/opt/tailgate/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    TAILGATE_CONFIG=/etc/tailgate/tailgate.toml
# The dashboard history (a relative SQLite URL) lands here.
WORKDIR /var/lib/tailgate
# Numeric, so that Kubernetes' runAsNonRoot can check it without a runAsUser.
USER 10001:10001
EXPOSE 8080
# Liveness only: /readyz answers 503 while the gateway drains, which is not unhealthy.
HEALTHCHECK --interval=10s --timeout=3s --start-period=15s --retries=3 \
    CMD ["python", "-c", \
         "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/livez', timeout=2)"]
# SIGTERM drains: the gateway stops taking queries and answers the ones in flight
# (each ends by its SLO plus grace_ms), so give `docker stop -t` at least that long.
STOPSIGNAL SIGTERM
ENTRYPOINT ["tailgate"]
CMD ["gateway"]
