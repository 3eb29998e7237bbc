"""Rendering the kustomize overlays and reading the objects they hold (for tests/k8s)."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "k8s"
OVERLAYS = ("cpu", "gpu", "qwen2.5-coder")
COMPONENTS = ("model-pvc", "manual-scaling")

# The three services: the image each runs, the module its image starts, its gRPC port.
SERVICES = {
    "draft": {"image": "specdec-draft", "module": "draft_service", "port": 50051,
              "proto": "draft.proto", "grpc_service": "DraftService"},
    "target": {"image": "specdec-target", "module": "target_service", "port": 50052,
               "proto": "target.proto", "grpc_service": "TargetService"},
    "coordinator": {"image": "specdec-coordinator", "module": "coordinator", "port": 50050,
                    "proto": "generate.proto", "grpc_service": "Generator"},
}
# Kinds the Kubernetes JSON schemas do not know; each is checked field by field instead.
CUSTOM_KINDS = {("ray.io/v1", "RayService")}
RAY_CONTAINERS = {"ray-head", "ray-worker"}  # containers[0] of the RayService's pods


K8S_VERSION = "1.32.0"  # the kubernetes-validate schemas to use (kubectl is v1.32)


def validate(obj: dict) -> None:
    """Validate one object against the Kubernetes JSON schemas, strictly (unknown fields
    are errors); raise AssertionError naming the object and the failing path."""
    import kubernetes_validate

    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        where = "/".join(str(p) for p in e.path)
        raise AssertionError(f"{obj['kind']}/{obj['metadata'].get('name')}: {where}: "
                             f"{e.message}") from None


class NoKustomize(Exception):
    pass


def kustomize_command() -> list[str]:
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    raise NoKustomize("neither kubectl (with its built-in kustomize) nor kustomize is on "
                      "PATH; install kubectl >= 1.27 to render k8s/")


def render(path: Path) -> list[dict]:
    """`kubectl kustomize PATH` as a list of objects."""
    proc = subprocess.run([*kustomize_command(), str(path)], capture_output=True, text=True,
                          timeout=120)
    if proc.returncode != 0:
        raise AssertionError(f"kustomize failed for {path}:\n{proc.stderr}")
    return [o for o in yaml.safe_load_all(proc.stdout) if o]


def render_with_components(workdir: Path, overlay: str, components: list[str]) -> list[dict]:
    """An overlay plus components, through a throw-away kustomization in `workdir`
    (kustomize accepts only relative paths to other kustomizations)."""
    rel = lambda p: os.path.relpath(p, workdir)  # noqa: E731
    doc = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
           "namespace": "specdec",  # as in the overlay a user adds the components to
           "resources": [rel(K8S / "overlays" / overlay)],
           "components": [rel(K8S / "components" / c) for c in components]}
    (workdir / "kustomization.yaml").write_text(yaml.safe_dump(doc))
    return render(workdir)


# ---- pod templates ---------------------------------------------------------------------

@dataclass
class Pods:
    """One pod template and where it lives."""

    owner: dict
    where: str  # "Deployment/specdec-draft", "RayService/x head", ...
    template: dict
    group: str  # draft | target | coordinator | other

    @property
    def labels(self) -> dict:
        return self.template.get("metadata", {}).get("labels", {}) or {}

    @property
    def spec(self) -> dict:
        return self.template["spec"]

    def containers(self, init: bool = True) -> Iterator[dict]:
        yield from self.spec.get("containers", [])
        if init:
            yield from self.spec.get("initContainers", [])

    def is_init(self, container: dict) -> bool:
        return container in self.spec.get("initContainers", [])


def image_name(image: str) -> str:
    """'registry.example.com/x/specdec-draft:0.1.0' -> 'specdec-draft'."""
    image = image.split("@", 1)[0]
    last = image.rsplit("/", 1)[-1]
    return last.split(":", 1)[0]


def image_tag(image: str) -> str:
    last = image.split("@", 1)[0].rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else ""


def _group_of(template: dict) -> str:
    images = {image_name(c["image"]) for c in template["spec"].get("containers", [])}
    for group, svc in SERVICES.items():
        if svc["image"] in images:
            return group
    return "other"


def pod_templates(objs: list[dict]) -> list[Pods]:
    out = []
    for o in objs:
        kind, name = o["kind"], o["metadata"]["name"]
        if kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
            t = o["spec"]["template"]
            out.append(Pods(o, f"{kind}/{name}", t, _group_of(t)))
        elif kind == "Pod":
            out.append(Pods(o, f"Pod/{name}", o, _group_of(o)))
        elif kind == "RayService":
            rc = o["spec"]["rayClusterConfig"]
            t = rc["headGroupSpec"]["template"]
            out.append(Pods(o, f"RayService/{name} head", t, _group_of(t)))
            for g in rc.get("workerGroupSpecs", []):
                t = g["template"]
                out.append(Pods(o, f"RayService/{name} {g['groupName']}", t, _group_of(t)))
    return out


def by_kind(objs: list[dict], kind: str) -> list[dict]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[dict], kind: str, name: str) -> dict:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


# ---- label selectors -------------------------------------------------------------------

def selector_matches(selector: dict | None, labels: dict) -> bool:
    """A metav1.LabelSelector (or a plain Service selector map) against labels. An empty
    selector matches everything; None (absent) matches nothing."""
    if selector is None:
        return False
    if "matchLabels" not in selector and "matchExpressions" not in selector:
        selector = {"matchLabels": selector}  # a Service's selector map
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


# ---- command lines ---------------------------------------------------------------------

def env_of(pods: Pods, container: dict, objs: list[dict]) -> dict[str, str]:
    """The environment kubelet gives the container (ConfigMaps from the render)."""
    env: dict[str, str] = {}
    for src in container.get("envFrom", []):
        ref = src.get("configMapRef")
        if ref:
            cm = one(objs, "ConfigMap", ref["name"])
            env.update({k: str(v) for k, v in (cm.get("data") or {}).items()})
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = str(e["value"])
    return env


VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def expand(arg: str, env: dict[str, str]) -> str:
    """kubelet's $(VAR) expansion; an unknown reference stays as it is (as kubelet does)."""
    return VAR_REF.sub(lambda m: env.get(m.group(1), m.group(0)), arg)


