"""The RayService, which no Kubernetes schema covers: its fields against KubeRay's API
types, the Kubernetes objects inside it against the Kubernetes schemas, its Serve config
against Ray Serve's own schema, and the Serve application against the coordinator code."""

from __future__ import annotations

import re
from dataclasses import fields

import pytest
import yaml
from k8s_objects import (
    REPO,
    SERVICES,
    by_kind,
    config_keys_read_by,
    constraint,
    flags,
    module_constant,
    module_defines,
    quantity,
    selector_matches,
    serve_deployment_name,
    validate,
)

pytest.importorskip("kubernetes_validate",
                    reason="kubernetes-validate is not installed (see k8s/README.md)")

# Field lists of ray-project/kuberay ray-operator/apis/ray/v1 (rayservice_types.go,
# raycluster_types.go): json names; "required" = no omitempty there. Deprecated fields
# (serviceUnhealthySecondThreshold, deploymentUnhealthySecondThreshold) are left out on
# purpose: KubeRay ignores them.
KUBERAY = {
    "RayService": {
        "allowed": {"apiVersion", "kind", "metadata", "spec"},
        "required": {"apiVersion", "kind", "metadata", "spec"}},
    "RayServiceSpec": {
        "allowed": {"rayClusterDeletionDelaySeconds", "serveService", "gateway", "httpRoute",
                    "upgradeStrategy", "serveConfigV2", "rayClusterConfig",
                    "excludeHeadPodFromServeSvc"},
        "required": {"rayClusterConfig"}},
    "RayServiceUpgradeStrategy": {
        "allowed": {"type", "incrementalUpgradeOptions"}, "required": set()},
    "RayClusterSpec": {
        "allowed": {"suspend", "managedBy", "autoscalerOptions", "headServiceAnnotations",
                    "enableInTreeAutoscaling", "gcsFaultToleranceOptions", "headGroupSpec",
                    "rayVersion", "workerGroupSpecs"},
        "required": {"headGroupSpec"}},
    "AutoscalerOptions": {
        "allowed": {"resources", "image", "imagePullPolicy", "securityContext",
                    "idleTimeoutSeconds", "upscalingMode", "env", "envFrom", "volumeMounts"},
        "required": set()},
    "HeadGroupSpec": {
        "allowed": {"template", "headService", "enableIngress", "rayStartParams",
                    "serviceType"},
        "required": {"template", "rayStartParams"}},
    "WorkerGroupSpec": {
        "allowed": {"suspend", "groupName", "replicas", "minReplicas", "maxReplicas",
                    "idleTimeoutSeconds", "rayStartParams", "template", "scaleStrategy",
                    "numOfHosts"},
        "required": {"groupName", "minReplicas", "maxReplicas", "rayStartParams", "template"}},
}
UPGRADE_TYPES = {"NewCluster", "None", "IncrementalUpgrade"}
UPSCALING_MODES = {"Default", "Aggressive", "Conservative"}


def check_fields(obj: dict, type_name: str, where: str) -> None:
    spec = KUBERAY[type_name]
    assert isinstance(obj, dict), f"{where}: {type_name} must be a mapping"
    unknown = set(obj) - spec["allowed"]
    assert not unknown, f"{where}: {sorted(unknown)} are not {type_name} fields"
    missing = spec["required"] - set(obj)
    assert not missing, f"{where}: {type_name} needs {sorted(missing)}"


