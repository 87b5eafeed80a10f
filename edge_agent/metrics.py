"""Prometheus metrics of an edge agent's sampler, beside the task server's own.

The task server shell exports the sensing tasks (``tailgate_taskserver_*``); this adds
what only an agent does: sampling its reader into the store. Imported only when the
agent serves a metrics port, so prometheus_client stays off the agent's path otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["SamplerCollector"]


class SamplerCollector(Collector):
    """Reads the sampler's status at scrape time (no work on the sampling path)."""

    def __init__(self, status: Callable[[], dict[str, Any]], agent_id: str, cluster: str) -> None:
        self._status = status
        self._agent = agent_id
        self._cluster = cluster

    def collect(self) -> Iterable[CounterMetricFamily | GaugeMetricFamily]:
        st = self._status()
        server = [self._agent]
        info = GaugeMetricFamily(
            "tailgate_edge_agent_info",
            "Always 1: the agent's cluster and sensor reader.",
            labels=["server", "cluster", "reader"],
        )
        info.add_metric([self._agent, self._cluster, str(st["reader"])], 1.0)
        yield info
        for key, doc in (
            ("samples", "Reads of the sensor reader."),
            ("readings", "Readings written to the store."),
        ):
            fam = CounterMetricFamily(f"tailgate_edge_agent_{key}", doc, labels=["server"])
            fam.add_metric(server, float(st[key]))
            yield fam
        faults = CounterMetricFamily(
            "tailgate_edge_agent_faults",
            "Sampling faults (logged, never fatal), by where they happened.",
            labels=["server", "kind"],
        )
        faults.add_metric([self._agent, "reader"], float(st["reader_faults"]))
        faults.add_metric([self._agent, "store"], float(st["store_faults"]))
        yield faults
        full = GaugeMetricFamily(
            "tailgate_edge_agent_store_full",
            "1 while a full disk refuses the store's writes (readings are dropped; committed "
            "ones are kept), else 0.",
            labels=["server"],
        )
        full.add_metric(server, 1.0 if st.get("store_full") else 0.0)
        yield full
        last = st.get("last_sample_ts")
        fam = GaugeMetricFamily(
            "tailgate_edge_agent_last_sample_timestamp_seconds",
            "Unix time of the last sample that stored a reading.",
            labels=["server"],
        )
        if last is not None:
            fam.add_metric(server, float(last))
        yield fam
