"""Request-specific paths through a DAG: the ``branches`` field, the draw, merges that wait
only for the branches taken, PARD's estimate before and after the split, the live executor."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from onnx_models.spec import PipelineSpecError, load_pipeline, pipeline_path
from taskserver.pard import ModuleState, PipelineRequest, StatePlanner, create_dropper
from taskserver.pipeline import (
    FULL_REGION,
    BadPayload,
    ModuleConfig,
    PipelineConfigError,
    PipelineExecutor,
    Routing,
    branch_draw,
    parse_payload,
    route_key,
)
from taskserver.pipeline.tensors import handoff_payload
from tests.unit.test_pipeline_runtime import FakeRunner, make_config, payload, until
from tests.unit.test_pipeline_spec import module, write_spec

DAG_SUBS = {"1": ["2", "3"], "2": ["4"], "3": ["4"]}


def binomial_bound(n: int, p: float, sigmas: float = 4.5) -> float:
    """How far a share of n Bernoulli(p) draws may stray from p: `sigmas` standard errors."""
    return sigmas * math.sqrt(p * (1 - p) / n)


# --- the spec field -----------------------------------------------------------------------------


def dag_spec(**branches: Any) -> list[dict[str, Any]]:
    """The four-module DAG 1 -> {2, 3} -> 4, with `branches` on module 1 if given."""
    first = module(1, [], [2, 3])
    if branches:
        first["branches"] = branches["branches"]
    return [first, module(2, [1], [4]), module(3, [1], [4]), module(4, [2, 3], [])]


def test_the_shipped_dynamic_dag_is_dag_with_a_face_branch() -> None:
    dag = load_pipeline(pipeline_path("dag"))
    dynamic = load_pipeline(pipeline_path("dag_dynamic"))
    assert dynamic.slo_ms == dag.slo_ms == 420
    assert [(m.name, m.model, m.pres, m.subs) for m in dynamic.modules] == [
        (m.name, m.model, m.pres, m.subs) for m in dag.modules
    ]
    assert dynamic.module(1).branches == (("3", 0.6),)  # face recognition; pose always
    assert [m.branches for m in dynamic.modules[1:]] == [(), (), ()]
    assert dynamic.paths() == dag.paths()  # the DAG is the same; only who takes 3 differs


def test_branches_load_from_json_and_toml(tmp_path: Path) -> None:
    spec = load_pipeline(write_spec(tmp_path, dag_spec(branches={"3": 0.25})))
    assert spec.module(1).branches == (("3", 0.25),)
    assert spec.routing().splits("1") and not spec.routing().splits("2")
    toml = tmp_path / "p.toml"
    model = dag_spec()[0]["model"]
    toml.write_text(
        f"""name = "t"
