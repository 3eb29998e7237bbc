"""Policy over the rendered objects: resources, securityContext, probes, graceful
termination, the flags the services get, ports, Services, HPAs, PDBs, rollouts, GPUs."""

from __future__ import annotations

import pytest
from k8s_objects import (
    RAY_CONTAINERS,
    SERVICES,
    Pods,
    by_kind,
    env_of,
    expand,
    flags,
    grpc_service_name,
    image_name,
    image_tag,
    one,
    prestop_seconds,
    quantity,
    selector_matches,
)

from specdec.pair import DEFAULT_PAIR


def model_pods(rendered, group: str) -> Pods:
    pods = rendered.group(group)
    assert len(pods) == 1, f"{rendered.name}: {len(pods)} {group} pod templates"
    assert pods[0].owner["kind"] == "Deployment"
    return pods[0]


def main_container(pods: Pods) -> dict:
    return pods.spec["containers"][0]


def service_parser(group: str):
    if group == "draft":
        from draft_service.config import parser
    else:
        from target_service.config import parser
    return parser()


def default_port(group: str) -> int:
    if group == "draft":
        from draft_service.config import DEFAULT_PORT
    elif group == "target":
        from target_service.config import DEFAULT_PORT
    else:
        from coordinator.deploy.config import DEFAULT_PORT
    return DEFAULT_PORT


# Flags the manifests pass for work another issue does (Prometheus metrics): accepted
# here until the services' parsers have them, and checked by the parser from then on.
METRICS_PORT = 9100


# ---- resources and securityContext ---------------------------------------------------

def test_every_container_has_requests_and_limits(rendered):
    checked = 0
    for pods in rendered.pods:
        for c in pods.containers():
            res = c.get("resources") or {}
            for key in ("cpu", "memory"):
                req = (res.get("requests") or {}).get(key)
                lim = (res.get("limits") or {}).get(key)
                assert req and lim, f"{pods.where}/{c['name']}: {key} request and limit"
                assert quantity(req) <= quantity(lim), f"{pods.where}/{c['name']}: {key}"
            checked += 1
    for rs in by_kind(rendered.objs, "RayService"):  # the autoscaler sidecar KubeRay adds
        res = rs["spec"]["rayClusterConfig"]["autoscalerOptions"]["resources"]
        assert set(res["requests"]) >= {"cpu", "memory"} <= set(res["limits"])
    assert checked >= 7


