"""The light /metrics endpoint: routing, methods and the edge agent's sampler metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from edge_agent.metrics import SamplerCollector
from taskserver.exposition import Reply, answer

ROUTES = {"/metrics": lambda: (200, "text/plain", b"m 1\n")}


def head(line: str) -> bytes:
    return f"{line}\r\nHost: x\r\n\r\n".encode()


def test_get_and_head_reach_the_route_and_a_query_string_is_ignored() -> None:
    assert answer(ROUTES, head("GET /metrics HTTP/1.1")) == ((200, "text/plain", b"m 1\n"), False)
    assert answer(ROUTES, head("GET /metrics?x=1 HTTP/1.0"))[0][0] == 200
    assert answer(ROUTES, head("HEAD /metrics HTTP/1.1")) == ((200, "text/plain", b"m 1\n"), True)


def test_other_methods_paths_and_garbage_get_4xx() -> None:
    assert answer(ROUTES, head("POST /metrics HTTP/1.1"))[0][0] == 405
    reply, _ = answer(ROUTES, head("GET /nope HTTP/1.1"))
    assert reply[0] == 404 and b"/metrics" in reply[2]
    assert answer(ROUTES, b"\x16\x03\x01 hello\r\n\r\n")[0][0] == 400
    assert answer(ROUTES, head("GET /metrics"))[0][0] == 400


def test_a_failing_route_is_a_500_not_a_crash() -> None:
    def broken() -> Reply:
        raise RuntimeError("collector bug")

    reply, _ = answer({"/metrics": broken}, head("GET /metrics HTTP/1.1"))
    assert reply[0] == 500


def test_sampler_metrics_read_the_status_at_scrape_time() -> None:
    status = {
        "reader": "iio",
        "samples": 4,
        "readings": 7,
        "reader_faults": 1,
        "store_faults": 0,
        "last_fault": "reader: gone",
        "last_sample_ts": None,
    }
    registry = CollectorRegistry()
    registry.register(SamplerCollector(lambda: status, "pi-1", "wet-lab"))
    text = generate_latest(registry).decode()
    assert 'tailgate_edge_agent_info{cluster="wet-lab",reader="iio",server="pi-1"} 1.0' in text
    assert 'tailgate_edge_agent_samples_total{server="pi-1"} 4.0' in text
    assert 'tailgate_edge_agent_faults_total{kind="reader",server="pi-1"} 1.0' in text
    assert "tailgate_edge_agent_last_sample_timestamp_seconds{" not in text  # none yet
    status.update(samples=5, last_sample_ts=1_700_000_000)
    text = generate_latest(registry).decode()
    assert 'tailgate_edge_agent_samples_total{server="pi-1"} 5.0' in text
    assert 'tailgate_edge_agent_last_sample_timestamp_seconds{server="pi-1"} 1.7e+09' in text
