# Tailgate edge agent for Raspberry Pis: linux/arm64 (64-bit Pi OS) and linux/arm/v7
# (32-bit), linux/amd64 for testing. From the repository root (deploy/README.md has the
# buildx setup and the push):
#
#   docker buildx build --platform linux/arm64,linux/arm/v7 \
#       -f deploy/docker/edge-agent.Dockerfile -t registry.example.com/tailgate/edge-agent:0.1.0 .
#   docker run -d --name edge-agent --restart on-failure -p 9201:9201 \
#       -v tailgate-edge:/var/lib/tailgate-edge --env-file edge-agent.env \
#       registry.example.com/tailgate/edge-agent:0.1.0 --id pi-wetlab-3 --cluster wet-lab \
#       --gateway http://10.0.0.2:8080 --advertise 10.0.0.23:9201
#
# edge-agent.env holds TAILGATE_AGENT_TOKEN=... . Only the agent's own dependencies go in
# (deploy/edge/requirements.txt, versions from constraints.txt): no numpy, no onnxruntime.
# Tailgate itself is installed with --no-deps.

ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
# A compiler, for wheels PyPI lacks on a platform (thriftpy2 and uvloop on arm/v7), and for
# the frame check's C walk (taskserver/_framecheck.c; the build fails below without it).
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY deploy/docker/constraints.txt deploy/docker/constraints.txt
COPY deploy/edge/requirements.txt deploy/edge/requirements.txt
RUN python -m venv /opt/tailgate/venv \
 && /opt/tailgate/venv/bin/pip install --no-cache-dir \
        -c deploy/docker/constraints.txt -r deploy/edge/requirements.txt
# The packages pyproject.toml names; only edge_agent, taskserver and deploy run here, so
# onnx_models comes without its models.
COPY pyproject.toml README.md ./
COPY admission admission
COPY deploy deploy
COPY edge_agent edge_agent
COPY gateway gateway
COPY loadtests loadtests
COPY onnx_models/__init__.py onnx_models/__init__.py
COPY taskserver taskserver
RUN /opt/tailgate/venv/bin/pip install --no-cache-dir --no-deps . \
 && /opt/tailgate/venv/bin/python -c "import taskserver._framecheck" \
 && /opt/tailgate/venv/bin/python -m compileall -q /opt/tailgate/venv

FROM ${PYTHON_IMAGE}
RUN groupadd --system --gid 10001 tailgate \
 && useradd --system --uid 10001 --gid tailgate --home-dir /var/lib/tailgate-edge \
        --shell /usr/sbin/nologin tailgate \
 && install -d -o tailgate -g tailgate -m 0750 /var/lib/tailgate-edge
COPY --from=build /opt/tailgate/venv /opt/tailgate/venv
ENV PATH=/opt/tailgate/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /var/lib/tailgate-edge
VOLUME ["/var/lib/tailgate-edge"]
USER 10001:10001
EXPOSE 9201
# The agent serves Thrift only (no HTTP unless --metrics-port): check that it listens.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s \
    CMD ["python", "-c", "import socket; socket.create_connection(('127.0.0.1', 9201), 3).close()"]
# SIGTERM (docker stop) stops the agent cleanly: tasks cancelled, store closed.
STOPSIGNAL SIGTERM
ENTRYPOINT ["tailgate", "edge-agent", "run", "--host", "0.0.0.0", "--port", "9201", \
            "--db", "/var/lib/tailgate-edge/edge.db"]
CMD ["--id", "edge-1", "--cluster", "local"]
