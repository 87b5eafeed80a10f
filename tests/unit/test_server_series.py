"""GET /metrics renders the per-server families itself, in slices: the same text as
prometheus_client's, and the event loop runs between slices."""

from __future__ import annotations

import asyncio
import re

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.config import GatewayConfig
from gateway.server_series import SERVER_FAMILIES, server_text
from gateway.service import GatewayService
from tests.unit.loop_ticks import turns_during
from tests.unit.test_dashboard_figures import _link


def _service(n: int) -> GatewayService:
    service = GatewayService(GatewayConfig(storage_url=""))
    for i in range(n):
        # One id the text format must escape: a quote, a backslash, a newline.
        sid = f"s{i:03d}" if i != 3 else 'odd"id\\with\nnewline'
        _link(service, sid, "emulated", pool=f"p{i % 3}")
        if i % 4:
            service.book.add_server(sid, [float(j * (i + 1)) for j in range(1, 101)])
        if i % 5:
            service.server_windows.tasks(sid, f"p{i % 3}", 3 * i + 1, i % 4)
    # Servers in each state tailgate_servers tells apart.
    links = list(service.links.values())
    for link in links[::2]:
        link.state = "up"
    links[1].state = "down"
    links[2].draining = True
    links[4].server_draining = True
    links[6].owner = "gw-elsewhere"
    return service


def _families(text: str) -> dict[str, str]:
    """Family name -> its block of lines (HELP, TYPE, samples)."""
    blocks = re.split(r"(?m)^(?=# HELP )", text)
    return {b.split()[2]: b for b in blocks if b.startswith("# HELP ")}


async def test_the_sliced_text_is_what_prometheus_client_writes() -> None:
    service = _service(37)
    whole = _families(generate_latest(service.registry).decode())
    sliced_text = (await service.metrics.exposition()).decode()
    sliced = _families(sliced_text)
    assert sliced.keys() == whole.keys()
    names = {f"{name}_total" if kind == "counter" else name for name, kind, _, _ in SERVER_FAMILIES}
    assert names <= sliced.keys()
    # The per-server families to the byte (the others move between reads: GC pauses), and
    # tailgate_servers, counted in the slices.
    for name in names | {"tailgate_pool_task_miss_ratio", "tailgate_servers"}:
        assert sliced[name] == whole[name], name
    states = {line.split("state=")[1].split('"')[1] for line in sliced["tailgate_servers"]
              .splitlines() if not line.startswith("#")}  # fmt: skip
    assert states == {"up", "down", "draining", "owned_elsewhere", "connecting"}
    # Every server shows (the escaped one too), and the text parses.
    ratio = sliced["tailgate_server_task_miss_ratio"]
    assert ratio.count("\n") == 37 + 2
    assert r'server="odd\"id\\with\nnewline"' in ratio
    parsed = {f.name for f in text_string_to_metric_families(sliced_text)}
    assert "tailgate_server_post_queuing_seconds" in parsed
    # Each family once: the registry's collectors left them to the sliced part.
    assert sliced_text.count("# TYPE tailgate_server_queue_depth gauge") == 1
    assert sliced_text.count("# TYPE tailgate_servers gauge") == 1
    # ... and only for the scrape: the registry itself still has them.
    assert generate_latest(service.registry).decode().count("# TYPE tailgate_servers gauge") == 1


async def test_the_loop_runs_between_slices() -> None:
    service = _service(20)
    text, between = await turns_during(server_text(service, service.server_windows, slice_size=4))
    # 16 counts in 4 slices and 20 servers in 5: a pause after each.
    assert between >= 9
    assert text.count("tailgate_server_queue_depth{") == 20


async def test_a_scrape_while_servers_leave_still_renders_whole() -> None:
    service = _service(30)

    async def leave() -> None:
        for sid in list(service.links)[:10]:
            await asyncio.sleep(0)
            del service.links[sid]
            service.server_windows.forget(sid, service.clock())

    leaving = asyncio.get_running_loop().create_task(leave())
    text = await server_text(service, service.server_windows, slice_size=3)
    await leaving
    assert text.count("tailgate_server_queue_depth{") == 30  # those registered at its start
    assert len(service.links) == 20
