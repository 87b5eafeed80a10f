"""The built-in dashboard in headless Chromium against a gateway under normal load, then
overload: uPlot charts, tooltips, legend toggles, the SLO and error-budget tiles, the
pipeline and edge panels and the server table, with a screenshot of each phase."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest

from tests.integration.harness import REPO_ROOT, Proc, start_cli, start_gateway, start_taskserver

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.solo]

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
CHARTS = (
    "latency",
    "outcomes",
    "miss",
    "errors",
    "rejections",
    "throughput",
    "queues",
    "cdf",
    "pipeline",
    "edge_latency",
    "edge_staleness",
    "servers",
    "rates",
)
ADMISSION_THRESHOLD = 0.05
SCREENSHOT_DIR = REPO_ROOT / "test-output"
"""Where the screenshots land in the checkout (git-ignored), besides $TAILGATE_SCREENSHOT_DIR."""
# Slow enough that the overload queues up, misses deadlines and meets admission.
SERVICE = ("--service-kind", "exponential", "--service-mean-ms", "8")
GATEWAY_TOML = """
[gateway]
storage_url = "sqlite:///{db}"
history_interval_s = 0.5

[admission]
threshold = {threshold}

[[pools]]
name = "default"

# The ONNX pipeline server; a 1 ms prior, so a tight SLO reaches the pipeline (and is
# dropped there) instead of being refused by the gateway's unloaded estimate.
[[pools]]
name = "pipe"
[pools.prior]
kind = "constant"
value_ms = 1.0

[[pools]]
name = "edge"
queueing = "central"
cdf = "cluster"
"""
PIPELINE_OK = {"slo": {"percentile": 99, "latency_ms": 3000}, "targets": {"servers": ["gpu-1"]}}
# 6 ms cannot hold the three models (~11 ms at batch 1): PARD drops it at the first module.
PIPELINE_DOOMED = {"slo": {"percentile": 99, "latency_ms": 6}, "targets": {"servers": ["gpu-1"]}}


async def keep_loading(url: str, stop: asyncio.Event, concurrency: int, pause_s: float) -> None:
    """Queries of every class, fanout 2, until stop is set."""

    async def worker(i: int) -> None:
        body = {"class": "ABC"[i % 3], "targets": {"pool": "default", "fanout": 2}}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
            while not stop.is_set():
                async with s.post(url + "/v1/queries", json=body) as r:
                    await r.read()
                if pause_s:
                    await asyncio.sleep(pause_s)

    await asyncio.gather(*(worker(i) for i in range(concurrency)))


async def keep_piping(url: str, stop: asyncio.Event, doomed: asyncio.Event) -> None:
    """Pipeline queries a few times a second; with `doomed` set, tight ones as well."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
        seed = 0
        while not stop.is_set():
            bodies = [PIPELINE_OK, PIPELINE_DOOMED] if doomed.is_set() else [PIPELINE_OK]
            for body in bodies:
                seed += 1
                async with s.post(
                    url + "/v1/queries", json={**body, "task": {"image_seed": seed}}
                ) as r:
                    await r.read()
            await asyncio.sleep(0.3)


def keep_screenshot(shot: Path) -> None:
    """Copy the screenshot to test-output/ in the checkout and to $TAILGATE_SCREENSHOT_DIR
    when set (both outlive pytest's tmp)."""
    targets = [SCREENSHOT_DIR]
    if os.environ.get("TAILGATE_SCREENSHOT_DIR"):
        targets.append(Path(os.environ["TAILGATE_SCREENSHOT_DIR"]))
    for target in targets:
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, target / shot.name)


async def register(http: aiohttp.ClientSession, gw: Proc, body: dict[str, Any]) -> None:
    async with http.post(gw.url + "/v1/servers", json=body) as r:
        assert r.status == 201, await r.text()


async def chart_points(page: Any) -> dict[str, int]:
    return await page.evaluate(
        """charts => Object.fromEntries(charts.map(name => {
            const el = document.querySelector(`.chart[data-chart="${name}"]`);
            return [name, Number((el && el.dataset.points) || 0)];
        }))""",
        list(CHARTS),
    )


async def legend(page: Any, chart: str) -> list[str]:
    """The series labels in a chart's uPlot legend (the time row left out)."""
    labels = await page.locator(
        f'.chart[data-chart="{chart}"] .u-legend .u-series .u-label'
    ).all_inner_texts()
    return labels[1:]


