"""One owner gateway at a time for a server whose queue a gateway holds (central queueing).

A gateway that keeps the central policy queue for a server (edge agents) assumes it has
every slot of that server to itself: it sends a task only when it counts a free slot, and
it decides deadline misses at its own dequeue. A second gateway sending to the same server
would break both assumptions silently. So such a gateway claims the server with each
heartbeat (``status(claim)``): the first claimant holds a lease of ``lease_s``, renewed by
every claim; while the lease is live, claims and tasks from any other gateway are refused
with the owner's id. The lease ends when it is not renewed in time, or at once when the
owner's last connection closes (a gateway that stops lets a standby take over without
waiting). Pure: time comes in as ``now``.

A claim must prove the registration token (which the server and its gateways share), or
anyone who can reach the Thrift port could take the server out of service: each connection
gets a random nonce from the server (``ServerStatus.claim_nonce``), and a claim on that
connection carries ``claim_proof(token, nonce, gateway_id, lease_ms)``, an HMAC-SHA256. The
token never travels, and a proof seen on one connection is worthless on another. A server
without a token takes every claim (registration is then open too).
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass

MAX_LEASE_S = 60.0
"""Longest lease a claim can ask for (a claim cannot hold a server for ever)."""
NONCE_BYTES = 16
_PROOF_CONTEXT = b"tailgate ownership claim v1\x00"


def claim_proof(token: str, nonce: bytes, gateway_id: str, lease_ms: float) -> bytes:
    """The proof a claim carries: HMAC-SHA256 keyed with the token over nonce, id and lease."""
    msg = b"".join(
        (
            _PROOF_CONTEXT,
            struct.pack("!H", len(nonce)),
            nonce,
            struct.pack("!H", len(gateway_id.encode())),
            gateway_id.encode(),
            struct.pack("!d", lease_ms),
        )
    )
    return hmac.new(token.encode(), msg, hashlib.sha256).digest()


def proof_matches(
    token: str, nonce: bytes, gateway_id: str, lease_ms: float, proof: bytes | None
) -> bool:
    """Whether `proof` is the claim's proof for this token and connection nonce."""
    if proof is None or not nonce:
        return False
    return hmac.compare_digest(proof, claim_proof(token, nonce, gateway_id, lease_ms))


@dataclass(frozen=True, slots=True)
class LeaseDecision:
    """The answer to a claim: who owns the server now and for how much longer."""

    granted: bool
    owner: str
    remaining_s: float


class OwnerLease:
    """The current owner of a server's slots and when its lease lapses."""

    __slots__ = ("_expires_s", "_owner")

    def __init__(self) -> None:
        self._owner: str | None = None
        self._expires_s = 0.0

    def holder(self, now: float) -> str | None:
        """The owning gateway's id while its lease is live, else None."""
        if self._owner is not None and now < self._expires_s:
            return self._owner
        return None

    def remaining_s(self, now: float) -> float:
        """Seconds left on the live lease (0 without one)."""
        return max(self._expires_s - now, 0.0) if self.holder(now) is not None else 0.0

    def claim(self, gateway_id: str, lease_s: float, now: float) -> LeaseDecision:
        """Grant or renew the lease to gateway_id unless another gateway holds a live one."""
        holder = self.holder(now)
        if holder is not None and holder != gateway_id:
            return LeaseDecision(False, holder, self._expires_s - now)
        lease_s = min(max(lease_s, 0.0), MAX_LEASE_S)
        self._owner, self._expires_s = gateway_id, now + lease_s
        return LeaseDecision(True, gateway_id, lease_s)

    def release(self, gateway_id: str) -> bool:
        """End gateway_id's lease now (its connection closed); False if it held none."""
        if self._owner != gateway_id:
            return False
        self._owner, self._expires_s = None, 0.0
        return True

    def admits(self, gateway_id: str | None, now: float) -> bool:
        """Whether a task from this gateway (None: one that never claimed) may be queued."""
        holder = self.holder(now)
        return holder is None or holder == gateway_id
