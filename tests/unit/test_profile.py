"""Offline profiles: measuring d_k(b), the profile file, the shipped profiles, the CLI."""

from __future__ import annotations

import argparse
import base64
import dataclasses
import json
import shutil
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from onnx_models.cli import add_parser, main
from onnx_models.profile import (
    FORMAT,
    BatchTiming,
    ModuleProfile,
    Profile,
    ProfileEnvironment,
    ProfileError,
    default_profile_path,
    load_profile,
    profile_pipeline,
)
from onnx_models.spec import load_pipeline, pipeline_path, shipped_pipelines

FAST = {"warmup": 1, "repeats": 3, "intra_op_threads": 1}


def make_profile(timings: dict[int, float], *, name: str = "det", mid: int = 1) -> Profile:
    """A hand-made profile: one module with these median durations (p95 = 1.5 x median)."""
    return Profile(
        pipeline="p",
        modules=(
            ModuleProfile(
                id=mid,
                name=name,
                model="det.onnx",
                model_sha256="0" * 64,
                input_shape=(3, 8, 8),
                timings=tuple(
                    BatchTiming(batch=b, median_ms=ms, p95_ms=1.5 * ms, mean_ms=ms, min_ms=ms)
                    for b, ms in sorted(timings.items())
                ),
            ),
        ),
        environment=ProfileEnvironment(
            provider="CPUExecutionProvider", onnxruntime="1", device="cpu", intra_op_threads=1
        ),
        warmup=1,
        repeats=3,
    )


@pytest.fixture(scope="module")
def traffic_profile() -> Profile:
    spec = load_pipeline(pipeline_path("traffic"))
    return profile_pipeline(spec, batch_sizes=[1, 2], providers="cpu", **FAST)


def test_profile_measures_every_module_and_batch_size(traffic_profile: Profile) -> None:
    spec = load_pipeline(pipeline_path("traffic"))
    assert traffic_profile.pipeline == "traffic"
    assert [(str(m.id), m.name) for m in traffic_profile.modules] == [
        (m.id, m.name) for m in spec.modules
    ]
    for m in traffic_profile.modules:
        assert m.batch_sizes == (1, 2)
        assert m.input_shape == spec.module(m.id).input_shape
        for t in m.timings:
            assert 0 < t.min_ms <= t.median_ms <= t.p95_ms
    env = traffic_profile.environment
    assert env.provider == "CPUExecutionProvider"
    assert env.onnxruntime == ort.__version__
    assert env.intra_op_threads == 1
    assert env.device
    assert (traffic_profile.warmup, traffic_profile.repeats) == (1, 3)
    assert traffic_profile.cpu_share is not None and 0 < traffic_profile.cpu_share < 1.5
    traffic_profile.check_matches(spec)


def test_profile_file_round_trip(traffic_profile: Profile, tmp_path: Path) -> None:
    path = traffic_profile.write(tmp_path / "traffic.profile.json")
    loaded = load_profile(path, spec=load_pipeline(pipeline_path("traffic")))
    assert loaded.to_dict() == traffic_profile.to_dict()
    assert json.loads(path.read_text())["format"] == FORMAT


def test_profile_uses_each_modules_own_batch_sizes(tmp_path: Path) -> None:
    spec_path = tmp_path / "one.json"
    model = str(pipeline_path("live").parent.parent / "models" / "eye_tracking.onnx")
    spec_path.write_text(
        json.dumps(
            {
                "name": "one",
                "slo_ms": 50,
                "modules": [
                    {"name": "eye", "id": 7, "model": model, "pres": [], "subs": []},
                ],
            }
        )
    )
    spec = load_pipeline(spec_path)
    spec = dataclasses.replace(
        spec, modules=(dataclasses.replace(spec.modules[0], batch_sizes=(1, 3)),)
    )
    profile = profile_pipeline(spec, **FAST)
    # input_shape is not in the spec: it comes from the model's static dimensions.
    assert profile.module(7).input_shape == (1, 36, 60)
    assert profile.module(7).batch_sizes == (1, 3)
    assert default_profile_path(spec) == tmp_path / "one.profile.json"


def test_duration_is_exact_at_profiled_sizes_and_linear_between() -> None:
    profile = make_profile({1: 2.0, 4: 5.0, 8: 13.0})
    assert profile.duration_ms(1, 4) == 5.0
    assert profile.duration_ms(1, 2) == pytest.approx(3.0)
    assert profile.duration_ms(1, 6) == pytest.approx(9.0)
    assert profile.duration_ms(1, 8, stat="p95") == pytest.approx(19.5)
    assert profile.throughput(1, 4) == pytest.approx(800.0)  # 4 requests per 5 ms
    assert profile.throughput(1, 1) == pytest.approx(500.0)


