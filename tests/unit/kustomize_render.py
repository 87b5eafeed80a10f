"""A small kustomize renderer, for checking deploy/k8s without the kustomize binary.

It implements the part of kustomize v5 that the manifests use, in kustomize's order:
resources (files and directories), components, ConfigMap and Secret generators (files and
literals; behavior create, merge, replace), strategic-merge patches, namespace,
namePrefix/nameSuffix, replicas and images. Anything else in a kustomization raises
``Unsupported``, so a manifest that outgrows the renderer fails loudly instead of being
checked half. Two known differences from kustomize: generated names get no content hash,
and no reference is renamed (the layout renames only resources nothing refers to); the
tests compare this renderer with ``kubectl kustomize`` where that is installed.

Like kustomize, it refuses a file outside the directory of the kustomization that names
it (the load restrictor) and a directory that contains one it is already building.
"""

from __future__ import annotations

import base64
import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = ["Rendered", "Unsupported", "render"]

KUSTOMIZATION_KEYS = {
    "apiVersion",
    "kind",
    "namespace",
    "resources",
    "components",
    "configMapGenerator",
    "secretGenerator",
    "generatorOptions",
    "patches",
    "replicas",
    "images",
    "namePrefix",
    "nameSuffix",
}
GENERATOR_KEYS = {"name", "namespace", "files", "literals", "behavior", "options", "type"}
CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "PriorityClass",
    "StorageClass",
    "RuntimeClass",
    "PersistentVolume",
    "IngressClass",
}
SCALABLE = {"Deployment", "StatefulSet", "ReplicaSet", "ReplicationController"}
POD_SPEC_PATHS = {
    "Pod": ("spec",),
    "Deployment": ("spec", "template", "spec"),
    "StatefulSet": ("spec", "template", "spec"),
    "DaemonSet": ("spec", "template", "spec"),
    "ReplicaSet": ("spec", "template", "spec"),
    "Job": ("spec", "template", "spec"),
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
}
# Strategic merge: the key that identifies an item of these lists (else a list replaces).
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "imagePullSecrets": "name",
}


class Unsupported(Exception):
    """The kustomization uses something this renderer does not implement (or forbids)."""


@dataclass
class Rendered:
    """The resources of a build and every kustomization directory it read."""

    resources: list[dict[str, Any]]
    visited: set[Path] = field(default_factory=set)


@dataclass
class _Res:
    doc: dict[str, Any]
    generated: bool = False


def render(root: Path) -> Rendered:
    """Build the kustomization in directory `root`, as `kubectl kustomize root` would."""
    visited: set[Path] = set()
    out = _build(root.resolve(), [], visited, component=False, building=())
    return Rendered([r.doc for r in out], visited)


def _load_kustomization(d: Path, component: bool) -> dict[str, Any]:
    path = d / "kustomization.yaml"
    if not path.is_file():
        raise Unsupported(f"{d}: no kustomization.yaml")
    k = yaml.safe_load(path.read_text()) or {}
    unknown = set(k) - KUSTOMIZATION_KEYS
    if unknown:
        raise Unsupported(f"{path}: unsupported keys {sorted(unknown)}")
    want = "Component" if component else "Kustomization"
    if k.get("kind", "Kustomization") != want:
        raise Unsupported(f"{path}: expected kind {want}, got {k.get('kind')!r}")
    return k


def _inside(d: Path, entry: str) -> Path:
    """A file a kustomization names: it must lie at or below its directory."""
    p = (d / entry).resolve()
    if not p.is_relative_to(d):
        raise Unsupported(f"{d}: file {entry!r} is outside the kustomization root")
    return p


def _docs(path: Path) -> list[_Res]:
    return [_Res(doc) for doc in yaml.safe_load_all(path.read_text()) if doc]


def _build(
    d: Path, acc: list[_Res], visited: set[Path], *, component: bool, building: tuple[Path, ...]
) -> list[_Res]:
    for root in building:
        if root.is_relative_to(d):
            raise Unsupported(f"cycle: {d} contains {root}, which is being built")
    building = (*building, d)
    visited.add(d)
    k = _load_kustomization(d, component)
    res = acc if component else []
    for entry in k.get("resources", []):
        p = (d / entry).resolve()
        if p.is_dir():
            res += _build(p, [], visited, component=False, building=building)
        else:
            res += _docs(_inside(d, entry))
    for entry in k.get("components", []):
        res = _build((d / entry).resolve(), res, visited, component=True, building=building)
    options = k.get("generatorOptions", {})
    for gen in k.get("configMapGenerator", []):
        res = _generate(d, gen, options, "ConfigMap", res)
    for gen in k.get("secretGenerator", []):
        res = _generate(d, gen, options, "Secret", res)
    for patch in k.get("patches", []):
        _patch(d, patch, res)
    if "namespace" in k:
        _set_namespace(res, k["namespace"])
    if "namePrefix" in k or "nameSuffix" in k:
        for r in res:
            meta = r.doc["metadata"]
            meta["name"] = f"{k.get('namePrefix', '')}{meta['name']}{k.get('nameSuffix', '')}"
    for rep in k.get("replicas", []):
        hits = [r for r in res if r.doc["kind"] in SCALABLE and _name(r) == rep["name"]]
        if not hits:
            raise Unsupported(f"{d}: replicas: no workload named {rep['name']!r}")
        for r in hits:
            r.doc["spec"]["replicas"] = rep["count"]
    for image in k.get("images", []):
        _set_image(res, image)
    return res


def _name(r: _Res) -> str:
    return str(r.doc["metadata"]["name"])


