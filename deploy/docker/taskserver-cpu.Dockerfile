# Tailgate task server on CPUs (Thrift on 9101, /metrics and /healthz on 9102), with
# onnxruntime for the ONNX pipelines, for linux/amd64 and linux/arm64. From the repository
# root (see deploy/README.md for the multi-arch build and push):
#
#   docker buildx build -f deploy/docker/taskserver-cpu.Dockerfile \
#       -t registry.example.com/tailgate/taskserver:0.1.0 .
#   docker run --rm -p 9101:9101 registry.example.com/tailgate/taskserver:0.1.0 \
#       taskserver --id ts-1 --gateway http://gateway:8080 --advertise HOST:9101
#   docker run --rm -p 9101:9101 registry.example.com/tailgate/taskserver:0.1.0 \
#       taskserver --id ts-1 --pipeline traffic --providers cpu

ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
# A C compiler for the frame check's C walk (taskserver/_framecheck.c); the build fails
# below if it did not build, rather than ship the slower Python walk.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY deploy/docker/constraints.txt deploy/docker/constraints.txt
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
        -c deploy/docker/constraints.txt ".[onnx]" \
 && /opt/tailgate/venv/bin/python -c "import taskserver._framecheck" \
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
WORKDIR /var/lib/tailgate
USER 10001:10001
EXPOSE 9101 9102
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", \
         "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9102/healthz', timeout=2)"]
# SIGTERM: the server leaves its gateways, serves what it has queued for at most
# [taskserver] drain_timeout_s and sends the rest back, then exits.
STOPSIGNAL SIGTERM
ENTRYPOINT ["tailgate"]
CMD ["taskserver"]
