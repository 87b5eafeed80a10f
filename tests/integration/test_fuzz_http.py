"""schemathesis against a real gateway: every operation of its /openapi.json, fuzzed.

A gateway and two task servers run as real processes on loopback; schemathesis loads
the schema from the gateway's own ``/openapi.json`` and sends, per operation, up to
``MAX_EXAMPLES`` generated requests (schema-valid and schema-invalid ones, its coverage
cases, and requests with methods the path does not take; a fixed seed), each with a
per-request timeout, and checks every answer: no 500, a status code, a content type,
headers and a body that the document declares for that operation, a 4xx for every request
the document does not allow, a 405 with ``Allow`` for an unsupported method, and a 502
only for a task that asked to fail. Then register/deregister sequences run as a state
machine (schemathesis' stateful mode). Most schema-valid bodies are given this gateway's
classes, pool and servers (`_within_config`), so they are carried out, not only parsed.

Not checked: ``positive_data_acceptance`` (a schema-valid request must not get a 4xx).
The document cannot know the configuration a gateway runs with: a class, a pool or a
server id that the schema allows but this gateway does not have is answered 400 naming
the field, as it should be.

The requests sent per operation are written to ``test-output/fuzz-http-examples.json``
and printed (``pytest -s`` shows them).
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.error
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

import hypothesis
import pytest
import schemathesis
from schemathesis import GenerationMode, checks

from gateway.config import parse_address
from tests.integration.harness import REPO_ROOT, Proc, start_gateway, start_taskserver

# The operations run as subtests of one test: ~30 s here, more on a loaded machine.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

MAX_EXAMPLES = 300
"""Generated requests per operation at most, schema-valid and not (fewer where the schema
allows fewer; the coverage cases come on top)."""
SEED = 22
REQUEST_TIMEOUT_S = 10.0
"""A request not answered by then is a hang: the test fails on it."""
TOKEN = "fuzz-http-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
REPORT = REPO_ROOT / "test-output" / "fuzz-http-examples.json"

CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_headers_conformance,
    checks.response_schema_conformance,
    checks.negative_data_rejection,
    checks.unsupported_method,
    checks.allow_header_conformance,
]


def a_task_fails_only_if_asked(ctx: Any, response: Any, case: Any) -> None:
    """A 502 only for a task that asked its server to fail (the emulated executor's `fail`):
    the task server here never dies, and a payload it cannot run is the client's error,
    400 `invalid_task` naming the field."""
    if response.status_code == 502 and not _asks_to_fail(case.body):
        raise AssertionError(f"502 for a task that did not ask to fail: {response.text[:300]}")


def _asks_to_fail(body: Any) -> bool:
    tasks = [body.get("task")] if isinstance(body, dict) else []
    stages = body.get("stages") if isinstance(body, dict) else None
    if isinstance(stages, list):
        tasks += [s.get("task") for s in stages if isinstance(s, dict)]
    return any(isinstance(t, dict) and "fail" in t for t in tasks)


CHECKS.append(a_task_fails_only_if_asked)
STATEFUL_CHECKS = [*CHECKS, checks.use_after_free, checks.ensure_resource_availability]

SENT: Counter[str] = Counter()
"""Requests sent, by operation ("POST /v1/queries") and phase."""
SPAN_S: dict[str, list[float]] = {}
"""First and last moment a request of each operation and phase was sent (perf_counter)."""
STATUSES: defaultdict[str, Counter[str]] = defaultdict(Counter)
"""Answers by operation and status code (all phases)."""


class GatewayUnderFuzz:
    """The processes fuzzed: a gateway, its task server ts-1 in the pool `default`, and a
    task server that every fuzzed registration is pointed at."""

    def __init__(self) -> None:
        self.procs: list[Proc] = []
        self.url = ""
        self.server_address = ""
        """Where every registration with a valid address is pointed (never ts-1: a server
        registered into two pools would be claimed by the central one)."""

    def start(self) -> None:
        env = {"TAILGATE_AGENT_TOKEN": TOKEN}
        ts = start_taskserver("ts-1", env=env)
        self.procs.append(ts)
        registered = start_taskserver("ts-registered", env=env)
        self.procs.append(registered)
        self.server_address = registered.address
        gw = start_gateway(None, env=env)
        self.procs.append(gw)
        self.url = gw.url
        self.register_task_server()

    def register_task_server(self) -> None:
        """Register ts-1 (again: the fuzzer learns its id from GET /v1/servers and deletes
        it), as its own heartbeat would, and wait for its link."""
        body = {"id": "ts-1", "address": self.procs[0].address, "pool": "default"}
        status, answer = self.post("/v1/servers", body)
        assert status in (200, 201), answer
        deadline = time.monotonic() + 10
        while self.server_state("ts-1") != "up" and time.monotonic() < deadline:
            time.sleep(0.05)

    def server_state(self, server_id: str) -> str | None:
        with urllib.request.urlopen(self.url + "/v1/servers", timeout=REQUEST_TIMEOUT_S) as r:
            servers = {s["id"]: s for s in json.loads(r.read())["servers"]}
        return servers.get(server_id, {}).get("state")

    def post(self, path: str, body: Any) -> tuple[int, Any]:
        req = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            headers={**AUTH, "Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            with exc:
                return exc.code, json.loads(exc.read())

    def alive(self) -> bool:
        return all(p.popen.poll() is None for p in self.procs)

    def stop(self) -> None:
        for p in self.procs:
            p.stop()


@pytest.fixture(scope="module")
def fuzzed() -> Iterator[GatewayUnderFuzz]:
    target = GatewayUnderFuzz()
    try:
        target.start()
        yield target
    finally:
        target.stop()
        _write_report()


@pytest.fixture(scope="module")
def api_schema(fuzzed: GatewayUnderFuzz) -> Any:
    config = schemathesis.Config.from_dict(
        {
            "seed": SEED,
            "request-timeout": REQUEST_TIMEOUT_S,
            "headers": AUTH,
            "generation": {"mode": "all", "max-examples": MAX_EXAMPLES, "database": "none"},
            # 502, 503 and 504 are the gateway's documented answers about its servers (a task
            # failed, none can take the query, not done by SLO + grace): the checks below
            # hold them to the document, and `a_task_fails_only_if_asked` to their cause.
            "checks": {
                "not_a_server_error": {"expected-statuses": ["2xx", "3xx", "4xx", 502, 503, 504]}
            },
        }
    )
    return schemathesis.openapi.from_url(fuzzed.url + "/openapi.json", config=config)


@pytest.fixture(autouse=True)
def _node_id_for_schemathesis(request: pytest.FixtureRequest) -> None:
    # schemathesis 4.32 renames the running test through `Node._nodeid`, which pytest 9.2
    # no longer has (it became `_id`): give it one to rename.
    if not hasattr(request.node, "_nodeid"):
        request.node._nodeid = request.node.nodeid


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
def test_every_operation_answers_within_its_spec(case: Any, fuzzed: GatewayUnderFuzz) -> None:
    _confine(case, fuzzed.server_address)
    _within_config(case, fuzzed.server_address)
    _count(case, "generated")
    response = case.call_and_validate(checks=CHECKS, timeout=REQUEST_TIMEOUT_S)
    STATUSES[case.operation.label][str(response.status_code)] += 1


def test_register_and_deregister_sequences_answer_within_the_spec(
    api_schema: Any, fuzzed: GatewayUnderFuzz
) -> None:
    """The links of the document (POST /v1/servers -> DELETE /v1/servers/{id}), chained."""
    workflow = api_schema.as_state_machine()
    address = fuzzed.server_address
    failures: list[str] = []

    class Confined(workflow):  # type: ignore[misc, valid-type]
        def before_call(self, case: Any) -> None:
            _confine(case, address)
            _within_config(case, address)
            _count(case, "stateful")

        def get_call_kwargs(self, case: Any) -> dict[str, Any]:
            return {"timeout": REQUEST_TIMEOUT_S}

        def validate_response(self, response: Any, case: Any, **kwargs: Any) -> None:
            STATUSES[case.operation.label][str(response.status_code)] += 1
            try:
                case.validate_response(response, checks=STATEFUL_CHECKS, transport_kwargs=kwargs)
            except Exception as exc:
                failures.append(f"{case.method} {case.formatted_path}: {exc}")
                raise

    settings = hypothesis.settings(
        max_examples=40,
        stateful_step_count=6,
        phases=[hypothesis.Phase.generate],
        database=None,
        deadline=None,
        suppress_health_check=list(hypothesis.HealthCheck),
    )
    # The gateway's state outlives a scenario (what one registered, the next lists), so
    # Hypothesis may find a scenario drawing differently from an earlier one with the same
    # start and stop with Flaky, as schemathesis' own stateful phase expects: a run ended
    # so, with no failed check, counts, and another run goes on until enough steps ran.
    for _ in range(5):
        with contextlib.suppress(hypothesis.errors.Flaky):
            Confined.run(settings=settings)
        assert not failures, failures[0]
        if sum(n for k, n in SENT.items() if k.endswith("(stateful)")) >= 150:
            break
    assert sum(n for k, n in SENT.items() if k.endswith("(stateful)")) >= 150


def test_the_gateway_still_serves_after_the_fuzz(fuzzed: GatewayUnderFuzz) -> None:
    assert fuzzed.alive(), "a process died under the fuzzer"
    fuzzed.register_task_server()
    q = {"class": "C", "targets": {"servers": ["ts-1"]}, "task": {"service_ms": 1}}
    status, answer = fuzzed.post("/v1/queries", q)
    assert status == 200 and answer["tasks"][0]["status"] == "ok", answer


def test_a_task_its_server_cannot_run_is_the_clients_error(fuzzed: GatewayUnderFuzz) -> None:
    """Found by schemathesis: a task an emulated server cannot run (not a JSON object, a
    service_ms that is no duration) was answered 502, a server's failure."""
    fuzzed.register_task_server()
    for task in ([None, None], "x", {"service_ms": "soon"}, {"fail": 3}):
        q = {"class": "C", "targets": {"servers": ["ts-1"]}, "task": task}
        status, answer = fuzzed.post("/v1/queries", q)
        assert status == 400, answer
        assert (answer["error"]["code"], answer["error"]["field"]) == ("invalid_task", "task")
        assert answer["tasks"][0]["status"] == "failed", answer
    q = {"class": "C", "targets": {"servers": ["ts-1"]}, "task": {"fail": "disk on fire"}}
    status, answer = fuzzed.post("/v1/queries", q)
    assert status == 502 and answer["error"]["code"] == "task_failed", answer


def test_extreme_numbers_the_document_allows_are_answered(fuzzed: GatewayUnderFuzz) -> None:
    """Found by schemathesis: an SLO at percentile 5e-324 answered 500 (log(p / 100) of
    0.0), and one query with cost_hint 1.7e308 made GET /v1/groups and /metrics answer 500
    from then on (its cost bucket's bound 2.0 ** 1024 overflowed)."""
    fuzzed.register_task_server()
    tiny = {"slo": {"percentile": 5e-324, "latency_ms": 1000.0}, "targets": {"servers": ["ts-1"]}}
    status, answer = fuzzed.post("/v1/queries", tiny)
    assert status == 200, answer
    huge = {"class": "C", "targets": {"servers": ["ts-1"]}, "cost_hint": 1.7e308}
    status, answer = fuzzed.post("/v1/queries", huge)
    assert status == 200, answer
    for path in ("/v1/groups", "/metrics"):
        with urllib.request.urlopen(fuzzed.url + path, timeout=REQUEST_TIMEOUT_S) as r:
            assert r.status == 200


def _confine(case: Any, server_address: str) -> None:
    """A registration to any valid address goes to our second task server instead: the
    gateway dials what is registered, and a fuzzer must not send it off this machine (nor
    to any other process on it)."""
    body = case.body
    if case.method.upper() == "POST" and case.path == "/v1/servers" and isinstance(body, dict):
        address = body.get("address")
        if isinstance(address, str):
            try:
                parse_address(address)
            except ValueError:
                return  # refused before anything is dialled: fuzz it as it is
            body["address"] = server_address


CLASSES = ("A", "B", "C")
"""The gateway's classes (its default configuration)."""


def _within_config(case: Any, server_address: str) -> None:
    """Two schema-valid bodies in three name this gateway's classes, pool and server (and
    a class where they give neither a class nor an slo; a registration, the second task
    server's address in the pool `edge`, so queries to `default` reach ts-1 alone), so most
    get past the checks against its configuration and are carried out (deadlines,
    admission, dispatch, answers; registrations and their links); the rest, and every
    schema-invalid one, go as made."""
    body = case.body
    positive = case.meta is not None and case.meta.generation.mode == GenerationMode.POSITIVE
    if not positive or not isinstance(body, dict) or len(repr(body)) % 3 == 0:
        return
    if case.path == "/v1/servers":
        body["pool"] = "edge"
        body["address"] = server_address
    if case.path not in ("/v1/queries", "/v1/requests"):
        return
    if isinstance(body.get("class"), str):
        body["class"] = CLASSES[len(body["class"]) % len(CLASSES)]
    elif "slo" not in body:  # this gateway has no default_class
        body["class"] = CLASSES[0]
    stages = body.get("stages") if case.path == "/v1/requests" else [body]
    for stage in stages if isinstance(stages, list) else ():
        targets = stage.get("targets") if isinstance(stage, dict) else None
        if not isinstance(targets, dict):
            continue
        if isinstance(targets.get("servers"), list):
            targets.clear()  # servers name every target: nothing else goes with them
            targets["servers"] = ["ts-1"]
        else:
            targets["pool"] = "default"


def _count(case: Any, phase: str) -> None:
    label = case.operation.label
    now = time.perf_counter()
    SPAN_S.setdefault(f"{label} ({phase})", [now, now])[1] = now
    if case.method.upper() != case.operation.method.upper():
        phase = f"{phase}, method {case.method.upper()}"
    SENT[f"{label} ({phase})"] += 1


def _write_report() -> None:
    REPORT.parent.mkdir(exist_ok=True)
    spans = {k: round(last - first, 2) for k, (first, last) in sorted(SPAN_S.items())}
    data = {
        "max_examples": MAX_EXAMPLES,
        "seed": SEED,
        "sent": dict(sorted(SENT.items())),
        "seconds_from_first_to_last_request": spans,
        "statuses": {k: dict(sorted(v.items())) for k, v in sorted(STATUSES.items())},
    }
    REPORT.write_text(json.dumps(data, indent=1) + "\n")
    by_phase: Counter[str] = Counter()
    for key, n in SENT.items():
        by_phase[key.split(",", 1)[0].removesuffix(")") + ")"] += n
    width = max((len(k) for k in by_phase), default=0)
    print("\nschemathesis: requests sent per operation and phase (any method), seconds taken")
    for key, n in sorted(by_phase.items()):
        print(f"  {key:<{width}}  {n:>5}  {spans.get(key, 0.0):6.2f} s")
    print(f"  {'total':<{width}}  {sum(by_phase.values()):>5}  (details: {REPORT.name})")
