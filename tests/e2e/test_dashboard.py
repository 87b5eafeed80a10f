"""The built-in dashboard in headless Chromium against a gateway under load."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import shutil
from pathlib import Path

import aiohttp
import pytest

from tests.integration.harness import Proc, start_gateway, start_taskserver

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CHROMIUM = shutil.which("chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
CHARTS = ("miss", "latency", "rejections", "throughput", "queues", "cdf", "servers")
# Slow enough that the load queues up, misses deadlines now and then and meets admission.
SERVICE = ("--service-kind", "exponential", "--service-mean-ms", "8")
GATEWAY_TOML = """
[gateway]
storage_url = "sqlite:///{db}"
history_interval_s = 0.5

[admission]
threshold = 0.05
"""


async def keep_loading(url: str, stop: asyncio.Event, concurrency: int = 8) -> None:
    """Queries of every class, fanout 2, until stop is set."""

    async def worker(i: int) -> None:
        body = {"class": "ABC"[i % 3], "targets": {"pool": "default", "fanout": 2}}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
            while not stop.is_set():
                async with s.post(url + "/v1/queries", json=body) as r:
                    await r.read()
                    if r.status == 503:  # rejected: back off as Retry-After asks, briefly
                        await asyncio.sleep(0.05)

    await asyncio.gather(*(worker(i) for i in range(concurrency)))


def keep_screenshot(shot: Path) -> None:
    """Copy the screenshot to $TAILGATE_SCREENSHOT_DIR when set (it outlives pytest's tmp)."""
    target = os.environ.get("TAILGATE_SCREENSHOT_DIR")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(target) / "dashboard.png")


@pytest.mark.skipif(CHROMIUM is None, reason="needs a chromium binary on PATH")
@pytest.mark.skipif(
    importlib.util.find_spec("playwright") is None, reason="needs the playwright package"
)
async def test_dashboard_draws_live_charts_under_load(tmp_path: Path) -> None:
    from playwright.async_api import async_playwright

    toml = tmp_path / "gateway.toml"
    toml.write_text(GATEWAY_TOML.format(db=tmp_path / "history.db"))
    procs: list[Proc] = []
    stop = asyncio.Event()
    load: asyncio.Task[None] | None = None
    try:
        gw = start_gateway(toml)
        procs.append(gw)
        async with aiohttp.ClientSession() as http:
            for i in (1, 2):
                ts = start_taskserver(f"ts-{i}", *SERVICE)
                procs.append(ts)
                body = {"id": f"ts-{i}", "address": ts.address, "pool": "default"}
                async with http.post(gw.url + "/v1/servers", json=body) as r:
                    assert r.status == 201, await r.text()
        load = asyncio.create_task(keep_loading(gw.url, stop))
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = await browser.new_page(viewport={"width": 1500, "height": 1000})
                errors: list[str] = []
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                await page.goto(gw.url + "/dashboard")
                # Every chart has drawn points, and the history holds a few samples.
                await page.wait_for_function(
                    """charts => charts.every(name => {
                        const c = document.querySelector(`canvas[data-chart="${name}"]`);
                        return c && Number(c.dataset.points || 0) > 0;
                    }) && Number(document.body.dataset.samples || 0) >= 10""",
                    arg=list(CHARTS),
                    timeout=40_000,
                )
                points = {
                    name: int(
                        await page.get_attribute(f'canvas[data-chart="{name}"]', "data-points") or 0
                    )
                    for name in CHARTS
                }
                assert all(n > 0 for n in points.values()), points
                rows = await page.locator("#servers tbody tr").all_inner_texts()
                assert len(rows) == 2 and all("up" in r for r in rows), rows
                assert "live" in (await page.inner_text("#status"))
                assert errors == []
                shot = tmp_path / "dashboard.png"
                await page.screenshot(path=str(shot), full_page=True)
            finally:
                await browser.close()
        assert shot.stat().st_size > 10_000
        keep_screenshot(shot)
    finally:
        stop.set()
        if load is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(load, 15)
        for p in procs:
            p.stop()
