"""The pure parts of the network fault tools: which mechanism each fault gets, the
delayer's per-packet draws and its netlink message layout (tests/integration/
test_netns_faults.py drives them for real)."""

from __future__ import annotations

import random
import struct

import pytest

from loadtests.netfaults import FAULT_KINDS, Support
from loadtests.nfqueue import NFQA_PACKET_HDR, HoldPolicy, _attr, _packet_id


def test_without_netem_faults_are_built_from_iptables_and_nfqueue() -> None:
    s = Support(
        None,
        iptables="iptables",
        iptables_problem=None,
        netem=False,
        netem_problem="no netem",
        nfqueue_problem=None,
    )
    assert {k: s.mechanism(k) for k in FAULT_KINDS} == {
        "delay": "NFQUEUE + loadtests.nfqueue",
        "reorder": "NFQUEUE + loadtests.nfqueue",
        "loss": "iptables -m statistic DROP",
        "partition": "iptables DROP",
        "link-down": "ip link set down",
    }


def test_netem_is_used_where_the_kernel_has_it() -> None:
    s = Support(None, iptables=None, iptables_problem="none", netem=True, netem_problem=None)
    assert s.mechanism("delay") == "netem" and s.mechanism("loss") == "netem loss"
    assert s.mechanism("partition") == "tc pfifo limit 0"  # no iptables: a FIFO of size 0


def test_what_cannot_be_made_says_why() -> None:
    bare = Support(None, iptables_problem="no iptables", netem_problem="kernel: unknown qdisc")
    assert bare.missing("delay") == ("no netem (kernel: unknown qdisc) and no NFQUEUE (not probed)")
    assert "no iptables" in str(bare.missing("loss"))
    assert bare.missing("partition") is None and bare.missing("link-down") is None
    not_root = Support("not root")
    assert all(not_root.missing(k) == "not root" for k in FAULT_KINDS)
    with pytest.raises(ValueError, match="fault kind must be one of"):
        bare.missing("jitter")


def test_holds_are_delay_plus_uniform_jitter_and_a_share_held_longer() -> None:
    rng = random.Random(7)
    policy = HoldPolicy(delay_ms=20.0, jitter_ms=5.0, reorder=0.25, gap_ms=30.0)
    draws = [policy.draw_s(rng) for _ in range(20_000)]
    late = [h for h, is_late in draws if is_late]
    on_time = [h for h, is_late in draws if not is_late]
    assert 0.23 < len(late) / len(draws) < 0.27
    assert min(on_time) >= 0.015 and max(on_time) <= 0.025
    assert min(late) >= 0.045 and max(late) <= 0.055
    with pytest.raises(ValueError, match="reorder: must be a share"):
        HoldPolicy(reorder=1.5)
    with pytest.raises(ValueError, match="delay_ms"):
        HoldPolicy(delay_ms=-1.0)


def test_the_packet_id_is_read_from_its_attribute_wherever_it_sits() -> None:
    other = _attr(9, b"\x01\x02\x03")  # padded to 4 bytes
    hdr = _attr(NFQA_PACKET_HDR | 0x4000, struct.pack(">IHB", 4242, 0x0800, 1))
    body = other + hdr
    assert len(other) == 8
    assert _packet_id(body, 0, len(body)) == 4242
    assert _packet_id(other, 0, len(other)) is None
