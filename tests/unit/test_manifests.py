"""The Kubernetes manifests (deploy/k8s, deploy/kustomization.yaml), against schemas and code.

Each kustomize target is rendered (tests/unit/kustomize_render.py; cross-checked with
`kubectl kustomize` where installed) and every resource is validated offline against the
Kubernetes OpenAPI schemas; the Prometheus Operator's resources, which have no schema
there, are checked structurally. Then what the code decides must agree with what the
manifests say: ports and probe paths, the CLI arguments, the gateway replica list, the
autoscaler's RBAC, the grace periods against the drain times.
"""

from __future__ import annotations

import base64
import copy
import os
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from deploy.cli import build_parser, cmd_edge_agent_run, cmd_gateway, cmd_taskserver
from deploy.config import parse_config
from edge_agent.config import AgentConfig
from gateway.app import ROUTES
from gateway.config import GatewayConfig, check_token
from gateway.service import DRAIN_MARGIN_S
from taskserver.config import TaskServerConfig
from taskserver.lifecycle import LEAVE_MARGIN_S
from taskserver.server import _metrics_routes
from tests.unit.kustomize_render import Rendered, pod_spec, render, split_image

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
TARGETS = {
    "base": K8S / "base",
    "gpu": K8S / "overlays" / "gpu",
    "edge-k3s": K8S / "overlays" / "edge-k3s",
}
# Optional parts, built as a user would add them to an overlay.
MONITORED = ("edge-k3s", K8S / "components" / "monitoring")
DASHBOARD = DEPLOY  # deploy/kustomization.yaml: the Grafana dashboard ConfigMap
# The oldest Kubernetes the manifests target, and the newest the schemas know.
K8S_VERSIONS = ("1.30", kubernetes_validate.latest_version())
PROMETHEUS_OPERATOR = "monitoring.coreos.com/v1"
IMAGE_REGISTRY = "registry.example.com/tailgate/"
DOCKERFILES = {
    "gateway": "gateway.Dockerfile",
    "taskserver": "taskserver-cpu.Dockerfile",
    "taskserver-gpu": "taskserver-gpu.Dockerfile",
    "edge-agent": "edge-agent.Dockerfile",
}
COMMANDS = {"gateway": cmd_gateway, "taskserver": cmd_taskserver, "edge-agent": cmd_edge_agent_run}
# What the downward API would put in $(VAR) references, for parsing the arguments.
FIELD_SAMPLES = {
    "metadata.name": "tailgate-taskserver-0",
    "status.podIP": "10.42.0.7",
    "spec.nodeName": "pi-wetlab-1",
}
GATEWAY_ROUTES = {path for method, path, _ in ROUTES if method == "GET"}
# The HTTP paths a task server or edge agent serves on its metrics port.
SERVER_ROUTES = set(_metrics_routes(None, None))  # type: ignore[arg-type]


def _monitored_root(tmp: Path) -> Path:
    """A kustomization in `tmp` = an overlay plus the monitoring component (relative paths)."""
    overlay, component = TARGETS[MONITORED[0]], MONITORED[1]
    (tmp / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(overlay, tmp)],
                "components": [os.path.relpath(component, tmp)],
            }
        )
    )
    return tmp


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {
        **TARGETS,
        "monitored": _monitored_root(tmp_path_factory.mktemp("monitored")),
        "dashboard": DASHBOARD,
    }


@pytest.fixture(scope="module")
def builds(roots: dict[str, Path]) -> dict[str, Rendered]:
    return {name: render(root) for name, root in roots.items()}


@pytest.fixture(scope="module")
def rendered(builds: dict[str, Rendered]) -> dict[str, list[dict[str, Any]]]:
    return {name: b.resources for name, b in builds.items()}


# ----------------------------------------------------------------------------- helpers