def check_rayservice(rs: dict) -> None:
    """Everything KubeRay's types and the operator's rules say about a RayService."""
    name = rs["metadata"]["name"]
    assert rs["apiVersion"] == "ray.io/v1"
    check_fields(rs, "RayService", name)
    spec = rs["spec"]
    check_fields(spec, "RayServiceSpec", f"{name}.spec")
    if "upgradeStrategy" in spec:
        check_fields(spec["upgradeStrategy"], "RayServiceUpgradeStrategy", "upgradeStrategy")
        assert spec["upgradeStrategy"].get("type", "NewCluster") in UPGRADE_TYPES
    assert isinstance(spec.get("rayClusterDeletionDelaySeconds", 0), int)
    assert isinstance(spec["serveConfigV2"], str), "serveConfigV2 is a YAML string"
    rc = spec["rayClusterConfig"]
    check_fields(rc, "RayClusterSpec", "rayClusterConfig")
    auto = rc.get("autoscalerOptions")
    if auto is not None:
        check_fields(auto, "AutoscalerOptions", "autoscalerOptions")
        assert auto.get("upscalingMode", "Default") in UPSCALING_MODES
        # Its Kubernetes parts, through a Pod that carries them.
        validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "autoscaler"},
                  "spec": {"containers": [{
                      "name": "autoscaler", "image": "x",
                      **{k: auto[k] for k in ("resources", "securityContext", "env",
                                              "envFrom", "volumeMounts") if k in auto}}]}})
    groups = [("head", rc["headGroupSpec"], "HeadGroupSpec")]
    groups += [(g.get("groupName", "?"), g, "WorkerGroupSpec")
               for g in rc.get("workerGroupSpecs", [])]
    assert len({g for g, _, _ in groups}) == len(groups), "group names must differ"
    for group, g, type_name in groups:
        check_fields(g, type_name, group)
        params = g["rayStartParams"]
        assert all(isinstance(v, str) for v in params.values()), \
            f"{group}: rayStartParams values are strings (map[string]string)"
        # containers[0] is the Ray container; validate the template as a PodTemplate.
        validate({"apiVersion": "v1", "kind": "PodTemplate",
                  "metadata": {"name": f"{name}-{group}"}, "template": g["template"]})
        if type_name == "WorkerGroupSpec":
            lo, hi = g["minReplicas"], g["maxReplicas"]
            assert 0 <= lo <= g.get("replicas", lo) <= hi, f"{group}: min <= replicas <= max"
    if "serveService" in spec:
        svc = spec["serveService"]
        validate({"apiVersion": "v1", "kind": "Service", **svc})


@pytest.fixture(params=["cpu", "gpu"])
def rayservice(request, renders) -> dict:
    (rs,) = by_kind(renders[request.param].objs, "RayService")
    return rs


@pytest.fixture()
def serve_config(rayservice) -> dict:
    return yaml.safe_load(rayservice["spec"]["serveConfigV2"])


@pytest.fixture()
def app(serve_config) -> dict:
    (app,) = serve_config["applications"]
    return app


def test_rayservice_has_only_kuberay_fields(rayservice):
    check_rayservice(rayservice)


@pytest.mark.parametrize("breakage", [
    lambda rs: rs["spec"].update(serveConfig="x"),  # the v1 field, removed from KubeRay
    lambda rs: rs["spec"].update(serviceUnhealthySecondThreshold=60),  # deprecated
    lambda rs: rs["spec"]["rayClusterConfig"].pop("headGroupSpec"),
    lambda rs: rs["spec"]["rayClusterConfig"]["workerGroupSpecs"][0].pop("maxReplicas"),
    lambda rs: rs["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParams"].update(
        {"num-cpus": 0}),
    lambda rs: rs["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"][
        "containers"][0].update(imagePullPolicy="Sometimes", bogus=1),
    lambda rs: rs["spec"]["serveService"]["spec"].update(clusterIp="None"),
])
def test_rayservice_check_rejects_a_broken_rayservice(rayservice, breakage):
    broken = yaml.safe_load(yaml.safe_dump(rayservice))
    breakage(broken)
    with pytest.raises(AssertionError):
        check_rayservice(broken)


def test_ray_version_matches_constraints_and_image(rayservice):
    ray = constraint("ray")
    assert rayservice["spec"]["rayClusterConfig"]["rayVersion"] == ray
    dockerfile = (REPO / "coordinator" / "Dockerfile").read_text()
    tags = re.findall(r"^FROM\s+rayproject/ray:(\S+)", dockerfile, re.M)
    assert tags and all(t.startswith(f"{ray}-py311") for t in tags), tags


# ---- the Serve config ------------------------------------------------------------------

def strict_keys(model, data: dict, where: str) -> None:
    """Ray Serve's schema ignores unknown keys; a misspelt option would vanish silently."""
    unknown = set(data) - set(model.model_fields)
    assert not unknown, f"{where}: {sorted(unknown)} are not {model.__name__} fields"


def test_serve_config_validates_against_ray_serves_schema(serve_config):
    schema = pytest.importorskip("ray.serve.schema")
    schema.ServeDeploySchema.model_validate(serve_config)
    strict_keys(schema.ServeDeploySchema, serve_config, "serveConfigV2")
    strict_keys(schema.HTTPOptionsSchema, serve_config["http_options"], "http_options")
    strict_keys(schema.gRPCOptionsSchema, serve_config["grpc_options"], "grpc_options")
    for app in serve_config["applications"]:
        strict_keys(schema.ServeApplicationSchema, app, app["name"])
        for d in app.get("deployments", []):
            strict_keys(schema.DeploymentSchema, d, d["name"])
            strict_keys(schema.RayActorOptionsSchema, d.get("ray_actor_options", {}), d["name"])


