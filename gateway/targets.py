"""Pool and cluster membership, and the pick of a query's k_f target servers.

A query names explicit servers, or a pool with ``fanout`` k (k random servers, or in a pool
with ``pick = "least-wait"`` the k with the smallest estimated queue wait), ``all``
or ``per_cluster`` k (k random servers from each cluster); ``cluster`` narrows a pool pick
to one cluster and ``exclude_cluster`` leaves one out. Random picks prefer live servers.

A pool scaled by Swayam routes by its ordered backend prefix (Swayam §4.4, Algorithm 1
lines 1 and 8-10): every gateway orders the pool's live servers the same way
(`admission.backend_order`: natural order of their ids, which the local actuator numbers in
start order and a StatefulSet by pod ordinal) and sends ``fanout`` k only to k random
servers among the first max(n, k), n being its policy's backends in use. The servers beyond
the prefix get no new task, go idle and retire after their idle timeout (passive scale-in);
a new server enters the prefix only once its link is up (warm).

A pool with ``dispatch = "retry"`` (Swayam §4.5, random dispatch with retries) re-targets a
task its server sends back busy: `BusyRetry` decides whether and when (Δ after the refusal,
before the SLO), and `TargetPicker.replacement` picks another random server of the query's
scope, in the prefix first, that holds no task of the query.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

from admission import backend_order
from gateway.config import GatewayConfig, PoolConfig
from gateway.errors import BadRequest, Unavailable
from gateway.fanout import sample
from gateway.links import TaskLink
from gateway.requests import Targets
from gateway.retry_after import servers_back_s
from taskserver.config import BUSY_PREFIX


@dataclass(frozen=True, slots=True)
class RetryDecision:
    """What becomes of a task its server sent back REJECTED."""

    action: str
    """`fail`: the rejection stands, as in a queue pool; `retry`: send the task to another
    server at `at_s`; `hold`: a retry would come at or past the query's SLO, so none is
    made and the query ends as any query still running at its SLO does (`_slo_passed`)."""
    at_s: float = 0.0
    """When to send it again (gateway clock), for `retry`."""


_FAIL = RetryDecision("fail")
_HOLD = RetryDecision("hold")


class BusyRetry:
    """Swayam's random dispatch with retries (§4.5): a busy backend sends the request back
    and the frontend tries another random backend, at least Δ after the last try of the
    same request so that a transient overload does not become a storm of messages."""

    __slots__ = ("delay_s",)

    def __init__(self, retry_delay_ms: float) -> None:
        self.delay_s = retry_delay_ms / 1000.0
        """Δ, in seconds."""

    @classmethod
    def of(cls, pool: PoolConfig) -> BusyRetry | None:
        """The pool's retry policy; None for a `dispatch = "queue"` pool."""
        return cls(pool.retry_delay_ms) if pool.dispatch == "retry" else None

    def decide(self, error: str | None, now: float, slo_deadline_s: float) -> RetryDecision:
        """A task was sent back REJECTED with `error` at `now`; its query's SLO ends at
        `slo_deadline_s`. Only a busy refusal (BUSY_PREFIX) is retried, and only while the
        retry still comes before the SLO."""
        if error is None or not error.startswith(BUSY_PREFIX):
            return _FAIL  # draining, queue full, owned elsewhere, a bad task: as today
        at_s = now + self.delay_s
        if at_s >= slo_deadline_s:
            return _HOLD
        return RetryDecision("retry", at_s)


