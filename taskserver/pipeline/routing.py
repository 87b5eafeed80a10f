"""Request-specific paths through a DAG pipeline: branch shares, the draw, merges and ends.

A split module (several ``subs``) may name some of its subs in ``branches``, each with the
share of requests that take that branch (``{"3": 0.6}``); the subs it leaves out are taken
by every request. At least one sub must be left out, so every request goes on somewhere and
each named share is exactly the probability of its branch (a fallback for a draw that
selects nothing would skew the share of the sub it falls back to).

Which requests take a branch. In a real pipeline the split module's output decides (a frame
without a visible face skips face recognition). The synthetic models' outputs carry no such
meaning, so a stand-in decides instead: a hash of the request's route key, the module id and
the sub id gives a number u, uniform in [0, 1), and the branch is taken when u < share
(`branch_draw`). The live route key is the request's identity (`route_key`: its
``image_seed``, or a digest of the frame it carries), so a request takes the same branches
every time it is sent; the simulator keys the same draw by its seed and the request's index,
so a request takes the same branches under every dropping policy. The draw is made when the
split module hands the request on, never before: that is when content-dependent routing
would know the path, so PARD's estimate at the split itself is still the maximum over all
its downstream paths (§4.2), and after the split each branch module only estimates the
paths that leave it, all of which the request takes up to the next split.

Merge and completion (`RouteState`). An edge pre -> sub is *sent* when pre hands the
request to sub, *cut* when pre did not take that branch or pre itself is never reached; a
module is never reached once all of its incoming edges are cut. A merge runs once every
incoming edge is sent or cut and at least one was sent, so it waits only for the branches
the request took. A request is complete when every sink is finished or never reached.
Without ``branches`` every edge is sent, and this is the plain rule: a merge waits for all of
its pres, a request for all of its sinks.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from taskserver.pipeline.errors import PipelineConfigError

if TYPE_CHECKING:
    from taskserver.pipeline.tensors import RequestInput

__all__ = ["RouteState", "Routing", "branch_draw", "check_branches", "route_key"]


def check_branches(
    module_id: str, subs: Sequence[str], branches: Mapping[str, object]
) -> tuple[tuple[str, float], ...]:
    """A split module's ``branches`` as (sub id, share) pairs in ``subs`` order.

    The rules, stated once: only a module with several subs has branches; each names one of
    its subs with a share in (0, 1); at least one sub is left out (taken by every request).
    PipelineConfigError names the module and the field.
    """
    if not branches:
        return ()
    where = f"module {module_id} branches"
    if len(subs) < 2:
        raise PipelineConfigError(
            f"{where}: only a module with several subs splits, this one has subs {list(subs)}"
        )
    shares: dict[str, float] = {}
    for sub, share in branches.items():
        key = str(sub)
        if key not in subs:
            raise PipelineConfigError(f"{where}: {key!r} is not one of its subs {list(subs)}")
        if key in shares:
            raise PipelineConfigError(f"{where}: sub {key!r} is named twice")
        if (
            isinstance(share, bool)
            or not isinstance(share, int | float)
            or not math.isfinite(share)
            or not 0.0 < share < 1.0
        ):
            raise PipelineConfigError(
                f"{where}[{key!r}]: must be a share in (0, 1), got {share!r} "
                f"(leave a sub that every request takes out of branches)"
            )
        shares[key] = float(share)
    if len(shares) == len(subs):
        raise PipelineConfigError(
            f"{where}: names every sub {list(subs)}; leave at least one out (taken by every "
            f"request), so that every request goes on"
        )
    return tuple((s, shares[s]) for s in subs if s in shares)


def branch_draw(key: bytes, module_id: str, sub_id: str) -> float:
    """A number in [0, 1), fixed by (key, module, sub): the stand-in for a request's content."""
    data = b"%s\x00%s\x00%s" % (key, module_id.encode(), sub_id.encode())
    digest = hashlib.blake2b(data, digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def route_key(request: RequestInput) -> bytes:
    """The identity a live request's branches are drawn from: its seed, or its frame's digest."""
    array = request.array
    if array is None:
        return b"image_seed:%d" % (request.seed or 0)
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{array.dtype.str}{array.shape}".encode())
    h.update(memoryview(array.tobytes()))
    return b"frame:" + h.digest()


class Routing:
    """A pipeline's DAG with its branch shares: which subs a request takes, and its RouteState."""

    __slots__ = ("pres", "routed", "shares", "subs")

    def __init__(
        self,
        subs: Mapping[str, Sequence[str]],
        branches: Mapping[str, Mapping[str, float]] | None = None,
    ) -> None:
        self.subs: dict[str, tuple[str, ...]] = {
            str(m): tuple(map(str, s)) for m, s in subs.items()
        }
        for succ in list(self.subs.values()):
            for s in succ:
                self.subs.setdefault(s, ())
        self.pres: dict[str, tuple[str, ...]] = {m: () for m in self.subs}
        for m, succ in self.subs.items():
            for s in succ:
                self.pres[s] = (*self.pres[s], m)
        self.shares: dict[str, dict[str, float]] = {}
        for m, b in (branches or {}).items():
            if str(m) not in self.subs:
                raise PipelineConfigError(f"branches: no module has id {m}")
            pairs = check_branches(str(m), self.subs[str(m)], b)
            if pairs:
                self.shares[str(m)] = dict(pairs)
        self.routed = bool(self.shares)  # any branches (else every request takes every path)

    def splits(self, module_id: str) -> bool:
        """Whether `module_id` has branches, so its subs depend on the request."""
        return module_id in self.shares

    def taken(self, module_id: str, key: bytes) -> tuple[str, ...]:
        """The subs of `module_id` the request with route key `key` takes, in ``subs`` order."""
        shares = self.shares.get(module_id)
        subs = self.subs[module_id]
        if not shares:
            return subs
        return tuple(
            s for s in subs if s not in shares or branch_draw(key, module_id, s) < shares[s]
        )

    def start(self) -> RouteState:
        """The route of a new request, before any module handed it on."""
        return RouteState(self)


class RouteState:
    """One request's progress through the DAG: who sent it where, what it will never reach."""

    __slots__ = ("_cut", "_routing", "_sent", "key", "unreached")

    def __init__(self, routing: Routing) -> None:
        self._routing = routing
        self._sent: dict[str, list[str]] = {}  # module -> the pres that handed it the request
        self._cut: dict[str, int] = {}  # module -> incoming edges cut
        self.unreached: set[str] = set()  # modules the request will never reach
        self.key: bytes | None = None  # its route key, once a split needs it (the shell's)

    def passed(self, module_id: str, taken: Collection[str]) -> tuple[list[str], list[str]]:
        """`module_id` handed the request to `taken`, some of its subs.

        Returns the modules now ready to run (each once: every incoming edge sent or cut, at
        least one sent) and the modules now known never to be reached.
        """
        touched: list[str] = []
        gone: list[str] = []
        for sub in self._routing.subs[module_id]:
            if sub in taken:
                self._sent.setdefault(sub, []).append(module_id)
                touched.append(sub)
            else:
                self._cut_edge(sub, touched, gone)
        return self._ready(touched), gone

    def skip(self, module_ids: Iterable[str]) -> tuple[list[str], list[str]]:
        """Modules the stage before did not hand the request to: never reached (as `passed`)."""
        touched: list[str] = []
        gone: list[str] = []
        for m in module_ids:
            if m not in self.unreached:
                self._unreach(m, touched, gone)
        return self._ready(touched), gone

    def senders(self, module_id: str) -> tuple[str, ...]:
        """The modules that handed the request to `module_id`, in the order they did."""
        return tuple(self._sent.get(module_id, ()))

    def _cut_edge(self, sub: str, touched: list[str], gone: list[str]) -> None:
        cut = self._cut[sub] = self._cut.get(sub, 0) + 1
        touched.append(sub)
        if cut == len(self._routing.pres[sub]):
            self._unreach(sub, touched, gone)

    def _unreach(self, module_id: str, touched: list[str], gone: list[str]) -> None:
        self.unreached.add(module_id)
        gone.append(module_id)
        for sub in self._routing.subs[module_id]:
            self._cut_edge(sub, touched, gone)

    def _ready(self, touched: list[str]) -> list[str]:
        pres = self._routing.pres
        ready = []
        for m in dict.fromkeys(touched):
            sent = self._sent.get(m)
            if sent and m not in self.unreached and len(sent) + self._cut.get(m, 0) == len(pres[m]):
                ready.append(m)
        return ready
