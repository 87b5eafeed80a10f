#!/usr/bin/env bash
# Smoke test of a GPU host: the CUDA path of every shipped pipeline and the GPU task-server
# image's entry point, on loopback. Run on purpose on a machine with an NVIDIA GPU and
# onnxruntime-gpu installed, from the repository root:
#
#   bash loadtests/gpu_smoke.sh [OUTDIR]
#
# 1. onnxruntime's providers and the device (nvidia-smi).
# 2. `python -m onnx_models profile PIPELINE --provider cuda` for each pipeline: d_k(b) of
#    every module on the GPU (the profiles land in OUTDIR, the shipped ones stay as they are).
# 3. The image's entry point, as taskserver-gpu.Dockerfile runs it (`tailgate taskserver
#    --pipeline traffic --providers cuda` with the image's tailgate.toml), registered with a
#    gateway on 127.0.0.1; queries through the HTTP path; the answer must name
#    CUDAExecutionProvider (onnxruntime falls back to the CPU silently when CUDA cannot load).
# 4. `python -m loadtests.bench_pipeline --providers cuda`: saturated throughput and PARD under
#    1.5x overload on the GPU.
# Exits non-zero when a step fails (step 4 runs even when an answer of step 3 was wrong). PROVIDER=cpu runs the same steps on a host
# without a GPU (a dry run of the script itself); PROFILES="traffic" profiles fewer pipelines.
set -euo pipefail
OUTDIR=${1:-gpu-smoke-out}
mkdir -p "$OUTDIR"
PY=${PYTHON:-python3}
[[ $PY == */* ]] && PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"
# The checkout's packages whether or not Tailgate is installed (the gateway runs elsewhere).
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PROVIDER=${PROVIDER:-cuda}
case $PROVIDER in cuda) EP=CUDAExecutionProvider ;; cpu) EP=CPUExecutionProvider ;; *) echo "PROVIDER: cuda or cpu"; exit 2 ;; esac
export EP
tailgate() { "$PY" -m deploy.cli "$@"; }

echo "== 1. device and providers"
nvidia-smi -L || true
"$PY" - <<'EOF'
import onnxruntime as ort
print("onnxruntime", ort.__version__, ort.get_available_providers())
import os
assert os.environ["EP"] in ort.get_available_providers(), "no " + os.environ["EP"]
EOF

echo "== 2. profiles on the GPU"
for p in ${PROFILES-traffic live dag}; do
    "$PY" -m onnx_models profile "$p" --provider "$PROVIDER" --repeats "${REPEATS:-30}" \
        --out "$OUTDIR/$p.$PROVIDER.profile.json"
done

echo "== 3. the GPU image's entry point behind a gateway"
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait || true; rm -rf "$work"; }
trap cleanup EXIT
(cd "$work" && exec "$PY" -m deploy.cli gateway --host 127.0.0.1 --port 18080) \
    >"$OUTDIR/gateway.log" 2>&1 &
pids+=($!)
# The image's configuration, with loopback instead of 0.0.0.0 (the only change).
sed 's/0\.0\.0\.0/127.0.0.1/' deploy/docker/tailgate.toml >"$work/tailgate.toml"
TAILGATE_CONFIG="$work/tailgate.toml" "$PY" -m deploy.cli taskserver --id gpu-1 \
    --gateway http://127.0.0.1:18080 --pipeline traffic --providers "$PROVIDER" \
    >"$OUTDIR/taskserver.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 240); do
    if curl -sf http://127.0.0.1:9102/healthz >/dev/null 2>&1 \
        && curl -sf http://127.0.0.1:18080/v1/servers | grep -q gpu-1; then
        break
    fi
    sleep 0.5
done
curl -sf http://127.0.0.1:18080/v1/servers | grep -q gpu-1 || {
    echo "gpu-1 did not register"; tail -20 "$OUTDIR/taskserver.log"; exit 1; }
for seed in 1 2 3 4 5; do
    tailgate query --url http://127.0.0.1:18080 --slo-ms 400 --servers gpu-1 \
        --task "{\"image_seed\": $seed}" >"$OUTDIR/answer$seed.json" || true
done
answers_ok=0
"$PY" - "$OUTDIR" <<'EOF' || answers_ok=1
import json, os, sys, pathlib
ep = os.environ["EP"]
out = pathlib.Path(sys.argv[1])
bad = []
for f in sorted(out.glob("answer*.json")):
    text = f.read_text()
    answer = json.loads(text[text.index("{"):])
    task = answer["tasks"][0]
    modules = (task.get("result") or {}).get("modules", {})
    execs = {m["name"]: m["exec_ms"] for m in modules.values()}
    print(f.name, task["status"], "latency_ms", answer["latency_ms"], "exec_ms", execs)
    if task["status"] != "ok" or ep not in text:
        bad.append(f"{f.name}: {task['status']} {task.get('error')}")
assert not bad, bad
print("every answer names", ep)
EOF
curl -sf http://127.0.0.1:9102/metrics | grep -E "^tailgate_pipeline_module_duration_scale" | head -5 || true
cleanup
trap - EXIT

echo "== 4. bench_pipeline on the GPU"
"$PY" -m loadtests.bench_pipeline --pipeline traffic --providers "$PROVIDER" --seconds "${SECONDS_BENCH:-6}"
exit "$answers_ok"
