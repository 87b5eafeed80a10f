"""The container images (deploy/docker), read statically: no Docker engine is needed.

Each Dockerfile's base images are pinned, its final stage runs as a non-root user, has a
HEALTHCHECK that asks a route the service really serves, EXPOSEs the ports the config
defaults to, and starts the `tailgate` CLI with arguments its parser accepts. Every pip
install is held to deploy/docker/constraints.txt, which pins what pyproject.toml asks for.
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from deploy.cli import build_parser, cmd_edge_agent_run, cmd_gateway, cmd_taskserver
from deploy.config import parse_config
from edge_agent.config import AgentConfig
from gateway.app import ROUTES
from gateway.config import GatewayConfig
from taskserver.config import TaskServerConfig
from taskserver.server import _metrics_routes

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "deploy" / "docker"
IMAGES = {
    "gateway.Dockerfile": "gateway",
    "taskserver-cpu.Dockerfile": "taskserver",
    "taskserver-gpu.Dockerfile": "taskserver",
    "edge-agent.Dockerfile": "edge-agent",
}
COMMANDS = {"gateway": cmd_gateway, "taskserver": cmd_taskserver, "edge-agent": cmd_edge_agent_run}
CONFIG_PATH = "/etc/tailgate/tailgate.toml"
CONSTRAINTS = "deploy/docker/constraints.txt"
GATEWAY_ROUTES = {path for method, path, _ in ROUTES if method == "GET"}
SERVER_ROUTES = set(_metrics_routes(None, None))  # type: ignore[arg-type]
# Linux, as in every image; the Python of the slim images and of Ubuntu 24.04.
MARKER_ENVS = [
    {"sys_platform": "linux", "platform_system": "Linux", "python_version": v}
    for v in ("3.11", "3.12")
]


@dataclass(frozen=True)
class Instruction:
    """One Dockerfile instruction, continuation lines joined, in build stage `stage`."""

    keyword: str
    value: str
    stage: int


def parse_dockerfile(path: Path) -> list[Instruction]:
    """The instructions of a Dockerfile (comments dropped, `\\` continuations joined)."""
    out: list[Instruction] = []
    stage, buf = -1, ""
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("#"):
            continue  # a comment, also between continuation lines
        buf += line.rstrip()
        if buf.endswith("\\"):
            buf = buf[:-1] + " "
            continue
        if buf.strip():
            keyword, _, value = buf.strip().partition(" ")
            keyword = keyword.upper()
            stage += keyword == "FROM"
            out.append(Instruction(keyword, value.strip(), stage))
        buf = ""
    return out


def global_args(ins: list[Instruction]) -> dict[str, str]:
    """ARG defaults declared before the first FROM (the ones FROM may use)."""
    args = {}
    for i in ins:
        if i.keyword == "FROM":
            break
        if i.keyword == "ARG":
            name, _, default = i.value.partition("=")
            args[name] = default
    return args


def final(ins: list[Instruction], keyword: str) -> list[Instruction]:
    """The instructions of the final stage with that keyword."""
    last = max(i.stage for i in ins)
    return [i for i in ins if i.stage == last and i.keyword == keyword]


def exec_form(value: str) -> list[str]:
    argv = json.loads(value)
    assert isinstance(argv, list) and all(isinstance(a, str) for a in argv), value
    return argv


def docker_config() -> Any:
    path = DOCKER / "tailgate.toml"
    return parse_config(tomllib.loads(path.read_text()), str(path), env={})


@pytest.fixture(scope="module", params=sorted(IMAGES))
def dockerfile(request: pytest.FixtureRequest) -> tuple[str, list[Instruction]]:
    name = request.param
    return name, parse_dockerfile(DOCKER / name)


# ----------------------------------------------------------------------------- images


def test_base_images_are_pinned(dockerfile: tuple[str, list[Instruction]]) -> None:
    name, ins = dockerfile
    args = global_args(ins)
    stages: set[str] = set()
    for i in (i for i in ins if i.keyword == "FROM"):
        image, *alias = re.split(r"\s+[Aa][Ss]\s+", i.value)
        image = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)], image)
        if image not in stages:
            repo, _, tag = image.partition("@")[0].rpartition(":")
            assert repo and "/" not in tag, f"{name}: {image} has no tag"
            assert tag != "latest" and re.match(r"\d+\.\d+", tag), f"{name}: {image} unpinned"
        stages.update(alias)


def test_final_stage_runs_as_a_numeric_non_root_user(
    dockerfile: tuple[str, list[Instruction]],
) -> None:
    name, ins = dockerfile
    users = final(ins, "USER")
    assert users, f"{name}: the final stage has no USER"
    uid, _, gid = users[-1].value.partition(":")
    # Numeric, so that Kubernetes' runAsNonRoot can check it; and the one the pods name.
    assert uid.isdigit() and int(uid) != 0 and gid.isdigit() and int(gid) != 0, name
    created = " ".join(i.value for i in final(ins, "RUN"))
    assert f"--uid {uid}" in created and f"--gid {gid}" in created, name
    assert uid == str(k8s_run_as_user(IMAGES[name])), f"{name}: USER vs the pods' runAsUser"


def k8s_run_as_user(role: str) -> int:
    """runAsUser of the pods of that role in deploy/k8s (base and the edge-agent unit)."""
    found = set()
    for path in (REPO / "deploy" / "k8s").rglob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            labels = ((doc or {}).get("spec", {}).get("template", {}).get("metadata", {})).get(
                "labels", {}
            )
            if labels.get("app.kubernetes.io/component") == role:
                found.add(doc["spec"]["template"]["spec"]["securityContext"]["runAsUser"])
    assert len(found) == 1, f"{role}: runAsUser {found}"
    return found.pop()


def test_healthcheck_asks_what_the_service_serves(
    dockerfile: tuple[str, list[Instruction]],
) -> None:
    name, ins = dockerfile
    (check,) = final(ins, "HEALTHCHECK")
    options, _, command = check.value.partition(" CMD ")
    assert re.search(r"--interval=\d+s", options), name
    argv = exec_form(command)
    assert argv[:2] == ["python", "-c"], f"{name}: no curl in the image: check with Python"
    compile(argv[2], f"{name} HEALTHCHECK", "exec")
    role, cfg = IMAGES[name], docker_config()
    if role == "edge-agent":
        (port,) = re.findall(r"\('127\.0\.0\.1', (\d+)\)", argv[2])
        assert int(port) == AgentConfig().port, name
        return
    port, path = re.findall(r"http://127\.0\.0\.1:(\d+)(/\w+)", argv[2])[0]
    if role == "gateway":
        assert (int(port), path) == (cfg.gateway.port, "/livez"), name
        assert path in GATEWAY_ROUTES, f"{name}: the gateway serves no GET {path}"
    else:
        assert int(port) == cfg.taskserver.metrics_port != 0, name
        assert path in SERVER_ROUTES, f"{name}: a task server serves no {path}"


def test_expose_matches_the_config_defaults(dockerfile: tuple[str, list[Instruction]]) -> None:
    name, ins = dockerfile
    exposed = {int(p.split("/")[0]) for i in final(ins, "EXPOSE") for p in i.value.split()}
    role, cfg = IMAGES[name], docker_config()
    if role == "gateway":
        assert exposed == {GatewayConfig().port} == {cfg.gateway.port}, name
    elif role == "taskserver":
        assert TaskServerConfig().port == cfg.taskserver.port, name
        assert exposed == {cfg.taskserver.port, cfg.taskserver.metrics_port}, name
    else:
        assert exposed == {AgentConfig().port}, name


def test_entrypoint_is_the_tailgate_cli(dockerfile: tuple[str, list[Instruction]]) -> None:
    name, ins = dockerfile
    (entry,) = final(ins, "ENTRYPOINT")
    (cmd,) = final(ins, "CMD")
    argv = exec_form(entry.value) + exec_form(cmd.value)
    assert argv[0] == "tailgate", name
    args = build_parser().parse_args(argv[1:])
    role = IMAGES[name]
    assert args.func is COMMANDS[role], f"{name}: {argv}"
    (stop,) = final(ins, "STOPSIGNAL")
    assert stop.value == "SIGTERM", f"{name}: SIGTERM drains"
    if role == "edge-agent":
        assert args.host == "0.0.0.0" and args.port == AgentConfig().port, name
        return
    # The gateway and task servers load /etc/tailgate/tailgate.toml ($TAILGATE_CONFIG),
    # shipped in the image from deploy/docker/tailgate.toml.
    env = " ".join(i.value for i in final(ins, "ENV"))
    assert f"TAILGATE_CONFIG={CONFIG_PATH}" in env, name
    copies = [i.value.split() for i in final(ins, "COPY")]
    assert ["deploy/docker/tailgate.toml", CONFIG_PATH] in copies, name


def test_pip_installs_are_constrained(dockerfile: tuple[str, list[Instruction]]) -> None:
    name, ins = dockerfile
    installs = [i.value for i in ins if i.keyword == "RUN" and "pip install" in i.value]
    assert installs, name
    for run in installs:
        for part in run.split("&&"):
            if "pip install" in part:
                assert f"-c {CONSTRAINTS}" in part or "--no-deps ." in part, f"{name}: {part}"


def test_copied_sources_exist_and_are_in_the_build_context(
    dockerfile: tuple[str, list[Instruction]],
) -> None:
    name, ins = dockerfile
    patterns = dockerignore()
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    for i in (i for i in ins if i.keyword == "COPY" and not i.value.startswith("--from")):
        *sources, _dest = i.value.split()
        for src in sources:
            path = REPO / src
            assert path.exists(), f"{name}: COPY {src}: no such file"
            if path.is_file():
                files = [path]
            else:  # a package: what setuptools installs from it must reach the build
                data = setuptools["package-data"].get(src, [])
                files = [*path.rglob("*.py"), *(f for g in data for f in path.glob(g))]
            for f in files:
                rel = f.relative_to(REPO).as_posix()
                if "__pycache__" not in rel:
                    assert not ignored(rel, patterns), f"{name}: {rel} is .dockerignored"


def test_gpu_image_exposes_the_gpu_to_onnxruntime() -> None:
    ins = parse_dockerfile(DOCKER / "taskserver-gpu.Dockerfile")
    base = global_args(ins)["CUDA_IMAGE"]
    assert base.startswith("nvidia/cuda:") and "-cudnn-runtime-" in base
    env = " ".join(i.value for i in final(ins, "ENV"))
    assert "NVIDIA_VISIBLE_DEVICES=all" in env
    assert "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in env
    runs = " ".join(i.value for i in ins if i.keyword == "RUN")
    assert '".[gpu]"' in runs and "[onnx" not in runs, "onnxruntime-gpu only, not both builds"
    (cmd,) = final(ins, "CMD")
    assert exec_form(cmd.value)[-2:] == ["--providers", "cuda"]


def test_edge_image_stays_light() -> None:
    ins = parse_dockerfile(DOCKER / "edge-agent.Dockerfile")
    runs = [i.value for i in ins if i.keyword == "RUN" and "pip install" in i.value]
    assert any("-r deploy/edge/requirements.txt" in r for r in runs)
    assert all("-r deploy/edge/requirements.txt" in r or "--no-deps ." in r for r in runs)
    heavy = {"numpy", "onnxruntime", "onnxruntime-gpu", "torch", "kubernetes"}
    assert not {r.name for r in edge_requirements()} & heavy
    copies = [i.value.split()[0] for i in ins if i.keyword == "COPY"]
    assert "onnx_models" not in copies, "the ONNX models stay out of the edge image"


# ----------------------------------------------------------------------------- pins


def pins() -> dict[str, str]:
    out = {}
    for line in (REPO / CONSTRAINTS).read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            m = re.fullmatch(r"([A-Za-z0-9._-]+)==([0-9][A-Za-z0-9.+!-]*)", line)
            assert m, f"constraints.txt: {line!r} is not name==version"
            out[canonicalize_name(m.group(1))] = m.group(2)
    return out


def edge_requirements() -> list[Requirement]:
    lines = (REPO / "deploy" / "edge" / "requirements.txt").read_text().splitlines()
    return [Requirement(x.split("#")[0]) for x in lines if x.split("#")[0].strip()]


def image_requirements() -> list[Requirement]:
    """What the images install: pyproject's dependencies, the extras they name, the edge's."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras: set[str] = set()
    for name in IMAGES:
        for m in re.finditer(r'"\.\[([\w,-]+)\]"', (DOCKER / name).read_text()):
            extras.update(m.group(1).split(","))
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in sorted(extras):
        reqs += [Requirement(r) for r in project["optional-dependencies"][extra]]
    return reqs + edge_requirements()


