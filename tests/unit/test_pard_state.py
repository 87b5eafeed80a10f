"""State Planner pieces: the linear-weighted window, w_k, snapshots/merge, the graph."""

from __future__ import annotations

import math
import random

import pytest

from taskserver.pard import (
    LinearWeightedWindow,
    ModuleState,
    PipelineGraph,
    StateExchange,
    StatePlanner,
    UnknownModule,
    WaitSketch,
    quantile,
    sample_aggregate_waits,
    uniform_fractions,
)


class TableProfile:
    """duration_ms from a {module: ms at batch 1} table, growing 10% per extra request."""

    def __init__(self, base_ms: dict[str, float]) -> None:
        self.base_ms = base_ms

    def duration_ms(self, module_id: str, batch: int) -> float:
        return self.base_ms[module_id] * (1 + 0.1 * (batch - 1))


# ---- linear-weighted window ------------------------------------------------------------------


def test_linear_weighted_window_by_hand() -> None:
    window = LinearWeightedWindow(5.0)
    window.record(10.0, now=0.0)
    window.record(20.0, now=2.0)
    window.record(40.0, now=4.0)
    # At 4.0: weights 1 - 4/5 = 0.2, 1 - 2/5 = 0.6, 1 -> (2 + 12 + 40) / 1.8 = 30
    assert window.mean(4.0) == pytest.approx(30.0)
    # At 5.5: the sample of 0.0 is 5.5 s old (gone); weights 0.3, 0.7 -> (6 + 28) / 1.0 = 34
    assert window.mean(5.5) == pytest.approx(34.0)
    assert len(window) == 2
    # At 9.0 the newest is exactly 5 s old: weight 0, evicted.
    assert window.mean(9.0) == 0.0
    assert len(window) == 0


def test_linear_weighted_window_rejects_bad_width() -> None:
    with pytest.raises(ValueError, match=r"window_s.*0"):
        LinearWeightedWindow(0)


# ---- quantile and the aggregated batch wait ----------------------------------------------------


def test_quantile_is_the_inverse_empirical_cdf() -> None:
    samples = [0.5, 0.1, 0.3, 0.2, 0.4, 0.9, 0.7, 0.6, 0.8, 1.0]
    assert quantile(samples, 0.1) == 0.1  # F(0.1) = 0.1
    assert quantile(samples, 0.25) == 0.3  # F(0.2) = 0.2 < 0.25 <= F(0.3)
    assert quantile(samples, 0.5) == 0.5
    assert quantile(samples, 0.0) == 0.1
    assert quantile(samples, 1.0) == 1.0
    assert quantile([float(i) for i in range(30)], 0.1) == 2.0  # rank 3, despite 0.1 * 30 > 3
    with pytest.raises(ValueError, match=r"1.5"):
        quantile(samples, 1.5)


def test_aggregate_wait_of_known_distributions() -> None:
    # B waits half its 20 ms every time; C's wait is uniform on [0, 40 ms].
    # Sum = 10 ms + U[0, 40 ms]: the 0.1-quantile is 10 + 4 = 14 ms.
    modules = [(0.020, (0.5, 0.5)), (0.040, uniform_fractions())]
    waits = sample_aggregate_waits(modules, 10_000, random.Random(7))
    assert min(waits) >= 0.010 and max(waits) <= 0.050
    assert quantile(waits, 0.1) == pytest.approx(0.014, abs=5e-4)


def irwin_hall_cdf(n: int, x: float) -> float:
    terms = ((-1) ** k * math.comb(n, k) * (x - k) ** n for k in range(int(x) + 1))
    return sum(terms) / math.factorial(n)


def irwin_hall_quantile(n: int, q: float) -> float:
    lo, hi = 0.0, float(n)
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if irwin_hall_cdf(n, mid) < q else (lo, mid)
    return lo


@pytest.mark.parametrize(("modules", "share"), [(4, 0.31), (3, 0.28), (2, 0.22), (1, 0.10)])
def test_uniform_prior_reproduces_the_worked_example(modules: int, share: float) -> None:
    # §4.2, equal durations d, lambda = 0.1: w = 0.31 * 4d, 0.28 * 3d, 0.22 * 2d, 0.10 * d. With
    # W_i uniform on [0, d], the sum is Irwin-Hall: its exact 0.1-quantile, as a share of the
    # sum of durations, rounds to the paper's two digits.
    exact = irwin_hall_quantile(modules, 0.1)
    assert round(exact / modules, 2) == share
    waits = sample_aggregate_waits([(1.0, uniform_fractions())] * modules, 10_000, random.Random(0))
    assert quantile(waits, 0.1) == pytest.approx(exact, abs=0.02)


def test_wait_sketch_quantiles_of_recorded_fractions() -> None:
    sketch = WaitSketch(max_samples=5, points=3)
    assert sketch.fractions() == ()
    for wait_s in (0.00, 0.01, 0.02, 0.03, 0.04, 0.05):  # the first falls out (max_samples=5)
        sketch.record(wait_s, duration_s=0.04)  # fractions clipped to [0, 1]
    assert sketch.fractions() == pytest.approx((0.25, 0.75, 1.0))


# ---- planner, snapshots, exchange -------------------------------------------------------------


def chain_planner(**kwargs: object) -> StatePlanner:
    profile = TableProfile({"A": 30.0, "B": 20.0, "C": 40.0})
    return StatePlanner("A", PipelineGraph.chain("A", "B", "C"), profile, **kwargs)


