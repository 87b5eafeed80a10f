"""`tailgate live run|maxload --pick`: the override reaches the replay and the simulator."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import loadtests.live as live
from loadtests.live import LiveMaxLoad, _pool_tasks
from loadtests.sim.scenario import load_scenario
from loadtests.sim.tailbench import TAILBENCH_DIR

REPO = Path(__file__).resolve().parents[2]
SCENARIO = str(REPO / "loadtests" / "scenarios" / "least-wait.toml")
TABLE = str(TAILBENCH_DIR / "masstree_quantiles.txt")


class _FakeRun:
    valid = True

    def to_text(self) -> str:
        return "fake run"


@pytest.fixture(autouse=True)
def _keep_sigterm(monkeypatch) -> None:
    """main() installs a SIGTERM handler for a real replay; not in the test process."""
    monkeypatch.setattr(live.signal, "signal", lambda *args: None)


def test_pick_overrides_the_scenarios_pick_for_a_replay(monkeypatch, capsys) -> None:
    seen: list[Any] = []

    def fake_run_live(scn, load, **opts):
        seen.append((scn, load, opts))
        return _FakeRun()

    monkeypatch.setattr(live, "run_live", fake_run_live)
    argv = ["run", SCENARIO, "--load", "0.3", "--queries", "50", "--service-quantiles", TABLE]
    assert live.main([*argv, "--pick", "random"]) == 0
    assert live.main(argv) == 0
    (scn, load, _), (default, _, _) = seen
    assert scn.run.pick == "random" and default.run.pick == "least-wait"
    assert load == 0.3 and scn.run.queries == 50
    assert capsys.readouterr().out.count("fake run") == 2


def test_pick_reaches_the_max_load_search(monkeypatch, capsys) -> None:
    picks: list[str] = []

    def fake_max_load(scn, policy, **kw):
        picks.append(scn.run.pick)
        return LiveMaxLoad(policy, 0.5, (0.5, 0.52), 0.6, (0.6, 0.62), [], scn.run.pick)

    monkeypatch.setattr(live, "live_max_load", fake_max_load)
    argv = ["maxload", SCENARIO, "--service-quantiles", TABLE]
    assert live.main([*argv, "--pick", "random"]) == 0
    assert live.main([*argv, "--pick", "least-wait"]) == 0
    assert picks == ["random", "least-wait"]
    out = capsys.readouterr().out
    assert "tf-edfq, random pick: live max load 0.500" in out
    assert "tf-edfq, least-wait pick: live max load 0.500" in out


def test_an_unknown_pick_is_refused(capsys) -> None:
    with pytest.raises(SystemExit):
        live.main(
            ["run", SCENARIO, "--load", "0.3", "--pick", "fastest", "--service-quantiles", TABLE]
        )
    assert "invalid choice: 'fastest'" in capsys.readouterr().err


def test_tasks_per_pool_count_the_tasks_that_ran() -> None:
    scn = load_scenario(SCENARIO)
    answers = [
        {"tasks": [{"server": "em-1-1", "status": "ok"}, {"server": "em-4-3", "status": "ok"}]},
        {
            "tasks": [
                {"server": "em-2-25", "status": "ok"},
                {"server": "em-3-1", "status": "failed"},
            ]
        },
        None,
        {"error": "rejected"},
    ]
    assert _pool_tasks(scn, answers, 25) == pytest.approx({"fast": 2 / 3, "slow": 1 / 3})
    plain = load_scenario(REPO / "loadtests" / "scenarios" / "fanout-single-class.toml")
    assert _pool_tasks(plain, answers, 25) == {}
