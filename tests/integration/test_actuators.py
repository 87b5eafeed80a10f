"""Autoscaling actuators: real task-server processes, and a stand-in Kubernetes API server."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import kubernetes.client
import pytest
import yaml
from aiohttp import web

from admission.actuators import ActuatorError, KubernetesActuator, LocalActuator
from gateway.autoscaling import local_spawn
from loadtests.ports import free_port
from tests.integration.conftest import Cluster, query

pytestmark = pytest.mark.integration

RBAC_YAML = Path(__file__).resolve().parents[2] / "deploy/k8s/base/rbac-autoscaler.yaml"


def _two_free_ports() -> int:
    """A port p such that p and p + 1 were both free a moment ago."""
    for _ in range(50):
        p = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p + 1))
            except OSError:
                continue
        return p
    raise AssertionError("no two consecutive free ports")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def children() -> set[int]:
    """PIDs of this process's live children (Linux /proc)."""
    pids: set[int] = set()
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/children") as f:
            pids |= {int(p) for p in f.read().split()}
    return pids


async def servers(http: aiohttp.ClientSession, url: str) -> dict[str, dict[str, Any]]:
    async with http.get(url + "/v1/servers") as resp:
        return {s["id"]: s for s in (await resp.json())["servers"]}


# --------------------------------------------------------------------------- local


async def test_local_actuator_scales_real_task_servers(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    gw = cluster.gateway()
    metrics_base = _two_free_ports()  # auto-1 serves /metrics on it, auto-2 on the next
    act = LocalActuator(
        gateway_url=gw.url,
        spawn=local_spawn(),
        id_prefix="auto",
        start_timeout_s=20,
        metrics_port_base=metrics_base,
    )
    try:
        assert await act.scale_to(2) == 2
        assert await act.replicas() == 2
        for n in (1, 2):  # each started server serves /metrics on its own port
            async with http.get(f"http://127.0.0.1:{metrics_base + n - 1}/metrics") as r:
                assert f'server="auto-{n}"' in await r.text()
        view = await servers(http, gw.url)
        assert {k: v["state"] for k, v in view.items()} == {"auto-1": "up", "auto-2": "up"}
        assert view["auto-1"]["pool"] == "default"
        status, body, _ = await query(
            http, gw, {"class": "A", "targets": {"pool": "default", "all": True}}
        )
        assert status == 200, body
        assert sorted(t["server"] for t in body["tasks"]) == ["auto-1", "auto-2"]

        pids = act.pids
        assert await act.scale_to(1) == 1
        # The newest went: gone from the gateway, and its process has exited.
        assert set(await servers(http, gw.url)) == {"auto-1"}
        assert not pid_alive(pids["auto-2"])
        assert act.pids == {"auto-1": pids["auto-1"]}
        status, body, _ = await query(
            http, gw, {"class": "A", "targets": {"pool": "default", "all": True}}
        )
        assert status == 200, body
        assert [t["server"] for t in body["tasks"]] == ["auto-1"]

        # Ids are never reused within one actuator's life.
        assert await act.scale_to(2) == 2
        assert set(act.pids) == {"auto-1", "auto-3"}
        pids = act.pids
    finally:
        await act.close()
    assert not any(pid_alive(p) for p in pids.values())
    assert await servers(http, gw.url) == {}
    with pytest.raises(ActuatorError, match="closed"):
        await act.scale_to(1)


async def test_local_actuator_failed_registration_leaves_no_process() -> None:
    before = children()
    # Nothing listens on this port: the task server starts, registration fails.
    act = LocalActuator(
        gateway_url=f"http://127.0.0.1:{free_port()}", spawn=local_spawn(), start_timeout_s=20
    )
    try:
        with pytest.raises(ActuatorError, match="auto-1: registration"):
            await act.scale_to(1)
        assert await act.replicas() == 0
        assert act.pids == {}
        assert children() == before
    finally:
        await act.close()


async def test_local_actuator_task_server_that_cannot_start(cluster: Cluster) -> None:
    gw = cluster.gateway()
    before = children()
    act = LocalActuator(
        gateway_url=gw.url, spawn=local_spawn(extra_args=["--policy", "no-such-policy"])
    )
    try:
        with pytest.raises(ActuatorError, match="exited with status 2"):
            await act.scale_to(1)
        assert children() == before
    finally:
        await act.close()


def test_local_actuator_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="slots must be >= 1, got 0"):
        LocalActuator(gateway_url="http://127.0.0.1:1", spawn=local_spawn(), slots=0)


