"""Offline profiles: each module's execution duration d_k(b) per batch size (PARD §4.2, §5.1).

`profile_pipeline` runs every module of a pipeline under onnxruntime at each feasible batch
size on a seeded random input and keeps the median and p95 of the measured
``InferenceSession.run`` durations (host-to-device copies included, as a worker pays them).
It uses CUDAExecutionProvider when onnxruntime has it, else CPU, and records the provider
actually used, the onnxruntime version, the CPU or GPU name and the intra-op threads.

A profile is a JSON file, by default ``<pipeline>.profile.json`` beside the spec; a runtime
reads it with `load_profile` and asks `Profile.duration_ms(module, batch)` (d_k, PARD eq. 3)
and `Profile.throughput(module, batch)` (requests/s of one worker, for the load factor μ).

Errors::

    Exception
     └── OnnxModelsError
          └── ProfileError   provider unavailable, onnxruntime failed on a module, a
                             profile file is invalid, or it does not fit its pipeline
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import platform
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any, Literal

import numpy as np

from onnx_models.errors import ProfileError
from onnx_models.spec import PipelineSpec
from taskserver.pipeline.config import ModuleConfig

__all__ = [
    "FORMAT",
    "BatchTiming",
    "ModuleProfile",
    "Profile",
    "ProfileEnvironment",
    "ProfileError",
    "default_profile_path",
    "device_name",
    "load_profile",
    "profile_pipeline",
    "resolve_providers",
]

FORMAT = "tailgate-profile/1"
CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"

Stat = Literal["median", "p95"]

_DTYPES: Mapping[str, Any] = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(uint8)": np.uint8,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
}


@dataclass(frozen=True)
class BatchTiming:
    """Measured durations of one batch size, in ms."""

    batch: int
    median_ms: float
    p95_ms: float
    mean_ms: float
    min_ms: float


@dataclass(frozen=True)
class ModuleProfile:
    """The timings of one module, ascending by batch size."""

    id: int
    name: str
    model: str
    """File name of the model that was timed."""
    model_sha256: str
    """SHA-256 of that file, to tell a stale profile from a fresh one."""
    input_shape: tuple[int, ...]
    timings: tuple[BatchTiming, ...]

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        """The profiled batch sizes, ascending."""
        return tuple(t.batch for t in self.timings)


@dataclass(frozen=True)
class ProfileEnvironment:
    """Where a profile was taken."""

    provider: str
    """Execution provider that ran the models (first of the session's providers)."""
    onnxruntime: str
    """onnxruntime version."""
    device: str
    """CPU model name, or GPU name under CUDA."""
    intra_op_threads: int
    platform: str = ""
    python: str = ""


@dataclass(frozen=True)
class Profile:
    """An offline profile of one pipeline: d_k(b) for each module and feasible batch size."""

    pipeline: str
    modules: tuple[ModuleProfile, ...]
    environment: ProfileEnvironment
    warmup: int
    repeats: int
    rounds: int = 1
    """Interleaved passes the repeats were split into."""
    cpu_share: float | None = None
    """Process CPU time / (wall time x threads) over the timed runs on a CPU provider: near
    1.0 when the host left the cores to the profiler, lower when other work competed."""
    created_utc: str = ""
    neighbours: int = 0
    """Sessions of this pipeline's modules that ran beside the timed one, each in a process
    of its own, busy for the whole measurement (`profile_pipeline`): 0 for a quiet host."""
    _by_id: Mapping[int, ModuleProfile] = field(init=False, repr=False, compare=False)
    _by_name: Mapping[str, ModuleProfile] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_id", {m.id: m for m in self.modules})
        object.__setattr__(self, "_by_name", {m.name: m for m in self.modules})

    def module(self, module: int | str) -> ModuleProfile:
        """A module's timings by id, or by name (a string of digits also matches the id)."""
        found = self._by_id.get(module) if isinstance(module, int) else self._by_name.get(module)
        if found is None and isinstance(module, str) and module.isdigit():
            found = self._by_id.get(int(module))
        if found is None:
            known = ", ".join(f"{m.name} (id {m.id})" for m in self.modules)
            raise ProfileError(f"profile of {self.pipeline!r} has no module {module!r}; {known}")
        return found

    def duration_ms(self, module: int | str, batch: int, stat: Stat = "median") -> float:
        """d_k(b): execution duration of one batch of `batch` requests, in ms.

        Exact at a profiled batch size, linear between two profiled ones; outside the
        profiled range it raises ProfileError rather than guess.
        """
        if stat not in ("median", "p95"):
            raise ProfileError(f"stat: expected 'median' or 'p95', got {stat!r}")
        m = self.module(module)
        pick: Callable[[BatchTiming], float] = (
            (lambda t: t.median_ms) if stat == "median" else (lambda t: t.p95_ms)
        )
        timings = m.timings
        if not timings[0].batch <= batch <= timings[-1].batch:
            raise ProfileError(
                f"{m.name} (id {m.id}): batch {batch} is outside the profiled batch sizes "
                f"{list(m.batch_sizes)}"
            )
        for lo, hi in pairwise(timings):
            if lo.batch <= batch <= hi.batch:
                share = (batch - lo.batch) / (hi.batch - lo.batch)
                return pick(lo) + share * (pick(hi) - pick(lo))
        return pick(timings[0])  # a single profiled batch size equal to `batch`

    def throughput(self, module: int | str, batch: int, stat: Stat = "median") -> float:
        """Requests per second of one worker that runs batches of `batch` back to back."""
        return batch * 1000.0 / self.duration_ms(module, batch, stat)

    def check_matches(self, spec: PipelineSpec) -> None:
        """Raise ProfileError unless this profile was taken of `spec` and its model files."""
        if self.pipeline != spec.name:
            raise ProfileError(f"profile is of pipeline {self.pipeline!r}, not {spec.name!r}")
        for m in spec.modules:
            try:
                got = self._by_id[int(m.id)]  # a profile file keeps the spec's integer ids
            except (KeyError, ValueError):
                raise ProfileError(f"{m.label}: not in the profile; profile it again") from None
            if got.name != m.name:
                raise ProfileError(f"{m.label}: the profile has {got.name!r} under this id")
            if got.model_sha256 != _sha256(m.model):
                raise ProfileError(
                    f"{m.label}: {m.model.name} changed since it was profiled; profile it again"
                )

    def to_dict(self) -> dict[str, Any]:
        """The JSON document of this profile."""
        env = self.environment
        return {
            "format": FORMAT,
            "pipeline": self.pipeline,
            "created_utc": self.created_utc,
            "environment": {
                "provider": env.provider,
                "onnxruntime": env.onnxruntime,
                "device": env.device,
                "intra_op_threads": env.intra_op_threads,
                "platform": env.platform,
                "python": env.python,
            },
            "method": {
                "warmup": self.warmup,
                "repeats": self.repeats,
                "rounds": self.rounds,
                "cpu_share": None if self.cpu_share is None else round(self.cpu_share, 3),
                "neighbours": self.neighbours,
                "timer": "wall time of InferenceSession.run on a seeded random input, in ms",
            },
            "modules": [
                {
                    "id": m.id,
                    "name": m.name,
                    "model": m.model,
                    "model_sha256": m.model_sha256,
                    "input_shape": list(m.input_shape),
                    "durations": [
                        {
                            "batch": t.batch,
                            "median_ms": round(t.median_ms, 4),
                            "p95_ms": round(t.p95_ms, 4),
                            "mean_ms": round(t.mean_ms, 4),
                            "min_ms": round(t.min_ms, 4),
                        }
                        for t in m.timings
                    ],
                }
                for m in self.modules
            ],
        }

    def write(self, path: str | Path) -> Path:
        """Write the profile as JSON (atomically) and return the path."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")
        tmp.replace(path)
        return path


def default_profile_path(spec: PipelineSpec) -> Path:
    """``<pipeline>.profile.json`` beside the spec file."""
    if spec.path is None:
        raise ProfileError(f"pipeline {spec.name!r} was not read from a file: give a path")
    return spec.path.parent / f"{spec.name}.profile.json"


def resolve_providers(providers: str | Sequence[str] | None = None) -> list[str]:
    """onnxruntime providers for ``auto`` (None), ``cpu``, ``cuda`` or an explicit list."""
    import onnxruntime as ort

    available = ort.get_available_providers()
    if providers is None or providers == "auto":
        return [CUDA, CPU] if CUDA in available else [CPU]
    if providers == "cpu":
        return [CPU]
    if providers == "cuda":
        providers = [CUDA, CPU]
    if isinstance(providers, str):
        raise ProfileError(f"provider: expected cpu, cuda or auto, got {providers!r}")
    missing = [p for p in providers if p not in available]
    if missing:
        hint = " (install onnxruntime-gpu)" if CUDA in missing else ""
        raise ProfileError(
            f"provider: {', '.join(missing)} not available in onnxruntime {ort.__version__} "
            f"(it has {', '.join(available)}){hint}"
        )
    return list(providers)


def profile_pipeline(
    spec: PipelineSpec,
    batch_sizes: Sequence[int] | None = None,
    warmup: int = 10,
    repeats: int = 50,
    providers: str | Sequence[str] | None = None,
    intra_op_threads: int = 1,
    rounds: int = 5,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    neighbours: int = 0,
) -> Profile:
    """Measure d_k(b) of every module at each batch size (the spec's, unless given).

    Each (module, batch size) is run `warmup` times untimed, then `repeats` times timed,
    in `rounds` interleaved passes over all of them: a burst of load elsewhere on the host
    then spoils a few samples of every cell instead of all the samples of one, and the
    median stays put.

    `intra_op_threads` defaults to 1: one worker per core, as PARD runs one worker per GPU.
    A single-threaded run also stays stable beside other processes, where a parallel
    section waits for its slowest thread; give the threads the serving session will use.

    `neighbours` (CPU only) starts that many processes first, each running every module of
    the pipeline in turn at each batch size, with the same intra-op threads, for the whole
    measurement: the timed session then shares the host as a worker shares it with the other
    workers of a scaled-out pipeline (cores, caches, memory bandwidth, clock). PARD profiles
    a worker on a device of its own (§4.2); where workers share one CPU, d_k(b) measured on
    a quiet host is what one worker alone achieves, not what each of N achieves together.
    This option goes beyond the paper; the profile records the count.
    """
    import onnxruntime as ort

    if warmup < 0 or repeats < 1 or rounds < 1 or intra_op_threads < 1:
        raise ProfileError(
            "need warmup >= 0, repeats >= 1, rounds >= 1 and intra_op_threads >= 1, got "
            f"{warmup}, {repeats}, {rounds} and {intra_op_threads}"
        )
    if batch_sizes is not None and (not batch_sizes or min(batch_sizes) < 1):
        raise ProfileError(f"batch sizes: must be positive, got {list(batch_sizes)}")
    if neighbours < 0:
        raise ProfileError(f"neighbours: must be >= 0, got {neighbours}")
    chosen = resolve_providers(providers)
    if neighbours and chosen[0] != CPU:
        raise ProfileError("neighbours: only on the CPU provider (workers sharing one CPU)")
    threads = intra_op_threads
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3  # errors only: the provider actually used is recorded
    rng = np.random.default_rng(seed)
    used: set[str] = set()
    shapes: dict[str, tuple[int, ...]] = {}
    cells: list[_Cell] = []
    for m in spec.modules:
        try:
            session = ort.InferenceSession(str(m.model), options, providers=chosen)
        except Exception as exc:  # onnxruntime's exception types are not exported
            raise ProfileError(f"{m.label}: onnxruntime cannot load {m.model}: {exc}") from exc
        actual = session.get_providers()[0]
        if chosen[0] == CUDA and actual != CUDA:
            raise ProfileError(f"{m.label}: CUDAExecutionProvider failed to start ({actual} ran)")
        used.add(actual)
        shape, dtype, input_name = _input_of(session, m)
        shapes[m.id] = shape
        for batch in sorted(set(batch_sizes or m.batch_sizes)):
            feed = {input_name: _random_input(rng, (batch, *shape), dtype)}
            cells.append(_Cell(m, batch, session, feed))
    load = _Neighbours(cells, threads, neighbours)
    try:
        load.start()
        for cell in cells:
            cell.run(warmup, timed=False)
        rounds = min(rounds, repeats)
        cpu_s, wall_s = _timed_rounds(cells, repeats, rounds, progress)
        load.check()
    finally:
        load.stop()
    modules = []
    for m in spec.modules:
        modules.append(
            ModuleProfile(
                id=int(m.id),  # the file keeps the spec's integer ids
                name=m.name,
                model=m.model.name,
                model_sha256=_sha256(m.model),
                input_shape=shapes[m.id],
                timings=tuple(c.timing() for c in cells if c.module is m),
            )
        )
    provider = ",".join(sorted(used))
    return Profile(
        pipeline=spec.name,
        modules=tuple(modules),
        environment=ProfileEnvironment(
            provider=provider,
            onnxruntime=ort.__version__,
            device=device_name(provider),
            intra_op_threads=threads,
            platform=platform.platform(),
            python=platform.python_version(),
        ),
        warmup=warmup,
        repeats=repeats,
        rounds=rounds,
        cpu_share=cpu_s / (wall_s * threads) if CUDA not in used else None,
        created_utc=dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        neighbours=neighbours,
    )


def _timed_rounds(
    cells: list[_Cell], repeats: int, rounds: int, progress: Callable[[str], None] | None
) -> tuple[float, float]:
    """Time every cell in `rounds` interleaved passes; the profiler's CPU and wall time."""
    cpu_s = wall_s = 0.0
    for r in range(rounds):
        runs = repeats // rounds + (1 if r < repeats % rounds else 0)
        for cell in cells:
            # One untimed run first: it lets the previous cell's session threads stop
            # spinning and brings this model's weights back into the caches.
            cell.run(1, timed=False)
            cpu0, wall0 = time.process_time(), time.perf_counter()
            cell.run(runs, timed=True)
            cpu_s += time.process_time() - cpu0
            wall_s += time.perf_counter() - wall0
        if progress is not None:
            progress(f"round {r + 1}/{rounds}: {len(cells)} module x batch cells")
    return cpu_s, wall_s


class _Neighbours:
    """`count` processes that keep the pipeline's sessions busy while the profiler times."""

    START_S = 120.0

    def __init__(self, cells: list[_Cell], threads: int, count: int) -> None:
        # (model file, input name, batch shape, dtype): the timed cells, as picklable jobs
        self.jobs = [
            (str(c.module.model), name, array.shape, array.dtype.str)
            for c in cells
            for name, array in c.feed.items()
        ]
        self.threads, self.count = threads, count
        self.procs: list[Any] = []
        self.stop_event: Any = None
        self.errors: Any = None
        self.runs: Any = None
        """Runs the neighbours completed (a shared counter), to show they were busy."""

    def start(self) -> None:
        if not self.count:
            return
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")  # never a fork of a process with sessions
        self.stop_event, self.errors = ctx.Event(), ctx.Queue()
        self.runs = ctx.Value("q", 0)
        ready = ctx.Barrier(self.count + 1)
        for i in range(self.count):
            proc = ctx.Process(
                target=_neighbour_main,
                args=(
                    self.jobs,
                    self.threads,
                    i,
                    ready,
                    self.stop_event,
                    self.errors,
                    self.runs,
                    os.getpid(),
                ),
                daemon=True,
                name=f"profile-neighbour-{i}",
            )
            proc.start()
            self.procs.append(proc)
        try:
            ready.wait(self.START_S)
        except Exception:  # threading.BrokenBarrierError: one failed or timed out
            self.check(wait_s=5.0)  # a failed one aborts the barrier as it reports
            raise ProfileError(
                f"neighbours: {self.count} did not start within {self.START_S:.0f} s"
            ) from None

    def check(self, wait_s: float = 0.0) -> None:
        """Raise the first neighbour's error (waiting up to `wait_s` for one on its way),
        or name one that exited while it was needed."""
        if not self.count:
            return
        try:
            error = self.errors.get(timeout=wait_s) if wait_s else self.errors.get_nowait()
        except Exception:  # queue.Empty
            error = None
        if error is not None:
            raise ProfileError(f"neighbours: {error}")
        dead = [p.name for p in self.procs if not p.is_alive()]
        if dead:
            raise ProfileError(f"neighbours: {', '.join(dead)} exited during the measurement")

    def stop(self) -> None:
        if self.stop_event is not None:
            self.stop_event.set()
        for proc in self.procs:
            proc.join(10.0)
            if proc.is_alive():
                proc.kill()
                proc.join()
        if self.errors is not None:
            self.errors.close()
            self.errors.join_thread()


def _neighbour_main(
    jobs: list[tuple[str, str, tuple[int, ...], str]],
    threads: int,
    index: int,
    ready: Any,
    stop: Any,
    errors: Any,
    runs: Any,
    parent: int,
) -> None:
    """A neighbour: load every module's session, then run the jobs in turn until stopped,
    or until its parent is gone (killed, or ended by a timeout's SIGTERM, it never sets
    `stop`: the neighbour then finds itself adopted by another process)."""
    try:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.log_severity_level = 3
        rng = np.random.default_rng(1000 + index)
        sessions: dict[str, Any] = {}
        work = []
        for model, name, shape, dtype in jobs:
            if model not in sessions:
                sessions[model] = ort.InferenceSession(model, options, providers=[CPU])
            work.append((sessions[model], {name: _random_input(rng, shape, np.dtype(dtype))}))
        order = rng.permutation(len(work))  # neighbours out of step with each other
    except Exception as exc:  # onnxruntime's exception types are not exported
        errors.put(f"neighbour {index}: {exc}")
        ready.abort()
        return
    try:
        ready.wait(_Neighbours.START_S + 30.0)
    except Exception:  # threading.BrokenBarrierError: another failed, or the parent is gone
        return
    while not stop.is_set() and os.getppid() == parent:
        for k in order:
            session, feed = work[k]
            session.run(None, feed)
            with runs.get_lock():
                runs.value += 1
            if stop.is_set() or os.getppid() != parent:
                break


class _Cell:
    """One module at one batch size: its session, its input and its timed samples (ms)."""

    def __init__(self, module: ModuleConfig, batch: int, session: Any, feed: dict) -> None:
        self.module, self.batch, self.session, self.feed = module, batch, session, feed
        self.samples: list[float] = []

    def run(self, times: int, *, timed: bool) -> None:
        try:
            for _ in range(times):
                start = time.perf_counter_ns()
                self.session.run(None, self.feed)
                if timed:
                    self.samples.append((time.perf_counter_ns() - start) / 1e6)
        except Exception as exc:  # onnxruntime's exception types are not exported
            raise ProfileError(
                f"{self.module.label}: onnxruntime failed at batch {self.batch}: {exc}"
            ) from exc

    def timing(self) -> BatchTiming:
        samples = np.asarray(self.samples)
        return BatchTiming(
            batch=self.batch,
            median_ms=float(np.median(samples)),
            p95_ms=float(np.percentile(samples, 95)),
            mean_ms=float(np.mean(samples)),
            min_ms=float(np.min(samples)),
        )


def _input_of(session: Any, m: ModuleConfig) -> tuple[tuple[int, ...], Any, str]:
    """The input's shape without the batch axis, its numpy dtype and its name."""
    inputs = session.get_inputs()
    if len(inputs) != 1:
        names = [i.name for i in inputs]
        raise ProfileError(f"{m.label}: model: needs exactly one input to profile, has {names}")
    (inp,) = inputs
    dtype = _DTYPES.get(inp.type)
    if dtype is None:
        raise ProfileError(f"{m.label}: model: input {inp.name!r} has unsupported type {inp.type}")
    if m.input_shape is not None:
        return m.input_shape, dtype, inp.name
    dims = inp.shape[1:]
    if not dims or not all(isinstance(d, int) and d > 0 for d in dims):
        raise ProfileError(
            f"{m.label}: input_shape: the model's input {inp.name!r} has shape {inp.shape}; "
            "give input_shape (without the batch axis) in the spec"
        )
    return tuple(dims), dtype, inp.name


def _random_input(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    if np.issubdtype(dtype, np.integer):
        return rng.integers(0, 256, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def device_name(provider: str) -> str:
    """The device a profile taken here under `provider` records: the GPU's name under CUDA,
    else the CPU model's."""
    return _gpu_name() if provider == CUDA else _cpu_name()


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _gpu_name() -> str:
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(
                [smi, "--query-gpu=name", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            out = ""
        if out:
            return out.splitlines()[0]
    return "CUDA device"


def load_profile(path: str | Path, spec: PipelineSpec | None = None) -> Profile:
    """Read a profile file; with `spec`, also check it was taken of that pipeline."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read the profile: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{path}: invalid JSON: {exc}") from exc
    profile = _parse(data, _Where(str(path)))
    if spec is not None:
        try:
            profile.check_matches(spec)
        except ProfileError as exc:
            raise ProfileError(f"{path}: {exc}") from None
    return profile


class _Where:
    """Field paths for ProfileError messages: ``file: modules[1].durations[0].median_ms``."""

    def __init__(self, source: str) -> None:
        self.source = source

    def error(self, field_path: str, message: str) -> ProfileError:
        return ProfileError(f"{self.source}: {field_path}: {message}")

    def get(self, data: Any, key: str, kind: type | tuple[type, ...], field_path: str) -> Any:
        if not isinstance(data, dict) or key not in data:
            raise self.error(field_path, "missing")
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, kind):
            raise self.error(field_path, f"expected {_kind_name(kind)}, got {value!r}")
        return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


def _parse(data: Any, w: _Where) -> Profile:
    if not isinstance(data, dict):
        raise w.error("(top)", f"expected an object, got {type(data).__name__}")
    fmt = data.get("format")
    if fmt != FORMAT:
        raise w.error("format", f"expected {FORMAT!r}, got {fmt!r}")
    env = w.get(data, "environment", dict, "environment")
    method = w.get(data, "method", dict, "method")
    raw_modules = w.get(data, "modules", list, "modules")
    if not raw_modules:
        raise w.error("modules", "is empty")
    modules = []
    for i, raw in enumerate(raw_modules):
        at = f"modules[{i}]"
        raw_timings = w.get(raw, "durations", list, f"{at}.durations")
        timings = []
        for j, t in enumerate(raw_timings):
            tat = f"{at}.durations[{j}]"
            batch = w.get(t, "batch", int, f"{tat}.batch")
            values = {
                key: float(w.get(t, key, (int, float), f"{tat}.{key}"))
                for key in ("median_ms", "p95_ms", "mean_ms", "min_ms")
            }
            bad = [k for k, v in values.items() if not v > 0 or not np.isfinite(v)]
            if batch < 1 or bad:
                what = f"batch {batch}" if batch < 1 else f"{bad[0]} {values[bad[0]]}"
                raise w.error(tat, f"must be positive, got {what}")
            timings.append(BatchTiming(batch=batch, **values))
        if not timings:
            raise w.error(f"{at}.durations", "is empty")
        batches = [t.batch for t in timings]
        if batches != sorted(set(batches)):
            raise w.error(f"{at}.durations", f"batch sizes must ascend, got {batches}")
        modules.append(
            ModuleProfile(
                id=w.get(raw, "id", int, f"{at}.id"),
                name=w.get(raw, "name", str, f"{at}.name"),
                model=w.get(raw, "model", str, f"{at}.model"),
                model_sha256=w.get(raw, "model_sha256", str, f"{at}.model_sha256"),
                input_shape=tuple(w.get(raw, "input_shape", list, f"{at}.input_shape")),
                timings=tuple(timings),
            )
        )
    ids = [m.id for m in modules]
    if len(set(ids)) != len(ids):
        raise w.error("modules", f"ids must be unique, got {ids}")
    return Profile(
        pipeline=w.get(data, "pipeline", str, "pipeline"),
        modules=tuple(modules),
        environment=ProfileEnvironment(
            provider=w.get(env, "provider", str, "environment.provider"),
            onnxruntime=w.get(env, "onnxruntime", str, "environment.onnxruntime"),
            device=w.get(env, "device", str, "environment.device"),
            intra_op_threads=w.get(env, "intra_op_threads", int, "environment.intra_op_threads"),
            platform=str(env.get("platform", "")),
            python=str(env.get("python", "")),
        ),
        warmup=w.get(method, "warmup", int, "method.warmup"),
        repeats=w.get(method, "repeats", int, "method.repeats"),
        rounds=w.get(method, "rounds", int, "method.rounds") if "rounds" in method else 1,
        cpu_share=(
            float(w.get(method, "cpu_share", (int, float), "method.cpu_share"))
            if method.get("cpu_share") is not None
            else None
        ),
        created_utc=str(data.get("created_utc", "")),
        neighbours=(
            _count(w.get(method, "neighbours", int, "method.neighbours"), w, "method.neighbours")
            if "neighbours" in method
            else 0
        ),
    )


def _count(value: int, w: _Where, field_path: str) -> int:
    if value < 0:
        raise w.error(field_path, f"must be >= 0, got {value}")
    return value
