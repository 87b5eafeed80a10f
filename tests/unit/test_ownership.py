"""One owner gateway at a time for a central-queueing server, on a lease (fake time)."""

from __future__ import annotations

from taskserver.ownership import MAX_LEASE_S, LeaseDecision, OwnerLease


def test_the_first_claimant_owns_until_its_lease_lapses() -> None:
    lease = OwnerLease()
    assert lease.holder(0.0) is None and lease.admits(None, 0.0)
    assert lease.claim("gw-a", 3.0, now=10.0) == LeaseDecision(True, "gw-a", 3.0)
    # Another gateway is refused, told who owns the server and for how long.
    assert lease.claim("gw-b", 3.0, now=11.0) == LeaseDecision(False, "gw-a", 2.0)
    assert lease.admits("gw-a", 11.0)
    assert not lease.admits("gw-b", 11.0) and not lease.admits(None, 11.0)
    assert lease.remaining_s(11.0) == 2.0
    # At the lease's end the server is free again, and the next claim takes it.
    assert lease.holder(13.0) is None and lease.admits("gw-b", 13.0)
    assert lease.claim("gw-b", 3.0, now=13.0).granted
    assert not lease.admits("gw-a", 13.5)


def test_each_claim_renews_the_owners_lease() -> None:
    lease = OwnerLease()
    for now in (0.0, 1.0, 2.0, 3.0, 4.0):
        assert lease.claim("gw-a", 3.0, now).granted
    assert lease.holder(6.9) == "gw-a"
    assert lease.holder(7.0) is None


def test_release_frees_the_server_at_once_but_only_for_its_owner() -> None:
    lease = OwnerLease()
    lease.claim("gw-a", 3.0, now=0.0)
    assert not lease.release("gw-b")
    assert lease.holder(1.0) == "gw-a"
    assert lease.release("gw-a")
    assert lease.holder(1.0) is None
    assert lease.claim("gw-b", 3.0, now=1.0).granted


def test_a_claim_cannot_hold_a_server_for_ever() -> None:
    lease = OwnerLease()
    assert lease.claim("gw-a", 1e9, now=0.0).remaining_s == MAX_LEASE_S
    assert lease.holder(MAX_LEASE_S) is None