def test_duration_lookup_by_id_name_or_id_string() -> None:
    profile = make_profile({1: 2.0, 2: 3.0}, name="det", mid=3)
    assert profile.duration_ms(3, 2) == profile.duration_ms("det", 2) == 3.0
    assert profile.duration_ms("3", 2) == 3.0  # runtimes that key modules by str(id)
    with pytest.raises(ProfileError, match="has no module 'pose'; det \\(id 3\\)"):
        profile.duration_ms("pose", 1)


def test_duration_outside_the_profiled_sizes_is_an_error() -> None:
    profile = make_profile({2: 2.0, 4: 5.0})
    with pytest.raises(ProfileError, match=r"batch 8 is outside the profiled batch sizes \[2, 4\]"):
        profile.duration_ms(1, 8)
    with pytest.raises(ProfileError, match="batch 1 is outside"):
        profile.duration_ms(1, 1)
    with pytest.raises(ProfileError, match="stat: expected 'median' or 'p95'"):
        profile.duration_ms(1, 2, stat="mean")  # type: ignore[arg-type]


def test_profile_of_other_models_is_rejected_as_stale(traffic_profile: Profile) -> None:
    live = load_pipeline(pipeline_path("live"))
    with pytest.raises(ProfileError, match="profile is of pipeline 'traffic', not 'live'"):
        traffic_profile.check_matches(live)
    traffic = load_pipeline(pipeline_path("traffic"))
    stale = dataclasses.replace(
        traffic_profile,
        modules=(
            dataclasses.replace(traffic_profile.modules[0], model_sha256="f" * 64),
            *traffic_profile.modules[1:],
        ),
    )
    with pytest.raises(
        ProfileError, match=r"object_detection \(id 1\): object_detection.onnx changed"
    ):
        stale.check_matches(traffic)


@pytest.mark.parametrize("name", shipped_pipelines())
def test_shipped_profile_fits_its_pipeline(name: str) -> None:
    spec = load_pipeline(pipeline_path(name))
    profile = load_profile(default_profile_path(spec), spec=spec)
    assert profile.environment.provider == "CPUExecutionProvider"
    for m in spec.modules:
        assert profile.module(m.id).batch_sizes == m.batch_sizes
        durations = [profile.duration_ms(m.id, b) for b in m.batch_sizes]
        assert all(d > 0 for d in durations)
        # A bigger batch takes longer: the compute grows with the batch size.
        assert durations[-1] > durations[0]


# --- invalid profile files ------------------------------------------------------------


def _write(tmp_path: Path, doc: object) -> Path:
    path = tmp_path / "p.profile.json"
    path.write_text(json.dumps(doc))
    return path


def _doc() -> dict:
    return make_profile({1: 2.0, 2: 3.0}).to_dict()


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        (lambda d: d.update(format="other/9"), "format: expected 'tailgate-profile/1'"),
        (lambda d: d.pop("environment"), "environment: missing"),
        (lambda d: d["modules"][0].pop("id"), "modules[0].id: missing"),
        (
            lambda d: d["modules"][0]["durations"][1].update(median_ms="3"),
            "modules[0].durations[1].median_ms: expected int or float, got '3'",
        ),
        (
            lambda d: d["modules"][0]["durations"][0].update(p95_ms=-1),
            "modules[0].durations[0]: must be positive, got p95_ms -1.0",
        ),
        (
            lambda d: d["modules"][0]["durations"].reverse(),
            "modules[0].durations: batch sizes must ascend, got [2, 1]",
        ),
        (lambda d: d["modules"][0].update(durations=[]), "modules[0].durations: is empty"),
        (lambda d: d.update(modules=[]), "modules: is empty"),
        (
            lambda d: d["modules"].append(d["modules"][0]),
            "modules: ids must be unique, got [1, 1]",
        ),
    ],
)
def test_invalid_profile_file_names_the_field(tmp_path: Path, edit: object, fragment: str) -> None:
    doc = _doc()
    edit(doc)  # type: ignore[operator]
    path = _write(tmp_path, doc)
    with pytest.raises(ProfileError) as exc:
        load_profile(path)
    assert str(exc.value).startswith(f"{path}: ")
    assert fragment in str(exc.value)


