"""API answers speak wall-clock time: the shell turns the policies' monotonic seconds."""

from __future__ import annotations

from gateway.app import wall_clock


def test_monotonic_times_become_unix_seconds_with_the_monotonic_value_beside() -> None:
    snapshot = {
        "now": 100.0,
        "rule": "reject-all",
        "overloaded_since": None,
        "replicas": {"min": 1, "now": 3},  # a count, left alone
        "decisions": [{"time": 90.5, "action": "admit"}],
        "policy_state": {"now": 100.0, "decisions": [{"time": 99.0, "in_use": 2}]},
        "actions": [{"time_s": 95.25, "from": 1, "to": 2}],
    }
    out = wall_clock(snapshot, 1_700_000_000.0)
    assert out["now"] == 1_700_000_100.0 and out["now_monotonic_s"] == 100.0
    assert out["overloaded_since"] is None
    assert out["replicas"] == {"min": 1, "now": 3}
    assert out["decisions"][0] == {
        "time": 1_700_000_090.5, "time_monotonic_s": 90.5, "action": "admit"
    }  # fmt: skip
    assert out["policy_state"]["decisions"][0]["time"] == 1_700_000_099.0
    assert out["actions"][0]["time_s"] == 1_700_000_095.25
    assert snapshot["now"] == 100.0  # the policy's own snapshot is not changed