async def test_local_actuator_rejects_negative_replicas() -> None:
    act = LocalActuator(gateway_url="http://127.0.0.1:1", spawn=local_spawn())
    with pytest.raises(ValueError, match="got -1"):
        await act.scale_to(-1)
    await act.close()


# ---------------------------------------------------------------------- kubernetes
# FakeApiServer is a local stand-in for the Kubernetes API server: it serves only
# the scale subresource endpoints the actuator uses, with the JSON shapes a real
# API server returns. No cluster is involved.


@dataclass
class FakeApiServer:
    """GET/PATCH .../{deployments,statefulsets}/{name}/scale on loopback; records PATCHes."""

    replicas: dict[tuple[str, str, str], int] = field(default_factory=dict)
    patches: list[dict[str, Any]] = field(default_factory=list)
    forbidden: bool = False
    url: str = ""

    def scale(self, resource: str, ns: str, name: str) -> dict[str, Any]:
        n = self.replicas[resource, ns, name]
        spec = {"replicas": n} if n else {}  # the API server omits 0 (omitempty)
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {
                "name": name,
                "namespace": ns,
                "uid": "6f1c9a52-3c1e-4b1e-9d5e-1a2b3c4d5e6f",
                "resourceVersion": str(1000 + len(self.patches)),
                "creationTimestamp": "2024-05-01T12:00:00Z",
            },
            "spec": spec,
            "status": {"replicas": n, "selector": f"app={name}"},
        }

    def forbid(self, request: web.Request, verb: str) -> web.Response:
        r, ns, name = (request.match_info[k] for k in ("resource", "ns", "name"))
        user = "system:serviceaccount:default:tailgate-autoscaler"
        return web.json_response(
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": f'{r}.apps "{name}" is forbidden: User "{user}" cannot {verb} '
                f'resource "{r}/scale" in API group "apps" in the namespace "{ns}"',
                "reason": "Forbidden",
                "details": {"name": name, "group": "apps", "kind": r},
                "code": 403,
            },
            status=403,
        )

    async def get(self, request: web.Request) -> web.Response:
        if self.forbidden:
            return self.forbid(request, "get")
        key = (request.match_info["resource"], request.match_info["ns"], request.match_info["name"])
        if key not in self.replicas:
            return web.json_response({"kind": "Status", "code": 404}, status=404)
        return web.json_response(self.scale(*key))

    async def patch(self, request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        self.patches.append(
            {"path": request.path, "content_type": request.content_type, "body": body}
        )
        if self.forbidden:
            return self.forbid(request, "patch")
        key = (request.match_info["resource"], request.match_info["ns"], request.match_info["name"])
        self.replicas[key] = body["spec"]["replicas"]
        return web.json_response(self.scale(*key))


@pytest.fixture
async def apiserver() -> AsyncIterator[FakeApiServer]:
    fake = FakeApiServer(
        replicas={
            ("deployments", "tailgate", "tailgate-taskserver"): 2,
            ("statefulsets", "edge", "tailgate-edge"): 5,
        }
    )
    app = web.Application()
    path = "/apis/apps/v1/namespaces/{ns}/{resource:deployments|statefulsets}/{name}/scale"
    app.router.add_get(path, fake.get)
    app.router.add_patch(path, fake.patch)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    fake.url = f"http://127.0.0.1:{port}"
    try:
        yield fake
    finally:
        await runner.cleanup()


@pytest.fixture
def api_client(apiserver: FakeApiServer) -> Any:
    with kubernetes.client.ApiClient(kubernetes.client.Configuration(host=apiserver.url)) as c:
        yield c


async def test_kubernetes_actuator_patches_deployment_scale(
    apiserver: FakeApiServer, api_client: Any
) -> None:
    act = KubernetesActuator(
        name="tailgate-taskserver", namespace="tailgate", api_client=api_client
    )
    assert await act.replicas() == 2
    assert await act.scale_to(3) == 3
    assert apiserver.patches == [
        {
            "path": "/apis/apps/v1/namespaces/tailgate/deployments/tailgate-taskserver/scale",
            # The client turns a dict body for a "json-patch" endpoint into a
            # strategic merge patch, which the scale subresource accepts.
            "content_type": "application/strategic-merge-patch+json",
            "body": {"spec": {"replicas": 3}},
        }
    ]
    assert await act.replicas() == 3
    # Scale to zero: the API server's answer omits spec.replicas.
    assert await act.scale_to(0) == 0
    assert await act.replicas() == 0
    await act.close()


async def test_kubernetes_actuator_patches_statefulset_scale(
    apiserver: FakeApiServer, api_client: Any
) -> None:
    act = KubernetesActuator(
        name="tailgate-edge", namespace="edge", kind="StatefulSet", api_client=api_client
    )
    assert await act.replicas() == 5
    assert await act.scale_to(4) == 4
    assert [p["path"] for p in apiserver.patches] == [
        "/apis/apps/v1/namespaces/edge/statefulsets/tailgate-edge/scale"
    ]
    assert apiserver.patches[0]["body"] == {"spec": {"replicas": 4}}


async def test_kubernetes_actuator_translates_api_errors(
    apiserver: FakeApiServer, api_client: Any
) -> None:
    apiserver.forbidden = True
    act = KubernetesActuator(
        name="tailgate-taskserver", namespace="tailgate", api_client=api_client
    )
    with pytest.raises(ActuatorError, match=r"HTTP 403 Forbidden: .*cannot patch") as info:
        await act.scale_to(3)
    assert isinstance(info.value.__cause__, kubernetes.client.exceptions.ApiException)
    with pytest.raises(ActuatorError, match="403"):
        await act.replicas()
    missing = KubernetesActuator(name="nope", namespace="tailgate", api_client=api_client)
    apiserver.forbidden = False
    with pytest.raises(ActuatorError, match="404"):
        await missing.replicas()


async def test_kubernetes_actuator_unreachable_api_server() -> None:
    cfg = kubernetes.client.Configuration(host=f"http://127.0.0.1:{free_port()}")
    cfg.retries = 0
    with kubernetes.client.ApiClient(cfg) as client:
        act = KubernetesActuator(name="x", api_client=client)
        with pytest.raises(ActuatorError, match="cannot reach the Kubernetes API server"):
            await act.replicas()


def test_kubernetes_actuator_rejects_bad_kind() -> None:
    with pytest.raises(ValueError, match="'DaemonSet'"):
        KubernetesActuator(name="x", kind="DaemonSet", api_client=object())  # type: ignore[arg-type]


async def test_kubernetes_actuator_rejects_negative_replicas(api_client: Any) -> None:
    act = KubernetesActuator(name="tailgate-taskserver", api_client=api_client)
    with pytest.raises(ValueError, match="got -2"):
        await act.scale_to(-2)


def test_kubernetes_actuator_missing_kubeconfig(tmp_path: Path) -> None:
    with pytest.raises(ActuatorError, match="kubeconfig"):
        KubernetesActuator(name="x", in_cluster=False, kubeconfig=str(tmp_path / "none"))


def test_rbac_grants_only_get_and_patch_on_the_named_scale_subresource() -> None:
    docs = {d["kind"]: d for d in yaml.safe_load_all(RBAC_YAML.read_text()) if d}
    assert set(docs) == {"ServiceAccount", "Role", "RoleBinding"}
    assert docs["Role"]["rules"] == [
        {
            "apiGroups": ["apps"],
            # The base runs the task servers as a StatefulSet (stable server ids).
            "resources": ["statefulsets/scale"],
            "resourceNames": ["tailgate-taskserver"],
            "verbs": ["get", "patch"],
        }
    ]
    binding = docs["RoleBinding"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": docs["Role"]["metadata"]["name"],
    }
    sa = docs["ServiceAccount"]["metadata"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["name"], "namespace": sa["namespace"]}
    ]


def test_kubernetes_actuator_in_cluster_detection(monkeypatch: pytest.MonkeyPatch) -> None:
    # In a pod (KUBERNETES_SERVICE_HOST set) the in-cluster config is chosen; outside
    # one, its service-account token is missing, so loading fails as ActuatorError.
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    with pytest.raises(ActuatorError, match="in-cluster"):
        KubernetesActuator(name="x")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    with pytest.raises(ActuatorError, match="in-cluster"):
        KubernetesActuator(name="x", in_cluster=True)