def test_unreadable_profile_files(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="cannot read the profile"):
        load_profile(tmp_path / "absent.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(ProfileError, match="invalid JSON"):
        load_profile(bad)


# --- a user's own model ------------------------------------------------------------------


# Relu over a float input of shape ["batch", "width"] (opset 17), serialised with onnx.helper:
# a user's model whose input has a dynamic axis besides the batch.
DYNAMIC_MODEL = base64.b64decode(
    "CAgSDnRhaWxnYXRlLXRlc3RzOlEKDAoBeBIBeSIEUmVsdRIDZHluWh0KAXgSGAoWCAESEgoHEgViYXRjaAoHEgV3"
    "aWR0aGIdCgF5EhgKFggBEhIKBxIFYmF0Y2gKBxIFd2lkdGhCBAoAEBE="
)


def test_a_dynamic_input_needs_input_shape_in_the_spec(tmp_path: Path) -> None:
    (tmp_path / "dyn.onnx").write_bytes(DYNAMIC_MODEL)
    doc = {
        "name": "dyn",
        "slo_ms": 10,
        "modules": [{"name": "relu", "id": 1, "model": "dyn.onnx", "pres": [], "subs": []}],
    }
    (tmp_path / "dyn.json").write_text(json.dumps(doc))
    spec = load_pipeline(tmp_path / "dyn.json")
    with pytest.raises(ProfileError, match=r"relu \(id 1\): input_shape: .*give input_shape"):
        profile_pipeline(spec, batch_sizes=[1], **FAST)
    doc["modules"][0]["input_shape"] = [16]  # type: ignore[index]
    (tmp_path / "dyn.json").write_text(json.dumps(doc))
    profile = profile_pipeline(load_pipeline(tmp_path / "dyn.json"), batch_sizes=[1, 4], **FAST)
    assert profile.module("relu").input_shape == (16,)


def test_profile_rejects_bad_arguments() -> None:
    spec = load_pipeline(pipeline_path("traffic"))
    with pytest.raises(ProfileError, match="need warmup >= 0, repeats >= 1, rounds >= 1"):
        profile_pipeline(spec, warmup=0, repeats=0)
    with pytest.raises(ProfileError, match=r"and intra_op_threads >= 1, got 10, 50, 5 and 0"):
        profile_pipeline(spec, intra_op_threads=0)
    with pytest.raises(ProfileError, match=r"got 10, 50, 0 and 1"):
        profile_pipeline(spec, rounds=0)
    with pytest.raises(ProfileError, match="provider: expected cpu, cuda or auto"):
        profile_pipeline(spec, providers="tpu")


# --- the command --------------------------------------------------------------------


def test_add_parser_registers_profile_under_a_parent_cli() -> None:
    parser = argparse.ArgumentParser(prog="tailgate")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["profile", "dag", "--batch-sizes", "4,1,2", "--provider", "cpu"])
    assert (args.pipeline, args.batch_sizes, args.provider) == ("dag", [1, 2, 4], "cpu")
    assert (args.warmup, args.repeats, args.rounds, args.threads) == (10, 50, 5, 1)
    assert args.out is None
    assert callable(args.func)