def flags(args: list[str]) -> dict[str, str]:
    """['--port=1', '--x', 'y', '--flag'] -> {'--port': '1', '--x': 'y', '--flag': ''}."""
    out: dict[str, str] = {}
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("--"):
            if "=" in a:
                k, v = a.split("=", 1)
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                k, v = a, args[i + 1]
                i += 1
            else:
                k, v = a, ""
            out[k] = v
        i += 1
    return out


def prestop_seconds(container: dict) -> float:
    """Seconds a preStop hook holds SIGTERM back (exec `sleep N` or the sleep action)."""
    pre = (container.get("lifecycle") or {}).get("preStop") or {}
    if "sleep" in pre:
        return float(pre["sleep"]["seconds"])
    cmd = (pre.get("exec") or {}).get("command") or []
    if cmd[:1] == ["sleep"] and len(cmd) == 2:
        return float(cmd[1])
    assert not pre, f"unrecognised preStop hook {pre}: teach prestop_seconds its length"
    return 0.0


# ---- quantities ------------------------------------------------------------------------

_SUFFIX = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def quantity(q) -> float:
    m = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(q))
    assert m and m.group(2) in _SUFFIX, f"not a quantity: {q!r}"
    return float(m.group(1)) * _SUFFIX[m.group(2)]


# ---- the Python side -------------------------------------------------------------------

def grpc_service_name(service: str) -> str:
    """'specdec.v1.DraftService', read from the .proto (no generated code needed)."""
    text = (REPO / "protos" / "specdec" / "v1" / SERVICES[service]["proto"]).read_text()
    package = re.search(r"^package\s+([\w.]+)\s*;", text, re.M).group(1)
    name = SERVICES[service]["grpc_service"]
    assert re.search(rf"^service\s+{name}\s*{{", text, re.M), f"no service {name} in proto"
    return f"{package}.{name}"


def module_source(module: str) -> ast.Module:
    path = REPO / Path(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    return ast.parse(path.read_text(), str(path))


def module_constant(module: str, name: str):
    """A module-level constant (a literal) read from the source, without importing it."""
    for node in module_source(module).body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{module}.{name} is not a module-level literal")


def module_defines(module: str, name: str) -> bool:
    return any(isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
               and n.name == name for n in module_source(module).body)


def config_keys_read_by(module: str, function: str) -> set[str]:
    """Keys `function` reads as config["..."] (what `args` must hold)."""
    for node in module_source(module).body:
        if isinstance(node, ast.FunctionDef) and node.name == function:
            return {n.slice.value for n in ast.walk(node)
                    if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant)
                    and isinstance(n.slice.value, str)}
    raise AssertionError(f"no function {function} in {module}")


def serve_deployment_name(module: str, attr: str) -> str:
    """The name of the Serve deployment `module.attr` (its name= option), read from the
    deployment object itself (it may be built by a call, not a decorator)."""
    import importlib

    deployment = getattr(importlib.import_module(module), attr, None)
    if deployment is None or not hasattr(deployment, "name"):
        raise AssertionError(f"no Serve deployment {attr} in {module}")
    return deployment.name


def constraint(package: str) -> str:
    """The exact version constraints.txt pins for `package`."""
    for line in (REPO / "constraints.txt").read_text().splitlines():
        m = re.fullmatch(rf"{re.escape(package)}==(\S+)", line.strip(), re.I)
        if m:
            return m.group(1)
    raise AssertionError(f"{package} is not pinned in constraints.txt")


@dataclass
class Rendered:
    name: str
    objs: list[dict] = field(default_factory=list)

    @property
    def pods(self) -> list[Pods]:
        return pod_templates(self.objs)

    def group(self, group: str) -> list[Pods]:
        return [p for p in self.pods if p.group == group]