slo_ms = 100
[[modules]]
name = "a"
id = 1
model = '{model}'
pres = []
subs = [2, 3]
branches = {{ 2 = 0.5 }}
[[modules]]
name = "b"
id = 2
model = '{model}'
pres = [1]
subs = []
[[modules]]
name = "c"
id = 3
model = '{model}'
pres = [1]
subs = []
"""
    )
    assert load_pipeline(toml).module(1).branches == (("2", 0.5),)


BAD_BRANCHES = [
    # (branches on module 1 of 1 -> {2, 3}, or (module index, branches), message fragment)
    ({"3": 0}, "branches['3']: must be a share in (0, 1), got 0"),
    ({"3": 1.0}, "branches['3']: must be a share in (0, 1), got 1.0"),
    ({"3": 1.5}, "branches['3']: must be a share in (0, 1), got 1.5"),
    ({"3": -0.2}, "branches['3']: must be a share in (0, 1), got -0.2"),
    ({"3": "0.6"}, "branches['3']: must be a share in (0, 1), got '0.6'"),
    ({"3": True}, "branches['3']: must be a share in (0, 1), got True"),
    ({"3": math.nan}, "branches['3']: must be a share in (0, 1), got nan"),
    ({"4": 0.5}, "branches: '4' is not one of its subs ['2', '3']"),
    ({"face": 0.5}, "branches: key 'face' must be the id of one of its subs"),
    ({"3": 0.5, "03": 0.4}, "branches: sub 3 is named twice"),
    ({"2": 0.5, "3": 0.5}, "branches: names every sub ['2', '3']; leave at least one out"),
    ([3, 0.6], "branches: must be an object of sub id -> share, got [3, 0.6]"),
    ((1, {"4": 0.5}), "branches: only a module with several subs splits"),
    ((3, {"4": 0.5}), "branches: only a module with several subs splits"),
]


@pytest.mark.parametrize(("branches", "fragment"), BAD_BRANCHES)
def test_bad_branches_name_the_module_and_the_field(
    tmp_path: Path, branches: Any, fragment: str
) -> None:
    index, value = branches if isinstance(branches, tuple) else (0, branches)
    modules = dag_spec()
    modules[index]["branches"] = value
    path = write_spec(tmp_path, modules)
    with pytest.raises(PipelineSpecError) as exc:
        load_pipeline(path)
    message = str(exc.value)
    assert message.startswith(f"{path}: modules[{index}] ('m{index + 1}', id {index + 1}): ")
    assert fragment in message
    assert isinstance(exc.value, ValueError)


def test_module_config_takes_a_mapping_or_pairs_and_checks_them() -> None:
    def split(branches: Any) -> ModuleConfig:
        return ModuleConfig("1", "a", Path("a.onnx"), subs=("2", "3"), branches=branches)

    assert split({3: 0.5}).branches == split((("3", 0.5),)).branches == (("3", 0.5),)
    assert split({}).branches == ()
    with pytest.raises(PipelineConfigError, match=r"module 1 branches: a sub is named twice"):
        split((("3", 0.5), (3, 0.5)))
    with pytest.raises(PipelineConfigError, match=r"module 1 branches: must map sub ids"):
        split("3")
    with pytest.raises(PipelineConfigError, match=r"module 1 branches\['3'\]: must be a share"):
        split({"3": 2})


# --- the draw and the route of one request ------------------------------------------------------


def test_the_draw_is_fixed_by_request_module_and_sub_and_spreads_evenly() -> None:
    assert branch_draw(b"k", "1", "3") == branch_draw(b"k", "1", "3")
    assert branch_draw(b"k", "1", "3") != branch_draw(b"k", "1", "2")
    draws = np.array([branch_draw(b"%d" % i, "1", "3") for i in range(4000)])
    assert ((draws >= 0) & (draws < 1)).all()
    # Uniform: each decile holds a tenth of the draws, within the binomial bound.
    counts = np.histogram(draws, bins=10, range=(0, 1))[0] / len(draws)
    assert np.abs(counts - 0.1).max() <= binomial_bound(len(draws), 0.1)


@pytest.mark.parametrize(("share", "sub"), [(0.6, "3"), (0.2, "2")])
def test_a_share_is_the_fraction_of_requests_that_take_the_branch(share: float, sub: str) -> None:
    routing = Routing(DAG_SUBS, {"1": {sub: share}})
    n = 4000
    taken = [routing.taken("1", b"request-%d" % i) for i in range(n)]
    other = "2" if sub == "3" else "3"
    assert all(other in t for t in taken)  # the sub without a share: every request
    fraction = sum(sub in t for t in taken) / n
    assert abs(fraction - share) <= binomial_bound(n, share)


def test_the_live_route_key_is_the_requests_identity() -> None:
    seeded = route_key(parse_payload(payload(image_seed=7)))
    assert seeded == route_key(parse_payload(payload(image_seed=7, budget_ms=5)))
    assert seeded != route_key(parse_payload(payload(image_seed=8)))
    frame = payload(input=[[0.5, 0.25], [0.0, 1.0]])
    assert route_key(parse_payload(frame)) == route_key(parse_payload(frame))
    assert route_key(parse_payload(frame)) != route_key(parse_payload(payload(input=[[0.5]])))


def test_without_branches_a_merge_waits_for_every_pre() -> None:
    route = Routing(DAG_SUBS).start()
    assert route.passed("1", ("2", "3")) == (["2", "3"], [])
    assert route.passed("3", ("4",)) == ([], [])  # 4 waits for 2
    assert route.passed("2", ("4",)) == (["4"], [])
    assert route.senders("4") == ("3", "2")


def test_a_skipped_branch_is_never_reached_and_the_merge_waits_only_for_the_other() -> None:
    route = Routing(DAG_SUBS, {"1": {"3": 0.5}}).start()
    assert route.passed("1", ("2",)) == (["2"], ["3"])
    assert route.unreached == {"3"}
    assert route.passed("2", ("4",)) == (["4"], [])
    assert route.senders("4") == ("2",)


def test_a_merge_that_already_has_one_branch_runs_when_the_other_is_cut_later() -> None:
    # 1 -> {2, 5}; 2 -> {3 (share), 4}; 3 -> 6; 5 -> 6: 6 holds 5's branch until 2 decides.
    subs = {"1": ["2", "5"], "2": ["3", "4"], "3": ["6"], "5": ["6"]}
    route = Routing(subs, {"2": {"3": 0.5}}).start()
    assert route.passed("1", ("2", "5")) == (["2", "5"], [])
    assert route.passed("5", ("6",)) == ([], [])
    ready, gone = route.passed("2", ("4",))
    assert (sorted(ready), gone) == (["4", "6"], ["3"])
    assert route.senders("6") == ("5",)


def test_a_later_stage_skips_the_entries_the_stage_before_did_not_take() -> None:
    route = Routing(DAG_SUBS, {"1": {"3": 0.5}}).start()
    assert route.skip(["3"]) == ([], ["3"])
    assert route.passed("2", ("4",)) == (["4"], [])


def test_routing_refuses_shares_of_unknown_modules() -> None:
    with pytest.raises(PipelineConfigError, match="branches: no module has id 9"):
        Routing(DAG_SUBS, {"9": {"3": 0.5}})
    with pytest.raises(ValueError, match=r"module 2 branches: only a module with several subs"):
        Routing(DAG_SUBS, {"2": {"4": 0.5}})


# --- PARD's estimate before and after the split -------------------------------------------------


class PerRequestProfile:
    """d_k = `ms` per request of the batch (dyadic, so the sums below are exact)."""

    def __init__(self, ms: dict[str, float]) -> None:
        self.ms = ms

    def duration_ms(self, module_id: str, batch: int) -> float:
        return self.ms[module_id] * batch


def planners_of(name: str) -> dict[str, StatePlanner]:
    """A planner per module of a shipped DAG, face recognition (3) queueing 0.25 s."""
    graph = load_pipeline(pipeline_path(name)).graph()
    profile = PerRequestProfile({"1": 62.5, "2": 31.25, "3": 31.25, "4": 62.5})
    out = {}
    for m in graph.modules:
        planner = StatePlanner(m, graph, profile, wait_quantile=0.0)
        planner.merge(ModuleState("3", 1, queue_delay_s=0.25, seq=0))
        out[m] = planner
    return out


def test_pard_takes_the_max_over_all_paths_before_the_split_and_the_taken_ones_after() -> None:
    planners = planners_of("dag_dynamic")
    request = PipelineRequest("r", deadline_s=0.42, slo_s=0.42, received_s=0.0)
    # At the split (module 1) no request's path is known yet: PARD §4.2's maximum over the
    # paths that leave it, here the face branch with its queue.
    at_split = create_dropper("pard", planners["1"]).estimate(
        request, planners["1"].context(0.0), 0.0
    )
    assert at_split.path == ("3", "4")
    assert (at_split.sub_queue_s, at_split.sub_exec_s) == (0.25, 0.09375)
    # After it, the pose branch (every request) estimates only the path it takes on: face
    # recognition's queue no longer counts, whether or not the request also took face.
    at_pose = create_dropper("pard", planners["2"]).estimate(
        request, planners["2"].context(0.0), 0.0
    )
    assert at_pose.path == ("4",)
    assert (at_pose.sub_queue_s, at_pose.sub_exec_s) == (0.0, 0.0625)
    at_face = create_dropper("pard", planners["3"]).estimate(
        request, planners["3"].context(0.0), 0.0
    )
    assert at_face.path == ("4",)


def test_pard_estimates_the_dynamic_dag_exactly_as_the_static_one() -> None:
    # Branch shares change who goes where, not the policy objects: the same states give the
    # same estimate at every module of dag and dag_dynamic.
    static, dynamic = planners_of("dag"), planners_of("dag_dynamic")
    request = PipelineRequest("r", deadline_s=0.42, slo_s=0.42, received_s=0.0)
    for m in static:
        a = create_dropper("pard", static[m]).decide(request, static[m].context(0.01), 0.005)
        b = create_dropper("pard", dynamic[m]).decide(request, dynamic[m].context(0.01), 0.005)
        assert a == b


# --- the live executor (fake models) -------------------------------------------------------------


def dag_modules(share: float | None = 0.5) -> tuple[ModuleConfig, ...]:
    """1 -> {2, 3} -> 4, with a `share` of the requests taking 3 (None: every request)."""
    spec = {"1": ((), ("2", "3")), "2": (("1",), ("4",)), "3": (("1",), ("4",))}
    spec["4"] = (("2", "3"), ())
    return tuple(
        ModuleConfig(
            id=m,
            name=f"m{m}",
            model=Path("x.onnx"),
            pres=p,
            subs=s,
            branches={"3": share} if m == "1" and share else {},
        )
        for m, (p, s) in spec.items()
    )


def takes_face(routing: Routing, seed: int) -> bool:
    return "3" in routing.taken("1", route_key(parse_payload(payload(image_seed=seed))))


@pytest.fixture
async def executors():
    made: list[PipelineExecutor] = []

    def make(config: Any, runners: dict) -> PipelineExecutor:
        made.append(PipelineExecutor(config, runners=runners))
        return made[-1]

    yield make
    for ex in made:
        for worker in ex.workers.values():
            worker.runner.gate.set()
        await ex.close()


async def test_a_request_that_skips_a_branch_does_not_wait_for_it(executors):
    runners = {m: FakeRunner() for m in "1234"}
    runners["3"] = FakeRunner(gated=True)  # face recognition never finishes until opened
    ex = executors(make_config(dag_modules(), slo_ms=10_000.0), runners)
    skipper = next(s for s in range(50) if not takes_face(ex.routing, s))
    taker = next(s for s in range(50) if takes_face(ex.routing, s))
    result = json.loads(await ex.execute(payload(image_seed=skipper)))
    assert list(result["modules"]) == ["1", "2", "4"] and list(result["outputs"]) == ["4"]
    assert not ex.batches("3")
    waiting = asyncio.create_task(ex.execute(payload(image_seed=taker)))
    await until(lambda: len(ex.batches("2")) == 2)
    await asyncio.sleep(0.01)
    assert len(ex.batches("4")) == 1  # the merge holds the request for its face branch
    runners["3"].gate.set()
    result = json.loads(await waiting)
    assert list(result["modules"]) == ["1", "2", "3", "4"]
    snap = ex.snapshot()
    assert snap["on_time"] == 2 and snap["in_flight"] == 0
    assert [snap["modules"][m]["requests"] for m in "1234"] == [2, 2, 1, 2]


async def test_a_later_stage_is_entered_at_the_branches_the_request_took(executors):
    runners = {m: FakeRunner() for m in "234"}
    routed = make_config(dag_modules(), slo_ms=10_000.0, local=("2", "3", "4"))
    ex = executors(routed, runners)
    frame = np.zeros((3, 8, 8), dtype=np.float32)
    handoff = handoff_payload(frame, {"2": FULL_REGION}, 5_000.0, 3)
    result = json.loads(await ex.execute(handoff))
    assert list(result["modules"]) == ["2", "4"] and not ex.batches("3")
    # Without branches every entry is still required, as before.
    plain = make_config(dag_modules(None), slo_ms=10_000.0, local=("2", "3", "4"))
    strict = executors(plain, {m: FakeRunner() for m in "234"})
    with pytest.raises(
        BadPayload, match=r"entries: .* entered at modules \['2', '3'\], not \['2'\]"
    ):
        await strict.execute(handoff)


async def test_a_later_stage_none_of_whose_branches_is_taken_is_not_waited_for(executors):
    # 1 -> {2 (here), 3 (another stage, a branch)}: a request that skips 3 ends at 2.
    modules = (
        ModuleConfig("1", "a", Path("a.onnx"), subs=("2", "3"), branches={"3": 0.5}),
        ModuleConfig("2", "b", Path("b.onnx"), pres=("1",)),
        ModuleConfig("3", "c", Path("c.onnx"), pres=("1",)),
    )
    config = make_config(modules, slo_ms=10_000.0, local=("1", "2"), peers={"3": "127.0.0.1:9"})
    ex = executors(config, {m: FakeRunner() for m in "12"})
    skipper = next(s for s in range(50) if not takes_face(ex.routing, s))
    result = json.loads(await ex.execute(payload(image_seed=skipper)))
    assert list(result["modules"]) == ["1", "2"] and list(result["outputs"]) == ["2"]