def test_grpc_options_serve_the_coordinators_servicers(serve_config, rayservice):
    grpc = serve_config["grpc_options"]
    assert grpc["port"] == SERVICES["coordinator"]["port"]
    assert grpc["grpc_servicer_functions"] == module_constant("coordinator.deploy.app",
                                                              "SERVICER_FUNCTIONS")
    import importlib

    for path in grpc["grpc_servicer_functions"]:
        module, func = path.rsplit(".", 1)
        assert callable(getattr(importlib.import_module(module), func)), path
    assert serve_config["proxy_location"] == "EveryNode"
    # KubeRay checks the HTTP proxy's health on the port named "serve", else 8000.
    assert serve_config["http_options"]["port"] == 8000


def test_application_is_the_coordinator(app):
    module, _, attr = app["import_path"].partition(":")
    assert (module, attr) == ("coordinator.deploy.app", "application")
    assert module_defines(module, attr)
    assert app["name"] == module_constant("coordinator.deploy.app", "APP_NAME")
    names = {d["name"] for d in app.get("deployments", [])}
    assert names <= {serve_deployment_name("coordinator.deploy.app", "Coordinator")}, names


def test_application_args_are_coordinator_config(app, serve_config):
    from coordinator.deploy.config import DEFAULT_HTTP_PORT, CoordinatorConfig

    args = app["args"]
    known = {f.name: f for f in fields(CoordinatorConfig)}
    assert set(args) <= set(known), f"not CoordinatorConfig fields: {set(args) - set(known)}"
    assert config_keys_read_by("coordinator.deploy.app", "application") <= set(args), \
        "application(config) indexes these keys directly"
    defaults = CoordinatorConfig()
    for key, value in args.items():
        expected = type(getattr(defaults, key))
        ok = isinstance(value, expected) or (expected is float and isinstance(value, int))
        assert ok and not isinstance(value, bool), f"args.{key}: {value!r} is not {expected}"
    cfg = CoordinatorConfig(**args)
    assert cfg.port == SERVICES["coordinator"]["port"] == serve_config["grpc_options"]["port"]
    # Serve's proxies listen where grpc/http_options say; the args must say the same.
    http = serve_config["http_options"]
    assert {"http_host", "http_port"} <= set(args), "say where the HTTP API listens"
    assert (cfg.http_host, cfg.http_port) == (http["host"], http["port"])
    assert cfg.http_port == DEFAULT_HTTP_PORT and cfg.http_host == "0.0.0.0"
    assert 1 <= cfg.min_replicas <= cfg.max_replicas


def test_deployed_loop_is_the_default_policy(app):
    """The loop's defaults are defined once (coordinator.loop.policy); the RayService leaves
    them alone, so the cluster runs the same loop as `python -m coordinator`."""
    from coordinator.deploy.config import CoordinatorConfig
    from coordinator.loop.policy import DEFAULT_POLICY, LoopPolicy

    overridden = {f.name for f in fields(LoopPolicy)} & set(app["args"])
    assert not overridden, f"args override the loop policy: {sorted(overridden)}"
    assert CoordinatorConfig(**app["args"]).policy() == DEFAULT_POLICY


def test_dns_args_name_the_headless_services_and_ports(app, renders):
    objs = renders["cpu"].objs
    for group in ("draft", "target"):
        entries = [e.strip() for e in app["args"][group].split(",") if e.strip()]
        assert entries, f"{group}: no address"
        (pods,) = renders["cpu"].group(group)
        port_flag = int(flags(pods.spec["containers"][0]["args"])["--port"])
        for entry in entries:
            m = re.fullmatch(r"dns:([a-z0-9.-]+):(\d+)", entry)
            assert m, f"args.{group}: {entry!r} is not dns:NAME:PORT"
            host, port = m.group(1), int(m.group(2))
            name = host.split(".")[0]  # NAME or NAME.NAMESPACE[.svc...]
            (svc,) = [s for s in by_kind(objs, "Service") if s["metadata"]["name"] == name]
            assert svc["spec"].get("clusterIP") == "None", f"{name}: must be headless"
            assert selector_matches(svc["spec"]["selector"], pods.labels)
            assert port == port_flag == SERVICES[group]["port"]
            assert port in {p["port"] for p in svc["spec"]["ports"]}