class TargetPicker:
    """Which servers belong to which pool and cluster, and which ones a query gets."""

    def __init__(
        self,
        config: GatewayConfig,
        links: Mapping[str, TaskLink],
        rng: random.Random,
        wait_of: Callable[[TaskLink], tuple[float, float]] | None = None,
        back_in: Callable[[TaskLink], float | None] | None = None,
        registering: Callable[[], float] | None = None,
    ) -> None:
        self.config = config
        self.wait_of = wait_of
        """least-wait pools: a link's (estimated back-of-queue wait ms, mean service ms)."""
        self.back_in = back_in
        """How soon a server that takes no task now may take one again (seconds; None: not
        by itself; gateway.retry_after.server_back_s): the Retry-After of the 503s here."""
        self._least_wait = {p.name for p in config.pools if p.pick == "least-wait"}
        self.links = links
        """Every registered server by id (the service's own dict, read live)."""
        self.rng = rng
        self.pool_members: dict[str, list[str]] = {p.name: [] for p in config.pools}
        """Pool -> ids of the servers that take new queries, in registration order."""
        self.cluster_members: dict[str, dict[str, list[str]]] = {
            p.name: {c: [] for c in p.clusters} for p in config.pools
        }
        """Pool -> cluster -> member ids; a declared cluster stays known while it has none."""
        self._declared = {p.name: frozenset(p.clusters) for p in config.pools}
        self.registering: Callable[[], float] = registering or (lambda: 0.0)
        """Seconds left of the gateway's registration grace (0: passed or none; the
        registry's, which starts when the service does): within it, too few servers is
        worth a retry, not a client error."""
        self.prefix: dict[str, Callable[[], int]] = {}
        """Pools routed by their ordered backend prefix (Swayam): pool -> n in use now."""

    # -- membership ---------------------------------------------------------
    def join(self, link: TaskLink) -> None:
        """Add a registered server to its pool and cluster."""
        self.pool_members[link.pool].append(link.server_id)
        if link.cluster is not None:
            self.cluster_members[link.pool].setdefault(link.cluster, []).append(link.server_id)

    def leave(self, link: TaskLink) -> None:
        """Take a server out of its pool and cluster (no-op when already out).

        An undeclared cluster left without members is forgotten.
        """
        members = self.pool_members[link.pool]
        if link.server_id in members:
            members.remove(link.server_id)
        clusters = self.cluster_members[link.pool]
        ids = clusters.get(link.cluster) if link.cluster is not None else None
        if ids is not None and link.server_id in ids:
            ids.remove(link.server_id)
            if not ids and link.cluster not in self._declared[link.pool]:
                del clusters[link.cluster]

    # -- the pick -------------------------------------------------------------
    def pick(self, t: Targets) -> list[TaskLink]:
        """The k_f target servers (TailGuard §III.B: the query handler picks them)."""
        if t.servers is not None:
            links = []
            for i, sid in enumerate(t.servers):
                link = self.links.get(sid)
                if link is None:
                    raise BadRequest(f"unknown server {sid!r}", field=f"targets.servers[{i}]")
                links.append(link)
            return links
        assert t.pool is not None
        if t.per_cluster is not None:
            return self._per_cluster(t.pool, t.per_cluster, t.exclude_cluster)
        members = self.pool_members.get(t.pool, [])
        scope = f"pool {t.pool!r}"
        if t.cluster is not None:
            members = self._cluster(t.pool, t.cluster, "targets.cluster")
            self._check_live(t.pool, {t.cluster: members})
            scope = f"cluster {t.cluster!r} of pool {t.pool!r}"
        elif t.exclude_cluster is not None:
            self._cluster(t.pool, t.exclude_cluster, "targets.exclude_cluster")
            members = [s for s in members if self.links[s].cluster != t.exclude_cluster]
            scope = f"pool {t.pool!r} outside cluster {t.exclude_cluster!r}"
        if t.all:
            if not members:
                raise self._unavailable(f"{scope} has no servers", "no_servers")
            return [self.links[s] for s in members]
        assert t.fanout is not None
        if t.fanout > len(members):
            size = self._size(t.pool, t.cluster, t.exclude_cluster)
            if t.fanout > size:
                self._check_registering(f"fanout {t.fanout}", size, scope)
                raise BadRequest(
                    f"fanout {t.fanout} exceeds the {size} servers of {scope}",
                    field="targets.fanout",
                )
            # The pool has the servers, but too few take queries now (down, draining, a
            # rolling restart): worth a retry, so 503, not a client error.
            taking = set(members)
            others = [
                lk
                for lk in self.links.values()
                if lk.pool == t.pool
                and lk.server_id not in taking
                and (t.cluster is None or lk.cluster == t.cluster)
                and (t.exclude_cluster is None or lk.cluster != t.exclude_cluster)
            ]
            raise self._unavailable(
                f"fanout {t.fanout} needs {t.fanout} servers of {scope} and {len(members)} "
                f"of its {size} take queries now (the others are down or draining)",
                "servers_unavailable",
                retry_after=self.back_of(others, t.fanout - len(members)),
                servers_available=len(members),
                servers_registered=size,
            )
        in_use = self.prefix.get(t.pool)
        if in_use is not None and t.cluster is None and t.exclude_cluster is None:
            return self._ordered(members, t.fanout, in_use())
        if t.pool in self._least_wait and self.wait_of is not None:
            return self._least(members, t.fanout)
        return self._sample(members, t.fanout)

    def back_of(self, links: Iterable[TaskLink], needed: int) -> float | None:
        """When `needed` of these servers may take tasks again (None: no estimate)."""
        back_in = self.back_in
        if back_in is None:
            return None
        return servers_back_s((back_in(lk) for lk in links), needed)

    def _size(self, pool: str, cluster: str | None, exclude: str | None) -> int:
        """The pool's (or cluster's) size: its servers registered in any state, or those its
        configuration names, whichever is larger."""
        registered = [
            lk
            for lk in self.links.values()
            if lk.pool == pool
            and (cluster is None or lk.cluster == cluster)
            and (exclude is None or lk.cluster != exclude)
        ]
        configured = [
            s
            for p in self.config.pools
            if p.name == pool
            for s in p.servers
            if (cluster is None or s.cluster == cluster)
            and (exclude is None or s.cluster != exclude)
        ]
        return max(len(registered), len(configured))

    def _ordered(self, members: list[str], k: int, n: int) -> list[TaskLink]:
        """k random servers among the first max(n, k) live ones in backend order (Swayam's
        random dispatch within the prefix B_1..B_n); down ones only if too few are live."""
        live = [s for s in members if self.links[s].is_up]
        if len(live) < k:
            return self._sample(members, k)
        prefix = backend_order(live)[: max(n, k)]
        return [self.links[s] for s in self.rng.sample(prefix, k)]

    def prefix_view(self, pool: str) -> list[str] | None:
        """The pool's live servers in backend order, the prefix in use first (None: the pool
        is not routed by prefix)."""
        in_use = self.prefix.get(pool)
        if in_use is None:
            return None
        live = [s for s in self.pool_members.get(pool, []) if self.links[s].is_up]
        return backend_order(live)[: in_use()]

    def replacement(
        self, t: Targets, refused: TaskLink, query_id: str, used: Collection[str] = ()
    ) -> TaskLink | None:
        """Another server for a task that `refused` sent back busy (Swayam §4.5: the frontend
        retries another random backend), or None when no other can take it.

        Only where the gateway chose the server: a query that names its servers, or asks
        for `all` of a pool, gets None. The candidates are the live servers of the query's
        scope (its cluster, outside its excluded cluster, or the refused server's cluster
        for `per_cluster`) other than `refused` that hold no task of `query_id` (a link
        holds one task per query). A prefix-routed pool tries its prefix first; within a
        tier, servers not in `used` (the query's other servers) are preferred.
        """
        if t.pool is None or t.all or t.servers is not None:
            return None
        links = self.links
        members = self.pool_members.get(t.pool, [])
        prefix = None
        if t.per_cluster is not None or t.cluster is not None:
            cluster = refused.cluster if t.per_cluster is not None else t.cluster
            members = self.cluster_members.get(t.pool, {}).get(cluster, []) if cluster else []
        elif t.exclude_cluster is not None:
            members = [s for s in members if links[s].cluster != t.exclude_cluster]
        else:
            prefix = self.prefix_view(t.pool)
        candidates = [
            s
            for s in members
            if s != refused.server_id and links[s].is_up and query_id not in links[s].outstanding
        ]
        tiers = [candidates]
        if prefix is not None:
            inside = set(prefix)
            tiers.insert(0, [s for s in candidates if s in inside])
        for tier in tiers:
            fresh = [s for s in tier if s not in used]
            choice = fresh or tier
            if choice:
                return links[self.rng.choice(choice)]
        return None

    def _least(self, members: list[str], k: int) -> list[TaskLink]:
        """The k live servers with the smallest estimated wait (QLM's load balancing across
        instances; ties to the faster server, then at random); down ones only if too few
        are live, as in `_sample`."""
        assert self.wait_of is not None
        live = [s for s in members if self.links[s].is_up]
        pool = live if len(live) >= k else members
        order = self.rng.sample(pool, len(pool))  # the random tie-break
        wait_of = self.wait_of
        ranked = sorted(order, key=lambda s: wait_of(self.links[s]))
        return [self.links[s] for s in ranked[:k]]

    def _sample(self, members: list[str], k: int) -> list[TaskLink]:
        """k random servers of members, live ones preferred."""
        links = self.links
        # Most of the time every server is live: a draw of k that are all live is a uniform
        # draw among the live ones, found in O(k), not O(pool), per query.
        chosen = [links[s] for s in sample(self.rng, members, k)]
        if all(lk.is_up for lk in chosen):
            return chosen
        # Falls back to any when too few are live, so that the query's 503 names the down ones.
        live = [s for s in members if links[s].is_up]
        return [links[s] for s in self.rng.sample(live if len(live) >= k else members, k)]

    def _cluster(self, pool: str, cluster: str, field: str) -> list[str]:
        """Member ids of a known cluster of the pool; 400 naming the known ones otherwise."""
        clusters = self.cluster_members[pool]
        members = clusters.get(cluster)
        if members is None:
            known = ", ".join(sorted(clusters)) or "none"
            raise BadRequest(
                f"unknown cluster {cluster!r} in pool {pool!r} (known: {known})", field=field
            )
        return members

    def _check_live(self, pool: str, clusters: Mapping[str, list[str]]) -> None:
        """503 naming every cluster that has no live server."""
        down = [c for c, ids in clusters.items() if not any(self.links[s].is_up for s in ids)]
        if down:
            names = ", ".join(repr(c) for c in down)
            owners = {self.links[s].owned_elsewhere for c in down for s in clusters[c]}
            owners.discard(None)
            if owners:
                raise self._unavailable(
                    f"cluster {names} of pool {pool!r} is owned by gateway "
                    f"{', '.join(sorted(map(str, owners)))}: with central queueing one gateway "
                    "at a time sends to its servers; use that gateway",
                    "pool_owned_elsewhere",
                    clusters_down=down,
                    owner=min(map(str, owners)),
                )
            # Retry when every such cluster may have a live server again.
            backs = [self.back_of((self.links[s] for s in clusters[c]), 1) for c in down]
            raise self._unavailable(
                f"cluster {names} of pool {pool!r} has no live servers",
                "cluster_unavailable",
                retry_after=None if None in backs else max(b for b in backs if b is not None),
                clusters_down=down,
            )

    def _per_cluster(self, pool: str, k: int, exclude: str | None) -> list[TaskLink]:
        """k random servers from each cluster of the pool (servers without a label: none)."""
        if exclude is not None:
            self._cluster(pool, exclude, "targets.exclude_cluster")
        clusters = {c: ids for c, ids in sorted(self.cluster_members[pool].items()) if c != exclude}
        if not clusters:
            besides = f" besides {exclude!r}" if exclude is not None else ""
            raise self._unavailable(f"pool {pool!r} has no clusters{besides}", "no_servers")
        if k * len(clusters) > self.config.max_fanout:
            raise BadRequest(
                f"per_cluster {k} over {len(clusters)} clusters exceeds max_fanout "
                f"{self.config.max_fanout}",
                field="targets.per_cluster",
            )
        self._check_live(pool, clusters)
        links: list[TaskLink] = []
        for cluster, ids in clusters.items():
            if k > len(ids):
                self._check_registering(
                    f"per_cluster {k}", len(ids), f"cluster {cluster!r} in pool {pool!r}"
                )
                raise BadRequest(
                    f"per_cluster {k} exceeds the {len(ids)} servers of cluster {cluster!r} "
                    f"in pool {pool!r}",
                    field="targets.per_cluster",
                )
            links += self._sample(ids, k)
        return links

    def _check_registering(self, asked: str, size: int, scope: str) -> None:
        """Within the registration grace, more servers than registered so far is a 503."""
        left = self.registering()
        if left > 0:
            raise self._unavailable(
                f"{asked} exceeds the {size} servers of {scope} registered so far: the gateway "
                f"started moments ago and servers are still registering",
                "servers_registering",
                retry_after=min(left, 1.0),
            )

    def _unavailable(
        self, message: str, code: str, retry_after: float | None = None, **extra: object
    ) -> Unavailable:
        if retry_after is not None:
            extra["retry_after_s"] = round(retry_after, 3)  # the 503's Retry-After (gateway.app)
        return Unavailable(
            message,
            code=code,
            extra=extra or None,
        )
