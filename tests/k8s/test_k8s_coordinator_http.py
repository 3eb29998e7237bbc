"""The coordinator's HTTP API on the cluster: Serve's HTTP proxy on the HTTP port of every
Ray pod, the app at the root, the port on the client Service KubeRay builds, and the Ray
workers' readiness on GET /health through that port (the head keeps KubeRay's probes).

Which port is which comes from the code (coordinator.deploy.config, the routes of
coordinator.deploy.app) and from the Serve config, so a manifest that drifts from either fails.
"""

from __future__ import annotations

import ast
import re

import pytest
import yaml
from k8s_objects import by_kind, module_source

# What KubeRay's own worker readiness checks (ray-operator/controllers/ray/common/pod.go,
# initLivenessAndReadinessProbe): the raylet through the dashboard agent, and the Serve
# proxy's own health, which turns 503 while Serve drains the proxy.
RAYLET_HEALTH = (52365, "/api/local_raylet_healthz")
PROXY_HEALTH_PATH = "/-/healthz"
HEALTH_PATH = "/health"
URL = re.compile(r"https?://(?:localhost|127\.0\.0\.1):(\d+)(/[^\s|&;'\"]*)")


def http_routes() -> dict[str, set[str]]:
    """{path: methods} of the FastAPI routes coordinator.deploy.app declares (@HTTP.get(...))."""
    out: dict[str, set[str]] = {}
    for node in ast.walk(module_source("coordinator.deploy.app")):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                isinstance(node.func.value, ast.Name) and node.func.value.id == "HTTP" and \
                node.args and isinstance(node.args[0], ast.Constant):
            out.setdefault(node.args[0].value, set()).add(node.func.attr.upper())
    return out


def default_http_port() -> int:
    from coordinator.deploy.config import DEFAULT_HTTP_PORT

    return DEFAULT_HTTP_PORT


def probe_gets(probe: dict, named: dict[str, int]) -> list[tuple[int, str]]:
    """The (port, path) pairs a probe GETs, in order; each must succeed for the probe to
    pass (an exec probe's checks are joined by && only: no ||, no ;)."""
    if "httpGet" in probe:
        port = probe["httpGet"]["port"]
        return [(named[port] if isinstance(port, str) else port,
                 probe["httpGet"].get("path", "/"))]
    if "exec" in probe:
        command = probe["exec"]["command"]
        assert command[:2] == ["bash", "-c"] and len(command) == 3, command
        script = command[2]
        assert "||" not in script and ";" not in script, \
            f"every check must count: {script!r}"
        steps = [s.strip() for s in script.split("&&")]
        gets = []
        for step in steps:
            urls = URL.findall(step)
            assert len(urls) == 1, f"one URL per check: {step!r}"
            assert step.startswith(("wget ", "curl ")), step
            gets.append((int(urls[0][0]), urls[0][1]))
        return gets
    raise AssertionError(f"not an HTTP probe: {sorted(probe)}")


def ray_groups(rs: dict) -> list[tuple[str, dict]]:
    rc = rs["spec"]["rayClusterConfig"]
    return [("head", rc["headGroupSpec"])] + [(g["groupName"], g)
                                             for g in rc.get("workerGroupSpecs", [])]


def check_http_exposure(rs: dict) -> None:
    """Everything that makes the HTTP API reachable and probed; AssertionError if not."""
    serve = yaml.safe_load(rs["spec"]["serveConfigV2"])
    http = serve["http_options"]
    assert http.get("host") == "0.0.0.0", "the HTTP proxy must listen on the pod IP"
    port = http.get("port", 8000)
    assert port == default_http_port(), "http_options.port is the coordinator's HTTP port"
    (app,) = serve["applications"]
    assert app.get("route_prefix") == "/", "the API is at /v1/..., /health at the root"
    assert (app["args"].get("http_host"), app["args"].get("http_port")) == \
        (http["host"], port), "args.http_host/http_port must repeat http_options"
    routes = http_routes()
    assert "GET" in routes.get(HEALTH_PATH, set()), "the probes GET a route the app has"
    assert "POST" in routes.get("/v1/chat/completions", set())
    from ray.serve._private.constants import PROXY_MIN_DRAINING_PERIOD_S

    for group, spec in ray_groups(rs):
        ray = spec["template"]["spec"]["containers"][0]
        named = {p["name"]: p["containerPort"] for p in ray.get("ports", []) if "name" in p}
        assert named.get("http") == port, f"{group}: container port `http` = {port}"
        # A port named serve or serve-* would make KubeRay >= 1.6 replace the Service's
        # ports with the detected ones (and drop `http`), and move its proxy check there.
        assert not [n for n in named if n == "serve" or n.startswith("serve-")], group
        if group == "head":
            # KubeRay's probes (it submits the Serve config only once the head is Ready:
            # a readiness that needs the app would never pass).
            assert "readinessProbe" not in ray and "livenessProbe" not in ray, \
                "the head keeps KubeRay's own probes"
            continue
        ready = ray.get("readinessProbe")
        assert ready, f"{group}: no readinessProbe (KubeRay's does not GET /health)"
        gets = probe_gets(ready, named)
        assert (port, HEALTH_PATH) in gets, f"{group}: readiness must GET /health on {port}"
        # KubeRay's checks, which a readinessProbe of ours replaces, come first.
        assert RAYLET_HEALTH in gets and (port, PROXY_HEALTH_PATH) in gets, \
            f"{group}: KubeRay's raylet and proxy checks are gone: {gets}"
        assert gets.index(RAYLET_HEALTH) < gets.index((port, PROXY_HEALTH_PATH)) < \
            gets.index((port, HEALTH_PATH)), f"{group}: {gets}"
        # A draining proxy leaves the Service before Serve may stop it.
        drop_out = ready.get("periodSeconds", 10) * ready.get("failureThreshold", 3)
        assert drop_out < PROXY_MIN_DRAINING_PERIOD_S, f"{group}: {drop_out} s"
        timeouts = [float(t) for t in re.findall(r"-T\s*(\d+)", ready["exec"]["command"][2])]
        assert ready.get("timeoutSeconds", 1) >= sum(timeouts), f"{group}: probe timeout"
        # Liveness stays KubeRay's: a target outage (503 on /health) restarts nothing.
        live = ray.get("livenessProbe")
        assert live is None or HEALTH_PATH not in {p for _, p in probe_gets(live, named)}, \
            f"{group}: liveness on /health would restart the pods when the target is down"
    svc = rs["spec"]["serveService"]["spec"]
    ports = {p["name"]: p for p in svc["ports"]}
    assert "serve" in ports, "KubeRay 1.4/1.5 keep only the port named serve"
    assert ports.get("http", {}).get("port") == port, "the client Service's `http` port"
    assert ports["http"].get("targetPort", port) in (port, "http")
    assert ports["http"].get("protocol", "TCP") == "TCP"


