#!/usr/bin/env bash
# PARD live beside the simulator on a many-core host with an NVIDIA GPU: the CPU runs of the
# traffic and live pipelines with run-time worker scaling, on profiles taken on this host, and
# one short CUDA run of traffic with worker scaling. Run on purpose, from the repository root,
# on a machine with onnxruntime-gpu installed (no network needed):
#
#   bash loadtests/pard_live_device.sh OUTDIR
#
# 1. The host: cores, GPU, onnxruntime's providers (OUTDIR/host.txt).
# 2. `python -m onnx_models profile PIPELINE --provider cpu` for traffic and live: d_k(b) on
#    this host's CPU, one intra-op thread (as the live sessions run), into OUTDIR.
# 3. `python -m loadtests.pard_live --workers auto --worker-mode process --profile
#    OUTDIR/PIPELINE.cpu.profile.json` for traffic (bursty trace) and live (tweet, the same
#    shape by the paper's name) under pard, nexus, clipper++ and none (traffic also
#    pard@profile: PARD with the profile's d_k alone, exactly the simulator's setting): each
#    worker's session in a process of its own, as PARD gives each worker a container; each
#    writes OUTDIR/PIPELINE-TRACE/ (pard-live.md, CSV, PNG) and its console to
#    OUTDIR/PIPELINE-TRACE.log. Then traffic once more with the workers as threads of one
#    process (pard, nexus; OUTDIR/traffic-bursty-thread/), the setting before process
#    workers, to compare the live/sim gap and the exec / profile ratio of the two. The
#    verdict per policy is in the side-by-side table: PASS/FAIL (live within 10% of the
#    simulator), or INVALID when the driver could not keep to the trace. Then
#    `python -m loadtests.bench_worker_hop`: what the process hop adds to a batch here
#    (OUTDIR/worker-hop.txt).
# 4. A CUDA profile of traffic, then a short CUDA run with --workers auto (pard, nexus): new
#    CUDA sessions built and warmed at run time as the scaler starts workers. A GPU serves the
#    trace's rate with one worker, so the headroom is raised until the scaler wants about
#    three workers for the busiest module at the mean rate (the simulator side runs the same
#    settings). Workers as threads (--worker-mode thread): onnxruntime CUDA sessions in
#    several processes would each hold a CUDA context and arena on the one GPU. Written to
#    OUTDIR/traffic-cuda/.
#
# About 7-8 minutes in all. LIVE_S (20), CUDA_S (15), LOAD (0.8: the mean rate over what the
# scaled-out pipeline serves), REPEATS (20) and CUDA_RATE (400 req/s) change the sizes;
# NEIGHBOURS (0) takes the CPU profiles beside that many busy sessions of the pipeline
# (`onnx_models profile --neighbours`: d_k(b) as the scaled-out workers share the host);
# CUDA=0 skips step 4 (a dry run on a host without a GPU); STEPS (234) names the steps that run
# after the host's (STEPS=4: the CUDA step alone, on a host whose CPU runs are done);
# BUDGET_S (540) bounds the whole.
# Exits non-zero when a step failed; the later steps run anyway.
set -uo pipefail
OUTDIR=${1:?usage: bash loadtests/pard_live_device.sh OUTDIR}
mkdir -p "$OUTDIR"
PY=${PYTHON:-python3}
[[ $PY == */* ]] && PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
LIVE_S=${LIVE_S:-20}
CUDA_S=${CUDA_S:-15}
LOAD=${LOAD:-0.8}
REPEATS=${REPEATS:-20}
CUDA_RATE=${CUDA_RATE:-400}
NEIGHBOURS=${NEIGHBOURS:-0}
BUDGET_S=${BUDGET_S:-540}
STEPS=${STEPS:-234}
[[ ${CUDA:-1} == 0 ]] && STEPS=${STEPS//4/}
status=0
step() { echo "== $*  ($SECONDS s in)"; }
# A step's time limit: its own, or what is left of BUDGET_S if less (a hung step cannot
# take the whole run with it; what the earlier steps wrote stays).
cap() {
    local left=$((BUDGET_S - SECONDS))
    ((left < 10)) && left=10
    echo $(($1 < left ? $1 : left))
}

step "1. host"
{
    echo "cores usable: $("$PY" -c 'import os; print(len(os.sched_getaffinity(0)))')"
    grep -m1 "model name" /proc/cpuinfo || true
    # hardware threads per core: sessions on sibling threads of one core share its units
    grep -m1 -E "^siblings" /proc/cpuinfo || true
    grep -m1 -E "^cpu cores" /proc/cpuinfo || true
    nvidia-smi -L || true
    "$PY" -c 'import onnxruntime as o, platform
print("onnxruntime", o.__version__, o.get_available_providers(), platform.python_version())'
    "$PY" -c 'from taskserver.pipeline.sessions import CPU, resolve_worker_mode, usable_cpus
print("worker mode auto on the CPU here:", resolve_worker_mode("auto", [CPU], usable_cpus()))'
} 2>&1 | tee "$OUTDIR/host.txt"

want() { [[ $STEPS == *"$1"* ]]; }

if want 2; then
    step "2. profiles on this host's CPU"
    for p in traffic live; do
        timeout "$(cap 90)" "$PY" -m onnx_models profile "$p" --provider cpu --threads 1 \
            --repeats "$REPEATS" --warmup 5 --neighbours "$NEIGHBOURS" \
            --out "$OUTDIR/$p.cpu.profile.json" \
            >"$OUTDIR/$p.cpu.profile.txt" 2>&1 || { echo "profile $p failed"; status=1; }
        tail -n 25 "$OUTDIR/$p.cpu.profile.txt"
    done
fi

if want 3; then
    step "3. live vs simulator on the CPU, worker scaling, workers in processes (then threads)"
    runs=(
        "traffic bursty process pard,pard@profile,nexus,clipper++,none 170"
        "live tweet process pard,nexus,clipper++,none 170"
        "traffic bursty thread pard,nexus 80"
    )
    for run in "${runs[@]}"; do
        read -r p t mode droppers limit <<<"$run"
        name="$p-$t"
        [[ $mode == thread ]] && name="$p-$t-thread"
        timeout "$(cap "$limit")" "$PY" -m loadtests.pard_live --pipeline "$p" --trace "$t" \
            --workers auto --worker-mode "$mode" --profile "$OUTDIR/$p.cpu.profile.json" \
            --providers cpu --load "$LOAD" --seconds "$LIVE_S" --droppers "$droppers" \
            --out "$OUTDIR/$name" >"$OUTDIR/$name.log" 2>&1 \
            || { echo "pard_live $p $t ($mode) failed"; status=1; }
        grep -E "^(pard|nexus|clipper|none|WARNING|  - )" "$OUTDIR/$name.log" || tail -n 20 "$OUTDIR/$name.log"
    done
    timeout "$(cap 60)" "$PY" -m loadtests.bench_worker_hop --batches 1000 \
        --cases small:1,224:1,224:8 >"$OUTDIR/worker-hop.txt" 2>&1 \
        || { echo "bench_worker_hop failed"; status=1; }
    cat "$OUTDIR/worker-hop.txt"
fi

if want 4; then
    step "4. CUDA: traffic with worker scaling"
    timeout "$(cap 90)" "$PY" -m onnx_models profile traffic --provider cuda --repeats "$REPEATS" \
        --warmup 5 --out "$OUTDIR/traffic.cuda.profile.json" \
        >"$OUTDIR/traffic.cuda.profile.txt" 2>&1 || { echo "cuda profile failed"; status=1; }
    tail -n 25 "$OUTDIR/traffic.cuda.profile.txt"
    headroom=$("$PY" - "$OUTDIR/traffic.cuda.profile.json" "$CUDA_RATE" <<'EOF'
import sys
from loadtests.pard_live import plan_live
rate = float(sys.argv[2])
setup = plan_live("traffic", profile=sys.argv[1], providers="cuda", rate_rps=rate)
# ceil(rate / mu x headroom) = 3 workers for the module of least throughput mu
print(round(max(1.0, 3.0 * min(setup.worker_rps.values()) / rate * 0.99), 2))
EOF
    ) || { echo "cuda setup failed"; status=1; headroom=1.2; }
    echo "headroom $headroom at $CUDA_RATE req/s"
    # a CUDA worker builds and warms one session per feasible batch size: a longer cold start
    timeout "$(cap 120)" "$PY" -m loadtests.pard_live --pipeline traffic --trace bursty --workers auto \
        --profile "$OUTDIR/traffic.cuda.profile.json" --providers cuda --rate "$CUDA_RATE" \
        --headroom "$headroom" --cold-start-s 4 --seconds "$CUDA_S" --droppers pard,nexus \
        --worker-mode thread \
        --out "$OUTDIR/traffic-cuda" >"$OUTDIR/traffic-cuda.log" 2>&1 \
        || { echo "pard_live cuda failed"; status=1; }
    grep -E "^(pard|nexus|WARNING|  - )" "$OUTDIR/traffic-cuda.log" || tail -n 20 "$OUTDIR/traffic-cuda.log"
    # onnxruntime falls back to the CPU silently when CUDA cannot load: the report names
    # the provider the live sessions ran on
    grep -q "CUDAExecutionProvider |" "$OUTDIR/traffic-cuda/pard-live.md" 2>/dev/null \
        || { echo "the live sessions did not run on CUDA"; status=1; }
fi

step "done (status $status)"
for md in "$OUTDIR"/*/pard-live.md; do
    [[ -f $md ]] && { echo "--- $md"; sed -n '/## Side by side/,/## Per module/p' "$md"; }
done
exit "$status"