def test_every_container_is_locked_down(rendered):
    for pods in rendered.pods:
        psc = pods.spec.get("securityContext") or {}
        assert psc.get("runAsNonRoot") is True, pods.where
        assert psc.get("runAsUser", 1) != 0, pods.where
        assert (psc.get("seccompProfile") or {}).get("type") == "RuntimeDefault", pods.where
        mounts_tmp = {m["mountPath"] for c in pods.containers() for m in c.get("volumeMounts", [])}
        for c in pods.containers():
            where = f"{pods.where}/{c['name']}"
            sc = c.get("securityContext") or {}
            assert sc.get("allowPrivilegeEscalation") is False, where
            assert "ALL" in (sc.get("capabilities") or {}).get("drop", []), where
            assert sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True, where
            assert sc.get("runAsUser", psc.get("runAsUser", 1)) != 0, where
            assert not sc.get("privileged"), where
            if c["name"] in RAY_CONTAINERS and not pods.is_init(c):
                # Ray writes into the image; the decision is explicit, not a default.
                assert sc.get("readOnlyRootFilesystem") is False, where
            else:
                assert sc.get("readOnlyRootFilesystem") is True, where
                assert "/tmp" in mounts_tmp, f"{where}: read-only root needs a /tmp volume"
    for rs in by_kind(rendered.objs, "RayService"):
        sc = rs["spec"]["rayClusterConfig"]["autoscalerOptions"]["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["runAsNonRoot"] is True
        assert "ALL" in sc["capabilities"]["drop"]


def test_model_pods_do_not_mount_the_api_token(rendered):
    for group in ("draft", "target"):
        assert model_pods(rendered, group).spec.get("automountServiceAccountToken") is False


# ---- probes, termination, flags ------------------------------------------------------

@pytest.mark.parametrize("group", ["draft", "target"])
def test_model_services_have_grpc_probes_on_their_port_and_service(rendered, group):
    pods = model_pods(rendered, group)
    c = main_container(pods)
    port = int(flags(c["args"])["--port"])
    assert port == default_port(group) == SERVICES[group]["port"]
    name = grpc_service_name(group)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        p = c.get(probe)
        assert p and "grpc" in p, f"{pods.where}: {probe} must be a gRPC health probe"
        assert p["grpc"] == {"port": port, "service": name}, f"{pods.where}: {probe}"
    startup = c["startupProbe"]
    allowed = startup.get("periodSeconds", 10) * startup.get("failureThreshold", 3)
    assert allowed >= 180, f"{pods.where}: the startupProbe allows {allowed} s for model load"


@pytest.mark.parametrize("group", ["draft", "target"])
def test_termination_grace_covers_prestop_and_drain(rendered, group):
    pods = model_pods(rendered, group)
    c = main_container(pods)
    grace = float(flags(c["args"])["--grace"])
    total = prestop_seconds(c) + grace
    assert pods.spec["terminationGracePeriodSeconds"] > total, \
        f"{pods.where}: terminationGracePeriodSeconds must exceed preStop + --grace ({total})"
    assert prestop_seconds(c) > 0, "a preStop pause lets the DNS record go before SIGTERM"


@pytest.mark.parametrize("group", ["draft", "target"])
def test_service_args_parse_with_the_services_own_parser(rendered, group):
    pods = model_pods(rendered, group)
    c = main_container(pods)
    env = env_of(pods, c, rendered.objs)
    args = [expand(a, env) for a in c["args"]]
    ns, unknown = service_parser(group).parse_known_args(args)
    assert not unknown, f"{pods.where}: flags the service does not know: {unknown}"
    assert int(flags(args)["--metrics-port"]) == METRICS_PORT
    assert ns.metrics_port == METRICS_PORT
    assert ns.host == "0.0.0.0", "listen on the pod IP, not loopback"
    assert ns.port == SERVICES[group]["port"]
    assert ns.model == env["SPECDEC_MODEL"]


def test_every_variable_reference_resolves(rendered):
    for pods in rendered.pods:
        for c in pods.containers():
            env = env_of(pods, c, rendered.objs)
            for a in [*c.get("command", []), *c.get("args", [])]:
                assert "$(" not in expand(a, env), f"{pods.where}/{c['name']}: {a}"


def test_models_volume_is_specdec_home(rendered):
    """`specdec prepare` writes, and --model NAME reads, $SPECDEC_HOME: the models volume;
    read-only for the services, writable for the init container that prepares it."""
    for pods in rendered.pods:
        for c in pods.containers():
            mounts = {m["name"]: m for m in c.get("volumeMounts", [])}
            if "models" not in mounts:
                continue
            env = env_of(pods, c, rendered.objs)
            assert env.get("SPECDEC_HOME") == mounts["models"]["mountPath"], pods.where
            assert mounts["models"].get("readOnly", False) is not pods.is_init(c), \
                f"{pods.where}/{c['name']}: only the init container writes models"


def prepare_args(pods: Pods) -> list[str]:
    inits = [c for c in pods.spec.get("initContainers", [])
             if c.get("command", [])[:3] == ["python", "-m", "specdec.cli"]]
    assert len(inits) == 1, f"{pods.where}: one `specdec prepare` init container"
    assert image_name(inits[0]["image"]) == image_name(main_container(pods)["image"]), \
        f"{pods.where}: prepare with the service's own image (it carries the GGUF)"
    return inits[0]["command"][3:]


@pytest.mark.parametrize("group", ["draft", "target"])
def test_init_container_prepares_what_the_service_loads(rendered, group):
    from specdec.cli import parser

    pods = model_pods(rendered, group)
    argv = prepare_args(pods)
    prep = parser().parse_args(argv)
    assert prep.command == "prepare"
    svc = flags(main_container(pods)["args"])
    if prep.pair:  # a real pair: this role's model, at the weights it is prepared at
        from specdec.model_pairs import PAIRS

        model = getattr(PAIRS[prep.pair], prep.only or "")
        env = env_of(pods, main_container(pods), rendered.objs)
        assert prep.only == group and expand(svc["--model"], env) == model.name, pods.where
        assert svc["--weights"] == model.weights, f"{pods.where}: weights"
    elif svc["--backend"] == "openvino":
        assert prep.openvino, f"{pods.where}: an OpenVINO service needs the IR export"
        assert svc["--weights"] in prep.weights.split(","), f"{pods.where}: weights"
    else:
        assert svc["--backend"] == "torch"


def test_coordinator_workers_prepare_the_tokenizer(rendered):
    from specdec.cli import parser

    workers = [p for p in rendered.group("coordinator") if not p.where.endswith(" head")]
    assert workers
    for pods in workers:
        assert parser().parse_args(prepare_args(pods)).command == "prepare"


# ---- images and ports ----------------------------------------------------------------

def test_images_are_the_services_own_and_tagged(rendered):
    for pods in rendered.pods:
        assert pods.group in SERVICES, f"{pods.where} runs none of the specdec images"
        for c in pods.containers():
            assert image_name(c["image"]) == SERVICES[pods.group]["image"], pods.where
            assert image_tag(c["image"]) not in ("", "latest"), f"{pods.where}: {c['image']}"


@pytest.mark.parametrize("group", ["draft", "target"])
def test_container_ports_match_flags_and_defaults(rendered, group):
    c = main_container(model_pods(rendered, group))
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    f = flags(c["args"])
    assert ports == {"grpc": int(f["--port"]), "metrics": int(f["--metrics-port"])}
    assert ports["grpc"] == SERVICES[group]["port"]


@pytest.mark.parametrize("group", ["draft", "target"])
def test_headless_service_selects_exactly_the_pool(rendered, group):
    pods = model_pods(rendered, group)
    svc = one(rendered.objs, "Service", f"specdec-{group}")
    assert svc["spec"].get("clusterIP") == "None", "headless: one DNS record per pod"
    assert not svc["spec"].get("publishNotReadyAddresses"), "only ready pods get traffic"
    selected = [p.where for p in rendered.pods if selector_matches(svc["spec"]["selector"],
                                                                   p.labels)]
    assert selected == [pods.where]
    container_ports = {p["name"]: p["containerPort"] for p in main_container(pods)["ports"]}
    for port in svc["spec"]["ports"]:
        target = port.get("targetPort", port["port"])
        number = container_ports[target] if isinstance(target, str) else target
        assert number == port["port"] and number in container_ports.values(), port
    grpc = next(p for p in svc["spec"]["ports"] if p["name"] == "grpc")
    assert grpc["port"] == SERVICES[group]["port"]


def test_only_the_coordinator_is_reachable_from_outside_the_namespace(rendered):
    """No Service other than the RayService's exposes a pool beyond ClusterIP/headless."""
    for svc in by_kind(rendered.objs, "Service"):
        assert svc["spec"].get("type", "ClusterIP") == "ClusterIP", svc["metadata"]["name"]


# ---- autoscaling, disruption, rollout ------------------------------------------------

def test_each_hpa_targets_an_existing_deployment(rendered):
    hpas = by_kind(rendered.objs, "HorizontalPodAutoscaler")
    deployments = {d["metadata"]["name"]: d for d in by_kind(rendered.objs, "Deployment")}
    for hpa in hpas:
        ref = hpa["spec"]["scaleTargetRef"]
        assert (ref["apiVersion"], ref["kind"]) == ("apps/v1", "Deployment")
        assert ref["name"] in deployments, f"HPA {hpa['metadata']['name']} -> {ref['name']}"
        assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    for name, d in deployments.items():
        if any(h["spec"]["scaleTargetRef"]["name"] == name for h in hpas):
            assert "replicas" not in d["spec"], f"{name}: the HPA owns replicas"


def test_hpas_scale_each_pool_on_its_own_load(renders):
    objs = renders["cpu"].objs
    draft = one(objs, "HorizontalPodAutoscaler", "specdec-draft")
    assert draft["spec"]["scaleTargetRef"]["name"] == "specdec-draft"
    assert [(m["type"], m["resource"]["name"], m["resource"]["target"]["type"])
            for m in draft["spec"]["metrics"]] == [("Resource", "cpu", "Utilization")]
    target = one(objs, "HorizontalPodAutoscaler", "specdec-target")
    assert target["spec"]["scaleTargetRef"]["name"] == "specdec-target"
    assert [(m["type"], m["pods"]["metric"]["name"], m["pods"]["target"]["type"])
            for m in target["spec"]["metrics"]] == [
        ("Pods", "specdec_target_inflight_verify_requests", "AverageValue")]
    # The pool the metric comes from exposes the metrics port Prometheus scrapes.
    pods = model_pods(renders["cpu"], "target")
    annotations = pods.template["metadata"].get("annotations", {})
    assert annotations.get("prometheus.io/port") == str(METRICS_PORT)


def test_each_pdb_covers_exactly_one_pool(rendered):
    pdbs = by_kind(rendered.objs, "PodDisruptionBudget")
    assert {p["metadata"]["name"] for p in pdbs} == {"specdec-draft", "specdec-target"}
    for pdb in pdbs:
        selected = [p.group for p in rendered.pods
                    if selector_matches(pdb["spec"]["selector"], p.labels)]
        assert selected == [pdb["metadata"]["name"].removeprefix("specdec-")], selected
        assert ("minAvailable" in pdb["spec"]) != ("maxUnavailable" in pdb["spec"])
    target = one(rendered.objs, "PodDisruptionBudget", "specdec-target")
    assert target["spec"].get("minAvailable") == 1, "a drain never takes the last target"


def test_rollouts_surge_before_removing(rendered):
    for d in by_kind(rendered.objs, "Deployment"):
        s = d["spec"]["strategy"]
        assert s["type"] == "RollingUpdate"
        assert s["rollingUpdate"]["maxUnavailable"] == 0, d["metadata"]["name"]
        assert s["rollingUpdate"]["maxSurge"] not in (0, "0%"), d["metadata"]["name"]
        assert d["spec"]["progressDeadlineSeconds"] >= 600, "model preparation takes minutes"
        assert d["spec"]["selector"]["matchLabels"].items() <= \
            d["spec"]["template"]["metadata"]["labels"].items()


# ---- CPU and GPU overlays ------------------------------------------------------------

def gpu_requests(c: dict) -> tuple:
    res = c.get("resources") or {}
    return ((res.get("requests") or {}).get("nvidia.com/gpu"),
            (res.get("limits") or {}).get("nvidia.com/gpu"))


def avoids_gpu_nodes(pods: Pods) -> bool:
    terms = (((pods.spec.get("affinity") or {}).get("nodeAffinity") or {})
             .get("requiredDuringSchedulingIgnoredDuringExecution") or {}) \
        .get("nodeSelectorTerms") or []
    return bool(terms) and all(
        {"key": "nvidia.com/gpu.present", "operator": "DoesNotExist"}
        in t.get("matchExpressions", []) for t in terms)


def test_cpu_overlay_uses_no_gpu(renders):
    r = renders["cpu"]
    for pods in r.pods:
        for c in pods.containers():
            assert gpu_requests(c) == (None, None), pods.where
    for spec in (DEFAULT_PAIR.draft, DEFAULT_PAIR.target):
        f = flags(main_container(model_pods(r, spec.role))["args"])
        assert f["--device"] == "CPU"
        assert_runs(f, spec)


def assert_runs(f: dict, spec) -> None:
    """The container computes with what the ServiceSpec says (backend, weights, precision,
    extra flags): specdec.pair.DEFAULT_PAIR is what the manifests deploy."""
    model_flags = spec.model_flags()
    for flag, value in zip(model_flags[::2], model_flags[1::2], strict=True):
        assert f.get(flag) == value, f"{spec.role}: {flag}={f.get(flag)}, the pair says {value}"


@pytest.mark.parametrize("name", ["gpu", "gpu+model-pvc"])
def test_gpu_overlay_puts_only_the_target_on_gpus(renders, name):
    r = renders[name]
    target = model_pods(r, "target")
    c = main_container(target)
    assert gpu_requests(c) == ("1", "1"), "one whole GPU, request == limit"
    f = flags(c["args"])
    assert f["--backend"] == "torch" and f["--device"].startswith("cuda")
    assert target.spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} \
        in target.spec["tolerations"]
    assert image_tag(c["image"]).endswith("-cu128"), "the CUDA build of the target image"
    draft = model_pods(r, "draft")
    f = flags(main_container(draft)["args"])
    assert f["--device"] == "CPU"
    assert_runs(f, DEFAULT_PAIR.draft)
    for pods in r.pods:
        if pods.group == "target":
            continue
        assert avoids_gpu_nodes(pods), f"{pods.where} must stay off GPU nodes"
        assert not pods.spec.get("tolerations"), pods.where
        for c in pods.containers():
            assert gpu_requests(c) == (None, None), pods.where