@pytest.fixture(params=["cpu", "gpu"])
def rayservice(request, renders) -> dict:
    (rs,) = by_kind(renders[request.param].objs, "RayService")
    return rs


def test_http_api_is_exposed_and_probed(rayservice):
    pytest.importorskip("ray.serve")
    check_http_exposure(rayservice)


def _workers(rs):
    return rs["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"][
        "containers"][0]


def _serve(rs, edit):
    cfg = yaml.safe_load(rs["spec"]["serveConfigV2"])
    edit(cfg)
    rs["spec"]["serveConfigV2"] = yaml.safe_dump(cfg)


def _probe(rs, old, new):
    cmd = _workers(rs)["readinessProbe"]["exec"]["command"]
    assert old in cmd[2]
    cmd[2] = cmd[2].replace(old, new)


@pytest.mark.parametrize("breakage", [
    lambda rs: _serve(rs, lambda c: c["applications"][0].update(route_prefix="/specdec")),
    lambda rs: _serve(rs, lambda c: c["http_options"].update(host="127.0.0.1")),
    lambda rs: _serve(rs, lambda c: c["http_options"].update(port=8001)),
    lambda rs: _serve(rs, lambda c: c["applications"][0]["args"].update(http_port=8001)),
    lambda rs: rs["spec"]["serveService"]["spec"].update(
        ports=[p for p in rs["spec"]["serveService"]["spec"]["ports"] if p["name"] != "http"]),
    lambda rs: rs["spec"]["serveService"]["spec"]["ports"][1].update(name="serve-http"),
    lambda rs: _workers(rs)["ports"].append({"name": "serve", "containerPort": 8000}),
    lambda rs: [p.update(containerPort=8001) for p in _workers(rs)["ports"]
                if p["name"] == "http"],
    lambda rs: _workers(rs).pop("readinessProbe"),
    lambda rs: _probe(rs, "8000/health", "8001/health"),
    lambda rs: _probe(rs, "8000/health", "8000/healthz"),
    lambda rs: _probe(rs, "8000/health", "8000/health || true"),
    lambda rs: _probe(rs, "http://localhost:8000/-/healthz | grep success && ", ""),
    lambda rs: _workers(rs)["readinessProbe"].update(failureThreshold=10),
    lambda rs: _workers(rs).update(livenessProbe={"httpGet": {"path": "/health",
                                                              "port": "http"}}),
    lambda rs: rs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"][
        "containers"][0].update(readinessProbe={"httpGet": {"path": "/health",
                                                            "port": 8000}}),
])
def test_http_check_rejects_what_would_hide_or_misprobe_the_api(rayservice, breakage):
    pytest.importorskip("ray.serve")
    broken = yaml.safe_load(yaml.safe_dump(rayservice))
    breakage(broken)
    with pytest.raises((AssertionError, KeyError)):
        check_http_exposure(broken)


def test_probe_gets_reads_exec_and_http_probes():
    named = {"http": 8000}
    assert probe_gets({"httpGet": {"path": "/health", "port": "http"}}, named) == [
        (8000, "/health")]
    script = ("wget -T 2 -q -O- http://localhost:52365/api/local_raylet_healthz | grep "
              "success && curl -fsS http://127.0.0.1:8000/health")
    assert probe_gets({"exec": {"command": ["bash", "-c", script]}}, named) == [
        RAYLET_HEALTH, (8000, "/health")]