def _generate(
    d: Path, gen: dict[str, Any], options: dict[str, Any], kind: str, res: list[_Res]
) -> list[_Res]:
    unknown = set(gen) - GENERATOR_KEYS
    if unknown:
        raise Unsupported(f"{d}: {kind} generator {gen.get('name')}: keys {sorted(unknown)}")
    data: dict[str, str] = {}
    for entry in gen.get("files", []):
        key, sep, path = entry.partition("=")
        if not sep:
            key, path = Path(entry).name, entry
        data[key] = _inside(d, path).read_text()
    for literal in gen.get("literals", []):
        key, sep, value = literal.partition("=")
        if not sep:
            raise Unsupported(f"{d}: literal {literal!r} is not key=value")
        data[key] = value
    labels = {**options.get("labels", {}), **gen.get("options", {}).get("labels", {})}
    meta: dict[str, Any] = {"name": gen["name"]}
    if "namespace" in gen:
        meta["namespace"] = gen["namespace"]
    if labels:
        meta["labels"] = labels
    doc: dict[str, Any] = {"apiVersion": "v1", "kind": kind, "metadata": meta}
    if kind == "Secret":
        doc["type"] = gen.get("type", "Opaque")
        doc["data"] = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    else:
        doc["data"] = data
    behavior = gen.get("behavior", "create")
    same = [r for r in res if r.doc["kind"] == kind and _name(r) == gen["name"]]
    if behavior == "create":
        if same:
            raise Unsupported(f"{d}: {kind} {gen['name']} already exists (use behavior)")
        return [*res, _Res(doc, generated=True)]
    if len(same) != 1 or not same[0].generated:
        raise Unsupported(f"{d}: {behavior}: no generated {kind} {gen['name']} to {behavior}")
    old = same[0].doc
    if behavior == "merge":
        old.setdefault("data", {}).update(doc["data"])
        if labels:
            old["metadata"].setdefault("labels", {}).update(labels)
    elif behavior == "replace":
        doc["metadata"] = {**old["metadata"], **meta}
        same[0].doc = doc
    else:
        raise Unsupported(f"{d}: behavior {behavior!r}")
    return res


def _patch(d: Path, entry: dict[str, Any], res: list[_Res]) -> None:
    if set(entry) - {"path", "patch"} or len(entry) != 1:
        raise Unsupported(f"{d}: patches: only a path or an inline patch, got {sorted(entry)}")
    text = _inside(d, entry["path"]).read_text() if "path" in entry else entry["patch"]
    for patch in yaml.safe_load_all(text):
        if not patch:
            continue
        if isinstance(patch, list):
            raise Unsupported(f"{d}: JSON 6902 patches are not supported")
        meta = patch.get("metadata", {})
        hits = [
            r
            for r in res
            if r.doc["kind"] == patch["kind"]
            and _name(r) == meta.get("name")
            and r.doc["metadata"].get("namespace") == meta.get("namespace")
        ]
        if len(hits) != 1:
            raise Unsupported(f"{d}: patch {patch['kind']}/{meta.get('name')} matches {len(hits)}")
        hits[0].doc = _merge(hits[0].doc, patch, "")


def _merge(dest: Any, patch: Any, key: str) -> Any:
    """Strategic merge of `patch` into `dest` (a copy; `key` is the field holding them)."""
    if isinstance(patch, dict) and isinstance(dest, dict):
        out = copy.deepcopy(dest)
        for k, v in patch.items():
            if k.startswith("$"):
                raise Unsupported(f"patch directive {k!r}")
            if v is None:
                out.pop(k, None)
            else:
                out[k] = _merge(out[k], v, k) if k in out else copy.deepcopy(v)
        return out
    if isinstance(patch, list) and isinstance(dest, list):
        mkey = MERGE_KEYS.get(key)
        if key == "ports" and all(isinstance(p, dict) for p in patch + dest):
            mkey = "containerPort" if any("containerPort" in p for p in dest) else "port"
        if mkey is None:
            return copy.deepcopy(patch)
        # kustomize's order: the patch's items (merged into their match), then the rest.
        old = {item[mkey]: item for item in dest}
        merged = [_merge(old[p[mkey]], p, "") if p[mkey] in old else p for p in patch]
        named = {p[mkey] for p in patch}
        return copy.deepcopy(merged + [item for item in dest if item[mkey] not in named])
    return copy.deepcopy(patch)


def _set_namespace(res: list[_Res], namespace: str) -> None:
    for r in res:
        doc = r.doc
        if doc["kind"] not in CLUSTER_SCOPED:
            doc["metadata"]["namespace"] = namespace
        if doc["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            # kustomize's default: only subjects in the default namespace (or none) follow.
            for s in doc.get("subjects", []):
                if s.get("kind") == "ServiceAccount" and s.get("namespace") in (None, "default"):
                    s["namespace"] = namespace


def split_image(image: str) -> tuple[str, str | None]:
    """'registry:5000/a/b:1.2' -> ('registry:5000/a/b', '1.2'); no tag -> None."""
    slash = image.rfind("/")
    colon = image.rfind(":")
    if colon > slash:
        return image[:colon], image[colon + 1 :]
    return image, None


def pod_spec(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The pod spec inside a workload (None for other kinds)."""
    path = POD_SPEC_PATHS.get(doc.get("kind", ""))
    if path is None:
        return None
    node: Any = doc
    for key in path:
        node = node.get(key, {})
    return node if isinstance(node, dict) else None


def _set_image(res: list[_Res], image: dict[str, Any]) -> None:
    if set(image) - {"name", "newName", "newTag"}:
        raise Unsupported(f"images: only name, newName and newTag, got {sorted(image)}")
    for r in res:
        spec = pod_spec(r.doc)
        if spec is None:
            continue
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            name, tag = split_image(c["image"])
            if name == image["name"]:
                tag = image.get("newTag", tag)
                c["image"] = image.get("newName", name) + (f":{tag}" if tag else "")
