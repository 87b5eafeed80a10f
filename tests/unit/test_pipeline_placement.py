"""One stage of a pipeline split across task servers: placement checks and hand-off payloads."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path

import numpy as np
import pytest

from taskserver.pard import ModuleState
from taskserver.pipeline import (
    FULL_REGION,
    BadPayload,
    ModuleConfig,
    PipelineConfigError,
    PipelineExecutor,
    fit_input,
    parse_payload,
)
from taskserver.pipeline.remote import PeerLink, decode_states, encode_states
from taskserver.pipeline.tensors import handoff_payload
from tests.unit.test_pipeline_runtime import chain_modules, make_config


def dag_modules() -> tuple[ModuleConfig, ...]:
    """1 -> {2, 3} -> 4 (a split and a merge)."""
    spec = {
        "1": ((), ("2", "3")),
        "2": (("1",), ("4",)),
        "3": (("1",), ("4",)),
        "4": (("2", "3"), ()),
    }
    return tuple(
        ModuleConfig(id=m, name=f"m{m}", model=Path(f"m{m}.onnx"), pres=p, subs=s)
        for m, (p, s) in spec.items()
    )


def test_all_modules_run_here_by_default():
    config = make_config(chain_modules(3))
    assert config.local == ("1", "2", "3") and config.entries == ("1",) and not config.peers


@pytest.mark.parametrize(
    ("modules", "local", "peers", "entries"),
    [
        (chain_modules(3), ("1",), {"2": "127.0.0.1:9102"}, ("1",)),
        (chain_modules(3), ("2", "3"), {}, ("2",)),
        (chain_modules(3), ("2",), {"3": "h:1"}, ("2",)),
        (dag_modules(), ("1",), {"2": "h:1", "3": "h:1"}, ("1",)),
        (dag_modules(), ("2", "3", "4"), {}, ("2", "3")),
        (dag_modules(), ("1", "2", "3"), {"4": "h:2"}, ("1",)),
    ],
)
def test_valid_stages(modules, local, peers, entries):
    config = make_config(modules, local=local, peers=peers)
    assert config.entries == entries
    assert all(config.runs_here(m) for m in local)


@pytest.mark.parametrize(
    ("modules", "local", "peers", "message"),
    [
        (chain_modules(3), ("1",), {}, r"m2 \(id 2\) runs elsewhere; give the host:port"),
        (chain_modules(3), ("1", "9"), {}, "need distinct module ids"),
        (chain_modules(3), ("1", "3"), {"2": "h:1"}, "must all follow from it"),
        (chain_modules(4), ("2", "4"), {"3": "h:1"}, "leads back to local modules"),
        (chain_modules(3), ("1",), {"2": "h:1", "3": "h:2"}, r"\['3'\] are not subs"),
        (chain_modules(3), ("1",), {"2": "nohost"}, "need host:port, got 'nohost'"),
        (dag_modules(), ("1", "2"), {"3": "h:1", "4": "h:1"}, "its pres"),
        # 2 and 3 would need two hand-offs to one stage: its merge could not join them
        (
            dag_modules(),
            ("1",),
            {"2": "h:1", "3": "h:2"},
            "follow both the stage at h:1 and the one at h:2",
        ),
        (dag_modules(), ("1", "4"), {"2": "h:1", "3": "h:1"}, "must all follow from it"),
    ],
)
def test_bad_stages_name_the_problem(modules, local, peers, message):
    with pytest.raises(PipelineConfigError, match=message):
        make_config(modules, local=local, peers=peers)


def test_the_game_analysis_chain_splits_into_stages():
    from onnx_models.spec import load_pipeline, pipeline_path

    modules = load_pipeline(pipeline_path("ga")).modules
    head = make_config(modules, local=("1", "2"), peers={"3": "h:1"})
    tail = make_config(modules, local=("3", "4", "5"))
    assert (head.entries, tail.entries) == (("1",), ("3",))
    with pytest.raises(PipelineConfigError, match="must all follow from it"):
        make_config(modules, local=("1", "3"), peers={"2": "h:1"})


def test_a_hand_off_carries_only_the_pixels_later_crops_read():
    frame = np.random.default_rng(1).random((3, 60, 50), dtype=np.float32)
    region = (0.1, 0.2, 0.5, 0.9)
    raw = handoff_payload(frame, {"2": region}, 123.5, 4)
    assert len(raw) < frame.nbytes * 0.35  # the box is 40% x 70% of the frame
    request = parse_payload(raw)
    assert request.entries == {"2": region}
    assert request.budget_ms == 123.5 and request.top_k == 4
    got = request.array
    assert got is not None and got.shape == frame.shape
    # Every crop of the entry region or a region inside it reads the same pixels.
    for inner in (region, (0.1, 0.2, 0.2, 0.3), (0.45, 0.85, 0.5, 0.9), (0.3, 0.5, 0.31, 0.51)):
        for shape in ((3, 16, 16), (1, 7, 9), (3, 48, 192)):
            want = fit_input(frame, inner, shape, np.dtype(np.float32))
            assert np.array_equal(fit_input(got, inner, shape, np.dtype(np.float32)), want)
    assert not got[:, :10].any() and not got[:, :, 26:].any()  # nothing outside the box


def test_a_hand_off_of_the_whole_frame_sends_it_all():
    frame = np.random.default_rng(2).random((3, 6, 5), dtype=np.float32)
    request = parse_payload(handoff_payload(frame, {"2": FULL_REGION}, 50.0, 3))
    assert request.array is not None and np.array_equal(request.array, frame)


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ({}, "entries: must be an object"),
        ({"2": [0.5, 0, 0.4, 1]}, r"entries\.2: must be \[x0, y0, x1, y1\]"),
        ({"2": [0, 0, 1]}, r"entries\.2"),
    ],
)
def test_bad_hand_offs_name_the_field(entries, message):
    frame = base64.b64encode(np.zeros((1, 2, 2), np.float32).tobytes()).decode()
    body = {"input": {"shape": [1, 2, 2], "dtype": "float32", "b64": frame}, "entries": entries}
    with pytest.raises(BadPayload, match=message):
        parse_payload(json.dumps(body).encode())


def test_a_hand_off_needs_the_frame():
    with pytest.raises(BadPayload, match="a hand-off needs the frame"):
        parse_payload(json.dumps({"image_seed": 1, "entries": {"2": [0, 0, 1, 1]}}).encode())


def test_module_states_survive_the_wire_and_bad_ones_are_refused():
    states = [ModuleState("2", 4, 1, 0.012, (0.0, 0.3, 1.0), seq=7, incarnation=3)]
    assert decode_states("traffic", encode_states("traffic", states)) == states
    assert decode_states("traffic", b"") == []
    with pytest.raises(ValueError, match="serves pipeline 'live'"):
        decode_states("traffic", encode_states("live", states))
    bad = json.dumps({"pipeline": "traffic", "states": [{"module_id": "2", "batch_size": 0}]})
    with pytest.raises(ValueError, match="batch_size"):
        decode_states("traffic", bad.encode())


def test_a_hand_off_whose_box_does_not_fit_names_the_field():
    frame = np.zeros((1, 4, 4), np.float32)
    raw = handoff_payload(frame, {"2": (0.0, 0.0, 0.5, 0.5)}, 10.0, 3)
    size = int.from_bytes(raw[4:8], "big")
    header = json.loads(raw[8 : 8 + size])
    header["frame"]["box"] = [0, 3, 0, 2]  # 3 rows, but 2 were sent
    bad = json.dumps(header).encode()
    payload = raw[:4] + len(bad).to_bytes(4, "big") + bad + raw[8 + size :]
    with pytest.raises(BadPayload, match="payload: frame: box must hold the input"):
        parse_payload(payload)


async def test_a_hand_off_cancelled_while_connecting_is_never_sent():
    link = PeerLink("127.0.0.1:9", "traffic", lambda states: None)
    opened = asyncio.Event()
    sent: list[object] = []

    class Conn:
        closed = False

        def send_item(self, item: object) -> None:
            sent.append(item)

    async def slow_connect() -> Conn:
        opened.set()
        await asyncio.sleep(0.05)
        return Conn()

    link._connected = slow_connect  # type: ignore[method-assign]
    key = link.new_key()
    run = asyncio.create_task(link.run(key, b"{}", 100.0))
    await opened.wait()
    link.cancel(key)
    answer = await run
    assert answer.status == "cancelled" and sent == [] and link.outstanding == 0


def test_each_executor_is_a_new_incarnation_so_a_restarted_stage_is_heard():
    from tests.unit.test_pipeline_runtime import FakeRunner

    config = make_config(chain_modules(2))
    runners = {m: FakeRunner() for m in "12"}
    first, restarted = (
        PipelineExecutor(config, runners=runners),
        PipelineExecutor(config, runners=runners),
    )
    old = first.workers["2"].planner.snapshot(0.0)
    for _ in range(5):  # the old process had published a few times
        old = first.workers["2"].planner.snapshot(0.0)
    new = restarted.workers["2"].planner.snapshot(0.0)  # seq 0 again
    upstream = PipelineExecutor(config, runners=runners).workers["1"].planner
    assert upstream.merge(old)
    assert upstream.merge(new)  # taken although its seq is lower
    assert upstream.state("2").incarnation == new.incarnation
