# Tailgate task server on an NVIDIA GPU (Thrift on 9101, /metrics and /healthz on 9102):
# onnxruntime-gpu with the CUDA execution provider, linux/amd64. From the repository root:
#
#   docker buildx build -f deploy/docker/taskserver-gpu.Dockerfile \
#       -t registry.example.com/tailgate/taskserver-gpu:0.1.0 .
#   docker run --rm --gpus 1 -p 9101:9101 registry.example.com/tailgate/taskserver-gpu:0.1.0 \
#       taskserver --id gpu-1 --pipeline traffic --providers cuda
#
# onnxruntime-gpu (constraints.txt) is built for CUDA 13 and cuDNN 9, so the base image
# carries exactly those majors; the host needs an NVIDIA driver that supports CUDA 13 and
# the NVIDIA Container Toolkit (Docker: --gpus; Kubernetes: the NVIDIA device plugin).
# Ubuntu 24.04's Python is 3.12 (Tailgate needs >= 3.11).

ARG CUDA_IMAGE=nvidia/cuda:13.0.2-cudnn-runtime-ubuntu24.04

FROM ${CUDA_IMAGE} AS build
# gcc and the Python headers for the frame check's C walk (taskserver/_framecheck.c).
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc libc6-dev \
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
RUN python3 -m venv /opt/tailgate/venv \
 && /opt/tailgate/venv/bin/pip install --no-cache-dir \
        -c deploy/docker/constraints.txt ".[gpu]" \
 && /opt/tailgate/venv/bin/python -c "import taskserver._framecheck" \
 && /opt/tailgate/venv/bin/python -m compileall -q /opt/tailgate/venv

FROM ${CUDA_IMAGE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 tailgate \
 && useradd --system --uid 10001 --gid tailgate --home-dir /var/lib/tailgate \
        --shell /usr/sbin/nologin tailgate \
 && install -d -o tailgate -g tailgate -m 0750 /var/lib/tailgate
COPY --from=build /opt/tailgate/venv /opt/tailgate/venv
COPY deploy/docker/tailgate.toml /etc/tailgate/tailgate.toml
# What the NVIDIA runtime exposes: the GPUs Docker's --gpus or the Kubernetes device
# plugin assign (they override "all" with the assigned ones), and only the driver
# libraries compute needs (CUDA, NVML for nvidia-smi), not graphics or video.
ENV PATH=/opt/tailgate/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    TAILGATE_CONFIG=/etc/tailgate/tailgate.toml \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
WORKDIR /var/lib/tailgate
USER 10001:10001
EXPOSE 9101 9102
# A pipeline server loads its models and initialises CUDA before it listens: a long start.
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s --retries=3 \
    CMD ["python", "-c", \
         "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9102/healthz', timeout=2)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["tailgate"]
CMD ["taskserver", "--pipeline", "traffic", "--providers", "cuda"]