def test_profile_command_prints_the_table_and_writes_into_the_working_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A copy of the shipped spec whose models are given by absolute path.
    doc = json.loads(pipeline_path("dag").read_text())
    for m in doc["modules"]:
        m["model"] = str((pipeline_path("dag").parent / m["model"]).resolve())
    (tmp_path / "mine.json").write_text(json.dumps(doc))
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    argv = ["profile", str(tmp_path / "mine.json"), "--batch-sizes", "1,2"]
    assert main([*argv, "--warmup", "0", "--repeats", "2", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "dag: CPUExecutionProvider on" in out
    assert "person_detection (1)" in out and "expression_recognition (4)" in out
    assert "gain = throughput(b)/throughput(1)" in out
    written = tmp_path / "work" / "dag.profile.json"
    assert f"wrote {written}" in out
    assert not (tmp_path / "dag.profile.json").exists()  # not beside the spec
    profile = load_profile(written, spec=load_pipeline(tmp_path / "mine.json"))
    assert profile.module(2).batch_sizes == (1, 2)


def test_profile_command_to_an_explicit_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "t.json"
    argv = ["profile", "traffic", "--batch-sizes", "1", "--repeats", "1", "--out", str(out)]
    assert main([*argv, "--warmup", "0", "--provider", "cpu"]) == 0
    assert load_profile(out).module("text_recognition").batch_sizes == (1,)


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["profile", "nowhere"], "no spec file 'nowhere' and no shipped pipeline"),
        (["profile", "traffic", "--out", "/no/such/dir/p.json"], "folder /no/such/dir"),
    ],
)
def test_profile_command_errors_exit_2(
    argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert fragment in capsys.readouterr().err


def test_profile_command_on_an_invalid_spec_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    shutil.copy(pipeline_path("traffic"), bad)
    bad.write_text(bad.read_text().replace('"slo_ms": 400', '"slo_ms": 0'))
    assert main(["profile", str(bad)]) == 2
    assert "slo_ms: must be a positive number" in capsys.readouterr().err


@pytest.mark.skipif(
    "CUDAExecutionProvider" in ort.get_available_providers(), reason="CUDA is available here"
)
def test_profile_command_without_cuda_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", "traffic", "--provider", "cuda"]) == 2
    assert "CUDAExecutionProvider not available" in capsys.readouterr().err


# --- beside busy neighbours ------------------------------------------------------------


def test_neighbours_run_the_pipeline_while_the_profile_is_timed() -> None:
    from onnx_models.profile import _Cell, _Neighbours

    spec = load_pipeline(pipeline_path("traffic"))
    session = ort.InferenceSession(str(spec.modules[0].model), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    cells = [_Cell(spec.modules[0], 1, session, {name: np.zeros((1, 3, 224, 224), np.float32)})]
    load = _Neighbours(cells, threads=1, count=2)
    assert load.jobs == [(str(spec.modules[0].model), name, (1, 3, 224, 224), "<f4")]
    try:
        load.start()  # returns once both have loaded their sessions
        deadline = time.monotonic() + 30.0
        while load.runs.value < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        load.check()
        assert load.runs.value >= 4
    finally:
        load.stop()
    assert [p.exitcode for p in load.procs] == [0, 0]


def test_a_neighbour_that_cannot_load_is_named_and_none_is_left(tmp_path: Path) -> None:
    from onnx_models.profile import _Cell, _Neighbours

    spec = load_pipeline(pipeline_path("traffic"))
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"not a model")
    module = dataclasses.replace(spec.modules[0], model=bad)
    cell = _Cell(module, 1, None, {"x": np.zeros((1, 4), np.float32)})
    load = _Neighbours([cell], threads=1, count=2)
    with pytest.raises(ProfileError, match=r"neighbours: neighbour \d: .*broken\.onnx"):
        try:
            load.start()
        finally:
            load.stop()
    assert all(not p.is_alive() for p in load.procs)


def test_profile_beside_neighbours_records_them(tmp_path: Path) -> None:
    import multiprocessing

    spec = load_pipeline(pipeline_path("traffic"))
    profile = profile_pipeline(spec, batch_sizes=[1], providers="cpu", neighbours=1, **FAST)
    assert profile.neighbours == 1
    assert multiprocessing.active_children() == []
    again = load_profile(profile.write(tmp_path / "p.json"))
    assert again.neighbours == 1
    doc = json.loads((tmp_path / "p.json").read_text())
    assert doc["method"]["neighbours"] == 1
    del doc["method"]["neighbours"]  # a profile from before the option: a quiet host
    assert load_profile(_write(tmp_path, doc)).neighbours == 0
    doc["method"]["neighbours"] = -1
    with pytest.raises(ProfileError, match=r"method\.neighbours: must be >= 0, got -1"):
        load_profile(_write(tmp_path, doc))
    with pytest.raises(ProfileError, match="neighbours: must be >= 0, got -1"):
        profile_pipeline(spec, neighbours=-1)


def test_neighbours_end_when_the_profiler_is_killed(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    script = (
        "import sys, time\n"
        "from onnx_models.profile import _Cell, _Neighbours\n"
        "from onnx_models.spec import load_pipeline, pipeline_path\n"
        "import numpy as np\n"
        "spec = load_pipeline(pipeline_path('traffic'))\n"
        "feed = {'input': np.zeros((1, 3, 224, 224), np.float32)}\n"
        "import onnxruntime as ort\n"
        "s = ort.InferenceSession(str(spec.modules[0].model), providers=['CPUExecutionProvider'])\n"
        "feed = {s.get_inputs()[0].name: feed['input']}\n"
        "load = _Neighbours([_Cell(spec.modules[0], 1, s, feed)], threads=1, count=2)\n"
        "load.start()\n"
        "print(' '.join(str(p.pid) for p in load.procs), flush=True)\n"
        "time.sleep(300)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2
    finally:
        proc.send_signal(signal.SIGKILL)  # no cleanup of any kind in the profiler
        proc.wait(10)
        assert proc.stdout is not None
        proc.stdout.close()

    def alive(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + 20.0
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p for p in pids if alive(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert not left, f"neighbours {left} outlived their profiler"