def test_constraints_pin_every_dependency_within_its_range() -> None:
    pinned = pins()
    for req in image_requirements():
        if req.marker is not None and not any(req.marker.evaluate(e) for e in MARKER_ENVS):
            continue
        name = canonicalize_name(req.name)
        assert name in pinned, f"{req.name} is not pinned in {CONSTRAINTS}"
        assert req.specifier.contains(pinned[name], prereleases=True), (
            f"{req.name}=={pinned[name]} is outside {req}"
        )


def test_docker_tailgate_toml_is_a_valid_config() -> None:
    cfg = docker_config()
    assert cfg.gateway.host == cfg.taskserver.host == "0.0.0.0", "reachable from outside"


# ----------------------------------------------------------------------------- .dockerignore


def dockerignore() -> list[tuple[bool, re.Pattern[str]]]:
    """(negated, regex) per .dockerignore line, in order (Go filepath.Match plus `**`)."""
    out = []
    for line in (REPO / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        neg = line.startswith("!")
        pattern = line.lstrip("!").strip("/")
        rx = ""
        i = 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                rx, i = rx + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                rx, i = rx + ".*", i + 2
            elif pattern[i] == "*":
                rx, i = rx + "[^/]*", i + 1
            elif pattern[i] == "?":
                rx, i = rx + "[^/]", i + 1
            elif pattern[i] == "[":
                end = pattern.index("]", i + 2)
                body = pattern[i + 1 : end]
                rx, i = rx + "[" + ("^" + body[1:] if body[0] in "!^" else body) + "]", end + 1
            else:
                rx, i = rx + re.escape(pattern[i]), i + 1
        out.append((neg, re.compile(rx)))
    return out


def ignored(path: str, patterns: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Whether the build context leaves `path` out: the last pattern matching it, or a parent."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    result = False
    for neg, rx in patterns:
        if any(rx.fullmatch(p) for p in prefixes):
            result = not neg
    return result


def test_dockerignore_keeps_the_context_small() -> None:
    patterns = dockerignore()
    left_out = (".venv/bin/python", ".git/HEAD", "tests/unit/test_images.py", "gateway/x.pyc")
    for path in (*left_out, "deploy/k8s/base/gateway.yaml", "edge_agent/edge.db"):
        assert ignored(path, patterns), path
    for path in ("gateway/app.py", "deploy/docker/constraints.txt", "pyproject.toml"):
        assert not ignored(path, patterns), path


@pytest.mark.parametrize("dockerfile", sorted(IMAGES))
def test_the_build_stage_compiles_the_frame_check_and_fails_without_it(dockerfile: str) -> None:
    # Without a compiler the optional extension is skipped silently and every frame takes
    # the Python walk, several times slower: the image build must have gcc and check it.
    build = [
        i for i in parse_dockerfile(DOCKER / dockerfile) if i.stage == 0 and i.keyword == "RUN"
    ]
    text = " ".join(i.value for i in build)
    assert "gcc" in text or "build-essential" in text, dockerfile
    check = 'python -c "import taskserver._framecheck"'
    assert any("pip install" in i.value and check in i.value for i in build), dockerfile