def test_coordinator_grpc_and_http_ports_reach_clients(rayservice, serve_config):
    """The Serve proxy's gRPC and HTTP ports are container ports on every Ray pod, and the
    Service KubeRay builds from serveService carries them: gRPC as the port named "serve"
    (the one KubeRay 1.4/1.5 keep), HTTP as "http" (kept as given by KubeRay >= 1.6 while
    no Ray container names a port serve or serve-*); see test_k8s_coordinator_http."""
    grpc = serve_config["grpc_options"]["port"]
    http = serve_config["http_options"]["port"]
    rc = rayservice["spec"]["rayClusterConfig"]
    for g in [rc["headGroupSpec"], *rc["workerGroupSpecs"]]:
        ray = g["template"]["spec"]["containers"][0]
        ports = {p.get("name"): p["containerPort"] for p in ray.get("ports", [])}
        assert ports.get("grpc") == grpc and ports.get("http") == http
        # A container port named "serve" would replace ours in the Service, and KubeRay
        # would health-check the HTTP proxy on it.
        assert "serve" not in ports
    svc = rayservice["spec"]["serveService"]
    assert svc["metadata"]["name"] == "specdec-coordinator"
    assert [(p["name"], p["port"]) for p in svc["spec"]["ports"]] == [("serve", grpc),
                                                                       ("http", http)]
    assert "selector" not in svc["spec"], "KubeRay sets the selector (the active cluster)"


def test_autoscaling_has_room_for_max_replicas(rayservice, app):
    """Serve adds Coordinator replicas up to max_replicas; the Ray autoscaler must be able
    to add worker pods with enough CPUs for them (none go to the head: num-cpus 0)."""
    rc = rayservice["spec"]["rayClusterConfig"]
    assert rc["enableInTreeAutoscaling"] is True
    assert rc["headGroupSpec"]["rayStartParams"].get("num-cpus") == "0"
    (dep,) = app["deployments"]
    per_replica = dep["ray_actor_options"]["num_cpus"]
    assert per_replica > 0, "replicas that need no CPU never make the Ray autoscaler act"
    capacity = 0.0
    for g in rc["workerGroupSpecs"]:
        ray = g["template"]["spec"]["containers"][0]
        cpus = float(g["rayStartParams"].get("num-cpus",
                                             quantity(ray["resources"]["limits"]["cpu"])))
        capacity += g["maxReplicas"] * (cpus // per_replica)
    assert capacity >= app["args"]["max_replicas"]


def test_old_cluster_outlives_its_generations(rayservice, app):
    """On a NewCluster upgrade the old cluster is deleted after
    rayClusterDeletionDelaySeconds; replicas get graceful_shutdown_timeout_s to finish."""
    spec = rayservice["spec"]
    assert spec["upgradeStrategy"]["type"] == "NewCluster"
    (dep,) = app["deployments"]
    assert spec["rayClusterDeletionDelaySeconds"] >= dep["graceful_shutdown_timeout_s"] >= 60


def test_serve_builds_the_application_from_import_path_and_args(app):
    """What Serve does with import_path + args on the cluster, done here: call the builder
    with the args (no Ray cluster needed to build), and compare the result."""
    import importlib

    api = pytest.importorskip("ray.serve._private.api")
    build = getattr(api, "call_user_app_builder_with_args_if_necessary", None)
    if build is None:
        pytest.skip("this Ray has no call_user_app_builder_with_args_if_necessary")
    module, _, attr = app["import_path"].partition(":")
    built = build(getattr(importlib.import_module(module), attr), dict(app["args"]))
    deployment = built._bound_deployment
    assert {d["name"] for d in app["deployments"]} == {deployment.name}
    auto = deployment._deployment_config.autoscaling_config
    args = app["args"]
    assert (auto.min_replicas, auto.max_replicas, auto.target_ongoing_requests) == (
        args["min_replicas"], args["max_replicas"], args["target_ongoing_requests"])
    from coordinator.deploy.app import HEADROOM

    assert deployment._deployment_config.max_ongoing_requests == \
        args["max_concurrency"] + HEADROOM