def workloads(docs: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The resources that run pods."""
    return (d for d in docs if pod_spec(d) is not None)


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    hits = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(hits) == 1, f"{kind}/{name}: {len(hits)} found"
    return hits[0]


def component(doc: dict[str, Any]) -> str:
    return str(doc["metadata"]["labels"]["app.kubernetes.io/component"])


def template_labels(doc: dict[str, Any]) -> dict[str, str]:
    return dict(doc["spec"]["template"]["metadata"]["labels"])


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def config_of(docs: list[dict[str, Any]]) -> Any:
    """The TailgateConfig the pods load: tailgate.toml from the tailgate-config ConfigMap."""
    text = one(docs, "ConfigMap", "tailgate-config")["data"]["tailgate.toml"]
    return parse_config(tomllib.loads(text), "tailgate.toml", env={})


def ports_of(container: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container.get("ports", [])}


def probe_port(container: dict[str, Any], probe: dict[str, Any]) -> int:
    """The container port a probe targets (by name or number)."""
    action = probe.get("httpGet") or probe.get("tcpSocket")
    assert action is not None, f"{container['name']}: probe without httpGet/tcpSocket: {probe}"
    port = action["port"]
    return ports_of(container)[port] if isinstance(port, str) else int(port)


def env_value(docs: list[dict[str, Any]], var: dict[str, Any]) -> str:
    """The value a container env entry takes (downward API: a sample value)."""
    if "value" in var:
        return str(var["value"])
    source = var["valueFrom"]
    if "fieldRef" in source:
        return FIELD_SAMPLES[source["fieldRef"]["fieldPath"]]
    ref = source["configMapKeyRef"]
    return str(one(docs, "ConfigMap", ref["name"])["data"][ref["key"]])


def argv_of(docs: list[dict[str, Any]], container: dict[str, Any]) -> list[str]:
    """command + args with every $(VAR) replaced as the kubelet would, from the env."""
    env = {v["name"]: env_value(docs, v) for v in container.get("env", [])}
    argv = [*container["command"], *container.get("args", [])]

    def expand(arg: str) -> str:
        def one_var(m: re.Match[str]) -> str:
            assert m.group(1) in env, f"{container['name']}: $({m.group(1)}) is not in its env"
            return env[m.group(1)]

        return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", one_var, arg)

    return [expand(a) for a in argv]


def gateway_urls(docs: list[dict[str, Any]]) -> list[str]:
    return one(docs, "ConfigMap", "tailgate-gateways")["data"]["urls"].split(",")


# ----------------------------------------------------------------------------- rendering


def test_every_kustomization_is_built_by_a_target(builds: dict[str, Rendered]) -> None:
    everywhere = {p.parent.resolve() for p in K8S.rglob("kustomization.yaml")}
    built = set().union(*(b.visited for b in builds.values()))
    assert everywhere - built == set(), "a kustomization no target builds is never checked"


def _kustomize() -> list[str] | None:
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    return None


def _unhash(docs: list[dict[str, Any]], plain: set[str]) -> list[dict[str, Any]]:
    """kustomize's output with the content hash taken off generated names (and references)."""
    hashed = {}
    for d in docs:
        name = d["metadata"]["name"]
        base, sep, suffix = name.rpartition("-")
        if d["kind"] in ("ConfigMap", "Secret") and sep and base in plain and len(suffix) == 10:
            hashed[name] = base

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return hashed.get(node, node) if isinstance(node, str) else node

    return [walk(d) for d in docs]


def _key(d: dict[str, Any]) -> tuple[str, str, str]:
    return (d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"])


@pytest.mark.parametrize("target", [*TARGETS, "monitored", "dashboard"])
def test_renderer_agrees_with_kustomize(
    target: str, roots: dict[str, Path], rendered: dict[str, list[dict[str, Any]]]
) -> None:
    tool = _kustomize()
    if tool is None:
        pytest.skip("neither kustomize nor kubectl is installed: the renderer alone checks")
    out = subprocess.run(
        [*tool, str(roots[target])], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    ours = copy.deepcopy(rendered[target])
    plain = {d["metadata"]["name"] for d in ours if d["kind"] in ("ConfigMap", "Secret")}
    theirs = _unhash([d for d in yaml.safe_load_all(out.stdout) if d], plain)
    # Secrets: kustomize wraps long base64 lines; compare the decoded values.
    for docs in (ours, theirs):
        for d in docs:
            if d["kind"] == "Secret":
                d["data"] = {k: base64.b64decode(v) for k, v in d["data"].items()}
    assert sorted(ours, key=_key) == sorted(theirs, key=_key)


# ----------------------------------------------------------------------------- schemas


@pytest.mark.parametrize("target", [*TARGETS, "monitored", "dashboard"])
def test_every_resource_is_valid_kubernetes(
    target: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    docs = rendered[target]
    assert docs
    errors = []
    for doc in docs:
        where = f"{target}: {doc['kind']}/{doc['metadata']['name']}"
        if doc["apiVersion"] == PROMETHEUS_OPERATOR:
            continue  # a CRD: no schema here; test_prometheus_operator_monitors checks it
        for version in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except jsonschema.ValidationError as exc:  # kubernetes_validate's, or its base
                errors.append(f"{where}: {exc.json_path}: {exc.message} (Kubernetes {version})")
    assert not errors, "\n".join(errors)


def test_prometheus_operator_monitors(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["monitored"]
    monitors = [d for d in docs if d["apiVersion"] == PROMETHEUS_OPERATOR]
    assert {d["kind"] for d in monitors} == {"ServiceMonitor", "PodMonitor"}
    services = [d for d in docs if d["kind"] == "Service"]
    pods = {d["metadata"]["name"]: template_labels(d) for d in workloads(docs)}
    scraped: dict[str, int] = {}
    for m in monitors:
        spec, where = m["spec"], f"{m['kind']}/{m['metadata']['name']}"
        assert set(m["metadata"]) <= {"name", "namespace", "labels"}, where
        selector = spec["selector"]["matchLabels"]
        if m["kind"] == "ServiceMonitor":
            hits = [s for s in services if selects(selector, s["metadata"].get("labels", {}))]
            assert len(hits) == 1, f"{where} selects {len(hits)} Services"
            port_names = {p["name"] for p in hits[0]["spec"]["ports"]}
            for ep in spec["endpoints"]:
                assert ep["port"] in port_names, f"{where}: no port {ep['port']!r}"
            selected = [n for n, lab in pods.items() if selects(hits[0]["spec"]["selector"], lab)]
        else:
            selected = [n for n, lab in pods.items() if selects(selector, lab)]
            for ep in spec["podMetricsEndpoints"]:
                for name in selected:
                    c = pod_spec(one(docs, "DaemonSet", name))["containers"][0]  # type: ignore[index]
                    assert ep["port"] in ports_of(c), f"{where}: {name} has no {ep['port']!r}"
        assert selected, f"{where} selects no pods"
        for ep in spec.get("endpoints", []) + spec.get("podMetricsEndpoints", []):
            assert ep["path"] in GATEWAY_ROUTES | SERVER_ROUTES, f"{where}: {ep['path']}"
        for name in selected:
            scraped[name] = scraped.get(name, 0) + 1
    assert set(scraped) == set(pods), "every workload is scraped"
    assert set(scraped.values()) == {1}, f"each pod is scraped once: {scraped}"


# ----------------------------------------------------------------------------- wiring


@pytest.mark.parametrize("target", [*TARGETS, "monitored"])
def test_services_and_selectors_match_the_pods(
    target: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    docs = rendered[target]
    for w in workloads(docs):
        where = f"{target}: {w['kind']}/{w['metadata']['name']}"
        assert selects(w["spec"]["selector"]["matchLabels"], template_labels(w)), where
        if w["kind"] == "StatefulSet":
            governing = one(docs, "Service", w["spec"]["serviceName"])
            assert governing["spec"]["clusterIP"] == "None", f"{where}: headless serviceName"
            assert selects(governing["spec"]["selector"], template_labels(w)), where
    for svc in (d for d in docs if d["kind"] == "Service"):
        where = f"{target}: Service/{svc['metadata']['name']}"
        pods = [w for w in workloads(docs) if selects(svc["spec"]["selector"], template_labels(w))]
        assert pods, f"{where} selects no pods"
        for w in pods:
            names = ports_of(pod_spec(w)["containers"][0])  # type: ignore[index]
            for p in svc["spec"]["ports"]:
                assert p["targetPort"] in names, f"{where}: {w['metadata']['name']} {p}"
                assert names[p["targetPort"]] == p["port"], f"{where}: port {p['port']}"
    daemonsets = [d for d in docs if d["kind"] == "DaemonSet"]
    for a in daemonsets:
        for b in daemonsets:
            if a is not b:
                assert not selects(a["spec"]["selector"]["matchLabels"], template_labels(b))


@pytest.mark.parametrize("target", [*TARGETS])
def test_ports_probes_and_arguments_agree_with_the_code(
    target: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    docs = rendered[target]
    cfg = config_of(docs)
    parser = build_parser()
    seen = set()
    for w in workloads(docs):
        spec = pod_spec(w)
        assert spec is not None
        role = component(w)
        seen.add(role)
        (c,) = spec["containers"]
        where = f"{target}: {w['kind']}/{w['metadata']['name']}"
        argv = argv_of(docs, c)
        assert argv[0] == "tailgate", where
        args = parser.parse_args(argv[1:])
        assert args.func is COMMANDS[role], f"{where}: {argv}"
        ports = ports_of(c)
        if role == "gateway":
            assert cfg.gateway.port == GatewayConfig().port == ports["http"], where
            http_paths = GATEWAY_ROUTES
        elif role == "taskserver":
            assert cfg.taskserver.port == TaskServerConfig().port == ports["thrift"], where
            assert cfg.taskserver.metrics_port == ports["metrics"] != 0, where
            assert args.advertise.endswith(f":{ports['thrift']}"), where
            http_paths = SERVER_ROUTES
        else:
            assert args.port == AgentConfig().port == ports["thrift"], where
            assert args.metrics_port == ports["metrics"] != 0, where
            assert args.advertise.endswith(f":{ports['thrift']}"), where
            http_paths = SERVER_ROUTES
        for kind in ("livenessProbe", "readinessProbe", "startupProbe"):
            probe = c.get(kind)
            if probe is None:
                assert kind == "startupProbe", f"{where}: no {kind}"
                continue
            assert probe_port(c, probe) in ports.values(), f"{where}: {kind}"
            if "httpGet" in probe:
                assert probe["httpGet"]["path"] in http_paths, f"{where}: {kind} {probe}"
        if role == "gateway":
            assert c["livenessProbe"]["httpGet"]["path"] == "/livez", where
            assert c["readinessProbe"]["httpGet"]["path"] == "/readyz", where
        notes = w["spec"]["template"]["metadata"]["annotations"]
        assert notes["prometheus.io/scrape"] == "true", where
        assert int(notes["prometheus.io/port"]) in ports.values(), where
        assert notes["prometheus.io/path"] in http_paths and "/metrics" in http_paths, where
        # The files the arguments and the environment name are the mounted ones.
        mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
        volumes = {v["name"]: v for v in spec["volumes"]}
        if args.config is not None:
            volume = volumes[mounts[str(Path(args.config).parent)]]
            assert volume["configMap"]["name"] == "tailgate-config", where
            assert Path(args.config).name == "tailgate.toml", where
        token = {v["name"]: v.get("value") for v in c["env"]}["TAILGATE_AGENT_TOKEN_FILE"]
        volume = volumes[mounts[str(Path(token).parent)]]
        secret = one(docs, "Secret", volume["secret"]["secretName"])
        assert Path(token).name in secret["data"], where
    assert {"gateway", "taskserver"} <= seen


@pytest.mark.parametrize("target", [*TARGETS])
def test_servers_register_with_every_gateway_replica(
    target: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    docs = rendered[target]
    gw = one(docs, "StatefulSet", "tailgate-gateway")
    peers = one(docs, "Service", gw["spec"]["serviceName"])
    assert peers["spec"]["clusterIP"] == "None" and peers["spec"]["publishNotReadyAddresses"]
    port = config_of(docs).gateway.port
    name, service = gw["metadata"]["name"], peers["metadata"]["name"]
    expected = [f"http://{name}-{i}.{service}:{port}" for i in range(gw["spec"]["replicas"])]
    assert gateway_urls(docs) == expected


def test_autoscaler_rbac_is_least_privilege(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for target in TARGETS:
        docs = rendered[target]
        auto = config_of(docs).gateway.autoscaling
        assert auto.actuator == "kubernetes"
        workload = one(docs, auto.k8s_kind, auto.k8s_name)
        assert workload["metadata"]["namespace"] == auto.k8s_namespace
        assert component(workload) == "taskserver"
        # The actuator reads and patches `{kind}/scale` of that one workload, nothing else.
        plural = {"Deployment": "deployments", "StatefulSet": "statefulsets"}[auto.k8s_kind]
        (role,) = [d for d in docs if d["kind"] == "Role"]
        assert role["rules"] == [
            {
                "apiGroups": ["apps"],
                "resources": [f"{plural}/scale"],
                "resourceNames": [auto.k8s_name],
                "verbs": ["get", "patch"],
            }
        ]
        assert not [d for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]
        (binding,) = [d for d in docs if d["kind"] == "RoleBinding"]
        assert binding["roleRef"]["name"] == role["metadata"]["name"]
        gateway_spec = pod_spec(one(docs, "StatefulSet", "tailgate-gateway"))
        assert gateway_spec is not None
        assert binding["subjects"] == [
            {
                "kind": "ServiceAccount",
                "name": gateway_spec["serviceAccountName"],
                "namespace": auto.k8s_namespace,
            }
        ]
        one(docs, "ServiceAccount", gateway_spec["serviceAccountName"])
        # Only the gateway talks to the API server.
        for w in workloads(docs):
            if component(w) != "gateway":
                assert pod_spec(w)["automountServiceAccountToken"] is False  # type: ignore[index]


@pytest.mark.parametrize("target", [*TARGETS])
def test_grace_periods_cover_the_drains(
    target: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    docs = rendered[target]
    cfg = config_of(docs)
    slowest_query_s = (max(c.latency_ms for c in cfg.gateway.classes) + cfg.gateway.grace_ms) / 1e3
    gw = pod_spec(one(docs, "StatefulSet", "tailgate-gateway"))
    assert gw is not None
    pre_stop = gw["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    # preStop, then the gateway's drain bound, then its HTTP runner's shutdown timeout (5 s).
    needed_s = float(pre_stop[1]) + slowest_query_s + DRAIN_MARGIN_S + 5.0
    assert gw["terminationGracePeriodSeconds"] >= needed_s
    # A task server drains its queue no shorter than a query may run, and the pod waits.
    assert cfg.taskserver.drain_timeout_s >= slowest_query_s
    ts = pod_spec(one(docs, "StatefulSet", "tailgate-taskserver"))
    assert ts is not None
    assert ts["terminationGracePeriodSeconds"] >= cfg.taskserver.drain_timeout_s + LEAVE_MARGIN_S


@pytest.mark.parametrize("target", [*TARGETS, "monitored"])
def test_pods_run_unprivileged(target: str, rendered: dict[str, list[dict[str, Any]]]) -> None:
    for w in workloads(rendered[target]):
        spec = pod_spec(w)
        assert spec is not None
        where = f"{target}: {w['kind']}/{w['metadata']['name']}"
        pod_sc = spec["securityContext"]
        assert pod_sc["runAsNonRoot"] is True and pod_sc["runAsUser"] != 0, where
        assert pod_sc["seccompProfile"]["type"] == "RuntimeDefault", where
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["capabilities"] == {"drop": ["ALL"]}, where
            assert "runAsUser" not in sc and "privileged" not in sc, where
            assert "cpu" not in c["resources"].get("limits", {}), f"{where}: CPU throttling"
            assert "memory" in c["resources"]["limits"], where
        for c in spec.get("initContainers", []):
            # The one root step: handing the edge store's host directory to the agent.
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["capabilities"]["drop"] == ["ALL"], where
            assert set(sc["capabilities"].get("add", [])) <= {"CHOWN", "FOWNER"}, where
            assert c["command"][:2] == ["sh", "-c"] and "chown" in c["command"][2], where


def test_images_are_the_ones_built_here(rendered: dict[str, list[dict[str, Any]]]) -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    used = set()
    for target in TARGETS:
        for w in workloads(rendered[target]):
            spec = pod_spec(w)
            assert spec is not None
            for c in spec["containers"] + spec.get("initContainers", []):
                name, tag = split_image(c["image"])
                assert name.startswith(IMAGE_REGISTRY), c["image"]
                assert tag == version, f"{c['image']}: tag the project version {version}"
                image = name.removeprefix(IMAGE_REGISTRY)
                assert (DEPLOY / "docker" / DOCKERFILES[image]).is_file(), image
                used.add(image)
    assert used == set(DOCKERFILES)


def test_gpu_overlay_asks_for_one_gpu(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["gpu"]
    spec = pod_spec(one(docs, "StatefulSet", "tailgate-taskserver"))
    assert spec is not None
    (c,) = spec["containers"]
    assert split_image(c["image"])[0] == IMAGE_REGISTRY + "taskserver-gpu"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    args = build_parser().parse_args(argv_of(docs, c)[1:])
    assert args.pipeline and args.providers == "cuda"
    # The device plugin assigns the GPU; a pod-level NVIDIA_VISIBLE_DEVICES would bypass it.
    assert "NVIDIA_VISIBLE_DEVICES" not in {v["name"] for v in c["env"]}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    # Nothing else asks for a GPU, and the base asks for none.
    base = pod_spec(one(rendered["base"], "StatefulSet", "tailgate-taskserver"))
    assert base is not None and "nvidia.com/gpu" not in base["containers"][0]["resources"]["limits"]


def test_edge_agents_take_their_cluster_from_the_node_label(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    docs = rendered["edge-k3s"]
    agents = [d for d in docs if d["kind"] == "DaemonSet"]
    assert len(agents) >= 2
    clusters = []
    for ds in agents:
        spec = pod_spec(ds)
        assert spec is not None
        where = f"DaemonSet/{ds['metadata']['name']}"
        cluster = spec["nodeSelector"]["tailgate.io/cluster"]
        assert spec["nodeSelector"]["tailgate.io/edge-node"] == "pi", where
        assert ds["spec"]["selector"]["matchLabels"]["tailgate.io/cluster"] == cluster, where
        assert template_labels(ds)["tailgate.io/cluster"] == cluster, where
        assert ds["metadata"]["name"] == f"tailgate-edge-agent-{cluster}", where
        args = build_parser().parse_args(argv_of(docs, spec["containers"][0])[1:])
        assert args.cluster == cluster, where
        assert args.id == FIELD_SAMPLES["spec.nodeName"], f"{where}: the node is the agent"
        assert args.gateway == ",".join(gateway_urls(docs)), where
        AgentConfig(cluster=cluster)  # a valid agent cluster name
        assert re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", cluster), where
        clusters.append(cluster)
    assert len(set(clusters)) == len(clusters)
    # Central queueing: one gateway owns each agent, so the edge overlay runs one replica.
    assert one(docs, "StatefulSet", "tailgate-gateway")["spec"]["replicas"] == 1
    edge_pool = config_of(docs).gateway.pool_named("edge")
    assert edge_pool is not None and edge_pool.queueing == "central"
    # The gateway and the task servers stay off the Pis.
    for name in ("tailgate-gateway", "tailgate-taskserver"):
        spec = pod_spec(one(docs, "StatefulSet", name))
        assert spec is not None
        terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        expr = terms["nodeSelectorTerms"][0]["matchExpressions"]
        assert {"key": "tailgate.io/edge-node", "operator": "DoesNotExist"} in expr


def test_the_shipped_token_is_a_placeholder_the_gateway_refuses(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    for target in TARGETS:
        secret = one(rendered[target], "Secret", "tailgate-agent-token")
        token = base64.b64decode(secret["data"]["token"]).decode()
        with pytest.raises(ValueError, match="token"):
            check_token(token)  # so a deployment that forgot to set one fails at start


def test_grafana_dashboard_configmap_is_the_dashboard_file(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    dashboard = DEPLOY / "grafana" / "tailgate-dashboard.json"
    (cm,) = rendered["dashboard"]
    assert cm["kind"] == "ConfigMap" and cm["metadata"]["namespace"] == "tailgate"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["data"] == {dashboard.name: dashboard.read_text()}
    # One copy of the dashboard: nothing under deploy/k8s holds another.
    assert not list(K8S.rglob("*.json"))


def test_k8s_tailgate_toml_is_a_valid_config() -> None:
    path = K8S / "base" / "tailgate.toml"
    cfg = parse_config(tomllib.loads(path.read_text()), str(path), env={})
    assert cfg.gateway.host == cfg.taskserver.host == "0.0.0.0"