@pytest.mark.timeout(300)
@pytest.mark.skipif(CHROMIUM is None, reason="needs a chromium binary on PATH")
@pytest.mark.skipif(
    importlib.util.find_spec("playwright") is None, reason="needs the playwright package"
)
@pytest.mark.skipif(
    importlib.util.find_spec("onnxruntime") is None, reason="the pipeline server needs onnxruntime"
)
async def test_dashboard_under_normal_load_and_overload(tmp_path: Path) -> None:
    from playwright.async_api import async_playwright

    toml = tmp_path / "gateway.toml"
    toml.write_text(GATEWAY_TOML.format(db=tmp_path / "history.db", threshold=ADMISSION_THRESHOLD))
    procs: list[Proc] = []
    stop = asyncio.Event()
    doomed = asyncio.Event()
    overload = asyncio.Event()
    overload_stop = asyncio.Event()
    loads: list[asyncio.Task[None]] = []
    try:
        gw = start_gateway(toml)
        procs.append(gw)
        async with aiohttp.ClientSession() as http:
            for i in (1, 2):
                ts = start_taskserver(f"ts-{i}", *SERVICE)
                procs.append(ts)
                await register(http, gw, {"id": f"ts-{i}", "address": ts.address})
            gpu = start_taskserver("gpu-1", "--pipeline", "traffic", "--providers", "cpu")
            procs.append(gpu)
            body = {"id": "gpu-1", "address": gpu.address, "pool": "pipe", "slots": 64}
            await register(http, gw, body)
            agent = start_cli(
                [
                    "edge-agent", "run", "--id", "pi-1", "--cluster", "lab", "--port", "0",
                    "--db", str(tmp_path / "pi-1.db"), "--gateway", gw.url,
                    "--register-interval-s", "0.5",
                ]
            )  # fmt: skip
            procs.append(agent)
        loads.append(asyncio.create_task(keep_loading(gw.url, stop, 3, 0.08)))
        loads.append(asyncio.create_task(keep_piping(gw.url, stop, doomed)))

        async def overload_when_told() -> None:
            await overload.wait()
            await keep_loading(gw.url, overload_stop, 24, 0.0)

        loads.append(asyncio.create_task(overload_when_told()))
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = await browser.new_page(viewport={"width": 1500, "height": 1000})
                errors: list[str] = []
                hosts: set[str] = set()
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                page.on(
                    "console",
                    lambda msg: errors.append(msg.text) if msg.type == "error" else None,
                )
                page.on("request", lambda req: hosts.add(urlsplit(req.url).hostname or ""))
                await page.goto(gw.url + "/dashboard")

                # -- normal load --------------------------------------------------------
                # Every chart has drawn points, and the history holds a few samples.
                await page.wait_for_function(
                    """charts => charts.every(name => {
                        const el = document.querySelector(`.chart[data-chart="${name}"]`);
                        return el && el.querySelector("canvas") && Number(el.dataset.points) > 0;
                    }) && Number(document.body.dataset.samples || 0) >= 24
                      && document.querySelectorAll("#servers tbody tr").length === 4""",
                    arg=list(CHARTS),
                    timeout=60_000,
                )
                points = await chart_points(page)
                assert all(n > 0 for n in points.values()), points
                # The latency chart: one series per class, on a log axis, each SLO a line.
                # (custom: the pipeline queries, which name an SLO of their own)
                assert await legend(page, "latency") == ["A p99", "B p99", "C p95", "custom p99"]
                assert await legend(page, "miss") == ["all classes", "A", "B", "C", "custom"]
                assert await legend(page, "outcomes") == [
                    "timed out", "failed", "dropped", "rejected", "missed SLO", "met",
                ]  # fmt: skip
                latency = await page.evaluate(
                    """() => {
                        const c = window.tailgateDashboard.charts.latency;
                        return {distr: c.u.scales.y.distr, hlines: c.spec.hlines.map(h => h.label),
                                colors: c.spec.series.map(s => s.color)};
                    }"""
                )
                assert latency["distr"] == 3  # uPlot's log distribution
                assert latency["hlines"] == [
                    "A SLO: p99 ≤ 100 ms", "B SLO: p99 ≤ 300 ms", "C SLO: p95 ≤ 1.00 s",
                ]  # fmt: skip
                assert len(set(latency["colors"])) == 4
                assert "gpu-1 goodput" in await legend(page, "pipeline")
                assert await legend(page, "edge_latency") == ["lab"]
                assert await legend(page, "edge_staleness") == ["lab"]
                # Hovering the plot shows a tooltip with the values at that time.
                over = page.locator('.chart[data-chart="throughput"] .u-over')
                await over.scroll_into_view_if_needed()
                box = await over.bounding_box()
                assert box is not None
                await over.hover(position={"x": box["width"] * 0.97, "y": box["height"] / 2})
                tip = page.locator('.chart[data-chart="throughput"] .u-tooltip')
                await tip.wait_for(state="visible", timeout=5_000)
                assert "A:" in await tip.inner_text()
                await page.mouse.move(5, 5)
                # A legend click hides its series; a second click shows it again.
                entry = page.locator('.chart[data-chart="latency"] .u-legend .u-series').nth(2)
                await entry.locator(".u-label").click()
                shown = "() => window.tailgateDashboard.charts.latency.u.series[2].show"
                assert await page.evaluate(shown) is False
                assert "u-off" in (await entry.get_attribute("class") or "")
                await entry.locator(".u-label").click()
                assert await page.evaluate(shown) is True
                # SLO tiles: attainment and budget for every class.
                for cls in "ABC":
                    tile = page.locator(f'#slo .slo-tile[data-class="{cls}"]')
                    assert (await tile.locator(".attainment .v").inner_text()).endswith("%")
                    assert await tile.get_attribute("data-budget-left") is not None
                rows = await page.locator("#servers tbody tr").all_inner_texts()
                assert all("up" in r for r in rows), rows
                runs = await page.locator("#servers tbody tr td:nth-child(4)").all_inner_texts()
                assert sorted(runs) == ["emulated", "emulated", "pipeline", "sensing"]
                assert "live" in (await page.inner_text("#status"))
                normal = tmp_path / "dashboard-normal.png"
                await page.screenshot(path=str(normal), full_page=True)

                # -- overload -----------------------------------------------------------
                overload.set()
                doomed.set()
                # Admission rejects, deadlines are missed, PARD drops at a module, and the
                # server table highlights servers above the admission threshold.
                await page.wait_for_function(
                    """() => {
                        const d = window.tailgateDashboard.charts;
                        const recent = (name, label) => {
                            const c = d[name];
                            const i = c.spec.series.findIndex(s => s.label === label) + 1;
                            const ys = (c.raw || c.u.data)[i] || [];
                            return ys.slice(-8).some(v => v > 0);
                        };
                        return recent("outcomes", "rejected") && recent("miss", "all classes")
                            && recent("errors", "503 rejected or dropped")
                            && d.pipeline.spec.series.some(s => s.label.startsWith("dropped at"))
                            && document.querySelectorAll("#servers tr.over").length > 0;
                    }""",
                    timeout=90_000,
                )
                assert "dropped at object_detection" in await legend(page, "pipeline")
                # Overloaded for a few more seconds, so the screenshot shows it as a phase.
                samples = int(await page.evaluate("Number(document.body.dataset.samples)"))
                await page.wait_for_function(
                    f"Number(document.body.dataset.samples) >= {samples + 10}", timeout=30_000
                )
                for row in await page.evaluate(
                    """() => [...document.querySelectorAll("#servers tbody tr")].map(tr => ({
                        over: tr.classList.contains("over"),
                        miss: parseFloat(tr.querySelector("td.miss").textContent) / 100,
                    }))"""
                ):
                    # Shown to one decimal: a row right at the threshold may round onto it.
                    at_threshold = abs(row["miss"] - ADMISSION_THRESHOLD) < 1e-3
                    assert at_threshold or row["over"] == (row["miss"] > ADMISSION_THRESHOLD)
                overloaded = tmp_path / "dashboard-overload.png"
                await page.screenshot(path=str(overloaded), full_page=True)
                assert errors == []
                assert hosts <= {"127.0.0.1", "localhost"}, hosts
            finally:
                await browser.close()
        for shot in (normal, overloaded):
            assert shot.stat().st_size > 10_000
            keep_screenshot(shot)
    finally:
        stop.set()
        overload_stop.set()
        overload.set()
        for load in loads:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(load, 15)
        for p in procs:
            p.stop()
