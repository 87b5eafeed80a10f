"""How `tailgate up` lays out the edge testbed: dense processes, seeds, the time scale."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from deploy.config import load_config
from deploy.launcher import (
    UpOptions,
    edge_cluster,
    edge_groups,
    edge_seed,
    edge_specs,
    time_scaled,
)

REPO = Path(__file__).resolve().parents[2]
URL = "http://127.0.0.1:8080"


def _arg(argv: tuple[str, ...], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_groups_never_mix_clusters_and_cover_every_agent_once() -> None:
    assert edge_groups(32, 8) == [range(0, 8), range(8, 16), range(16, 24), range(24, 32)]
    assert edge_groups(32, 1) == [range(i, i + 1) for i in range(32)]
    assert edge_groups(32, 6) == [
        range(0, 6), range(6, 8), range(8, 14), range(14, 16),
        range(16, 22), range(22, 24), range(24, 30), range(30, 32),
    ]  # fmt: skip
    for count, per in ((6, 4), (13, 5), (32, 100), (1, 8), (0, 8)):
        groups = edge_groups(count, per)
        assert [i for g in groups for i in g] == list(range(count))
        for g in groups:
            assert len(g) <= per and len({edge_cluster(i, count) for i in g}) == 1


def test_dense_specs_start_the_agents_separate_ones_would_be() -> None:
    cfg = load_config(REPO / "deploy" / "saas.toml", env={})
    opts = UpOptions(
        servers=0,
        edge_agents=32,
        agents_per_process=8,
        edge_read_sample=0.05,
        edge_seed=2,
        policy="fifo",
        metrics=True,
    )
    specs = edge_specs(cfg, opts, URL, "tok", metrics_base=0)
    assert [s.servers for s in specs] == [8, 8, 8, 8]
    assert sum(s.servers for s in specs) == 32
    second = specs[1].argv
    assert (_arg(second, "--id"), _arg(second, "--count"), _arg(second, "--first")) == (
        "edge", "8", "9",
    )  # fmt: skip
    assert _arg(second, "--cluster") == _arg(second, "--profile") == "wet-lab"
    assert _arg(second, "--db").endswith("edge-9.db")  # the store of its first agent
    assert _arg(second, "--seed") == str(edge_seed(opts, 8)) == "1009"
    assert _arg(second, "--read-sample") == "0.05" and _arg(second, "--policy") == "fifo"
    assert _arg(second, "--metrics-port") == "8188"  # gateway port + 100 + its first index
    # One agent per process: the same agents, each a process of its own, as before.
    single = edge_specs(cfg, dataclasses.replace(opts, agents_per_process=1), URL, "tok", 0)
    assert len(single) == 32 and all(s.servers == 1 for s in single)
    assert _arg(single[8].argv, "--id") == "edge-9" and "--count" not in single[8].argv
    assert _arg(single[8].argv, "--seed") == "1009"


def test_default_seed_is_the_agents_number() -> None:
    opts = UpOptions(edge_agents=4)
    assert [edge_seed(opts, i) for i in range(4)] == [1, 2, 3, 4]


def test_time_scale_stretches_slos_grace_and_the_edge_prior() -> None:
    gw = load_config(REPO / "deploy" / "saas.toml", env={}).gateway
    scaled = time_scaled(gw, 4.0)
    assert [c.latency_ms for c in scaled.classes] == [4 * c.latency_ms for c in gw.classes]
    assert scaled.grace_ms == 4 * gw.grace_ms
    edge, scaled_edge = gw.pool_named("edge"), scaled.pool_named("edge")
    assert edge is not None and scaled_edge is not None
    assert scaled_edge.prior.scale == 4 * edge.prior.scale
    assert scaled_edge.prior_overhead_ms == 4 * edge.prior_overhead_ms
    assert scaled.pool_named("default") == gw.pool_named("default")


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"agents_per_process": 0}, "--agents-per-process: must be 1..512, got 0"),
        ({"edge_read_sample": 2.0}, "--edge-read-sample: must be in [0, 1], got 2.0"),
        ({"edge_time_scale": 0.0}, "--edge-time-scale: must be in [0.01, 100], got 0.0"),
        ({"edge_seed": 0}, "--edge-seed: must be 1..1000000, got 0"),
        (
            {"edge_profiles": False, "edge_read_sample": 0.5},
            "--no-edge-profiles: --edge-read-sample below 1",
        ),
    ],
)
def test_bad_edge_options_are_named(kw: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError) as info:
        UpOptions(edge_agents=4, **kw).validate()  # type: ignore[arg-type]
    assert str(info.value).startswith(message)