def test_planner_sums_downstream_state_and_w_k() -> None:
    planner = chain_planner()
    b_state = ModuleState("B", 1, queue_delay_s=0.02, wait_fractions=(0.5, 0.5), seq=0)
    assert planner.merge(b_state)
    assert planner.merge(ModuleState("C", 1, queue_delay_s=0.01, wait_fractions=(0.25,) * 2, seq=0))
    (path,) = planner.refresh()
    assert path.path == ("B", "C")
    assert path.queue_s == pytest.approx(0.03)
    assert path.exec_s == pytest.approx(0.06)
    assert path.wait_s == pytest.approx(0.02)  # 0.5 * 20 ms + 0.25 * 40 ms, every draw
    assert path.samples == 10_000
    # A larger batch at C lengthens d_C (40 -> 52 ms) and rescales its waits with it.
    planner.merge(ModuleState("C", 4, queue_delay_s=0.01, wait_fractions=(0.25, 0.25), seq=1))
    assert planner.downstream()[0].exec_s == pytest.approx(0.072)  # without a refresh
    assert planner.refresh()[0].wait_s == pytest.approx(0.01 + 0.013)


def test_merge_keeps_the_newest_and_accepts_a_restarted_module() -> None:
    planner = chain_planner()
    assert planner.merge(ModuleState("B", 2, seq=5))
    assert not planner.merge(ModuleState("B", 3, seq=5))  # not newer
    assert not planner.merge(ModuleState("B", 3, seq=4))
    assert planner.state("B").batch_size == 2
    assert planner.merge(ModuleState("B", 8, seq=0, incarnation=1))  # restarted: seq from 0
    assert planner.state("B").batch_size == 8
    assert not planner.merge(ModuleState("A", 8, seq=99))  # our own state is not taken
    with pytest.raises(UnknownModule, match="'Z'"):
        planner.merge(ModuleState("Z", 1, seq=0))


def test_snapshot_publishes_own_queue_delay_and_waits() -> None:
    planner = chain_planner()
    planner.set_batch_size(4)
    planner.record_queue_delay(0.010, now=0.0)
    planner.record_queue_delay(0.030, now=5.0)  # the first now weighs 0
    planner.record_batch_wait(0.0195)  # d_A(4) = 39 ms: fraction 0.5
    first = planner.snapshot(now=5.0)
    assert (first.module_id, first.batch_size, first.seq) == ("A", 4, 0)
    assert first.queue_delay_s == pytest.approx(0.030)
    assert first.wait_fractions == pytest.approx((0.5,) * 21)
    assert planner.snapshot(now=5.0).seq == 1


def test_state_exchange_publishes_at_most_once_per_period() -> None:
    planner = chain_planner()
    exchange = StateExchange(period_s=1.0)
    sent = [t for t in (0.0, 0.4, 0.99, 1.0, 1.5, 2.2, 2.3) if exchange.publish(planner, t)]
    assert sent == [0.0, 1.0, 2.2]
    assert exchange.last_published_s == 2.2
    with pytest.raises(ValueError, match=r"period_s.*-1"):
        StateExchange(-1)


def test_bad_planner_settings_and_states() -> None:
    with pytest.raises(ValueError, match=r"wait_quantile.*1.5"):
        chain_planner(wait_quantile=1.5)
    with pytest.raises(ValueError, match=r"wait_samples.*0"):
        chain_planner(wait_samples=0)
    with pytest.raises(UnknownModule):
        StatePlanner("Q", PipelineGraph.chain("A"), TableProfile({"A": 1.0}))
    with pytest.raises(ValueError, match="wait_fractions"):
        ModuleState("B", 1, wait_fractions=(0.5, 0.2))
    with pytest.raises(ValueError, match="queue_delay_s"):
        ModuleState("B", 1, queue_delay_s=-0.1)


def test_graph_paths_of_a_dag() -> None:
    # da-like DAG: A -> {B, C} -> D
    graph = PipelineGraph.from_subs({"A": ["B", "C"], "B": ["D"], "C": ["D"]})
    assert graph.paths == (("A", "B", "D"), ("A", "C", "D"))
    assert graph.downstream_paths("A") == (("B", "D"), ("C", "D"))
    assert graph.downstream_paths("D") == ((),)
    assert graph.paths_through("C") == (("A", "C", "D"),)
    with pytest.raises(ValueError, match="cycle"):
        PipelineGraph.from_subs({"A": ["B"], "B": ["C"], "C": ["B"]})
    with pytest.raises(UnknownModule):
        graph.downstream_paths("X")


def test_graph_from_a_spec_with_integer_ids() -> None:
    class Spec:
        def paths(self) -> tuple[tuple[int, ...], ...]:
            return ((1, 2, 4), (1, 3, 4))

    graph = PipelineGraph.from_spec(Spec())
    assert graph.modules == ("1", "2", "4", "3")
    assert graph.downstream_paths("1") == (("2", "4"), ("3", "4"))


def test_a_duration_scale_stretches_d_k_here_and_after_an_exchange() -> None:
    planner = chain_planner()
    planner.set_duration_scale(1.5)
    assert planner.duration_s("A") == pytest.approx(0.045)  # 30 ms profiled x 1.5
    assert planner.profiled_s("A") == pytest.approx(0.030)
    assert planner.snapshot(now=0.0).duration_scale == 1.5
    assert planner.downstream()[0].exec_s == pytest.approx(0.060)
    # C reports that its batches run twice their profile: the path B -> C grows by 40 ms
    assert planner.merge(ModuleState("C", 1, seq=0, duration_scale=2.0))
    assert planner.downstream()[0].exec_s == pytest.approx(0.100)
    with pytest.raises(ValueError, match="duration_scale"):
        ModuleState("C", 1, duration_scale=0.0)
