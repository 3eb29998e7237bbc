"""k8s/components/tls, cert-manager and api-keys, rendered on both overlays: every flag
points into a mounted Secret, the probes go to the plaintext health port the service
opens, cert-manager's Secrets are the ones mounted and name what the coordinator dials,
and every standard object still validates."""

from __future__ import annotations

import pytest
import yaml
from k8s_objects import (
    CUSTOM_KINDS,
    OVERLAYS,
    one,
    pod_templates,
    render_with_components,
    validate,
)

from coordinator.deploy.config import CoordinatorConfig, with_environment
from draft_service.config import from_args as draft_args
from target_service.config import from_args as target_args

ALL = ["tls", "cert-manager", "api-keys"]
CERT_MANAGER = ("cert-manager.io/v1", {"Certificate", "Issuer"})


@pytest.fixture(scope="module", params=list(OVERLAYS))
def objs(request, kustomize, tmp_path_factory):
    return render_with_components(tmp_path_factory.mktemp("tls"), request.param, ALL)


def _mounts(pods, container) -> dict[str, str]:
    """mountPath -> the Secret mounted there."""
    volumes = {v["name"]: v for v in pods.spec.get("volumes", [])}
    out = {}
    for m in container.get("volumeMounts", []):
        secret = volumes[m["name"]].get("secret")
        if secret:
            out[m["mountPath"]] = secret["secretName"]
    return out


def _secret_of(path: str, mounts: dict[str, str]) -> str:
    hits = [s for mount, s in mounts.items() if path.startswith(mount.rstrip("/") + "/")]
    assert hits, f"{path} is in no mounted Secret ({mounts})"
    return hits[0]


def test_model_services_serve_mtls_from_their_secret_and_probe_the_health_port(objs):
    for name, parse in (("specdec-draft", draft_args), ("specdec-target", target_args)):
        dep = one(objs, "Deployment", name)
        pods = next(p for p in pod_templates([dep]))
        c = pods.spec["containers"][0]
        cfg = parse(c["args"])  # the real parser: every flag exists and parses
        mounts = _mounts(pods, c)
        for path in (cfg.tls_cert, cfg.tls_key, cfg.tls_client_ca):
            assert _secret_of(path, mounts) == f"{name}-tls", (name, path)
        assert cfg.health_port > 0
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ports["health"] == cfg.health_port and ports["grpc"] == cfg.port
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert c[probe]["grpc"]["port"] == cfg.health_port, (name, probe)


def test_coordinator_workers_get_the_client_certificate_and_the_keys(objs):
    rs = one(objs, "RayService", "specdec-coordinator")
    workers = [p for p in pod_templates([rs]) if not p.where.endswith("head")]
    assert workers
    for pods in workers:
        c = pods.spec["containers"][0]
        env = {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}
        serve = yaml.safe_load(rs["spec"]["serveConfigV2"])
        args = serve["applications"][0]["args"]
        cfg = CoordinatorConfig(**with_environment(args, env))  # as each replica reads it
        mounts = _mounts(pods, c)
        for path in (cfg.tls_ca, cfg.tls_cert, cfg.tls_key):
            assert _secret_of(path, mounts) == "specdec-coordinator-client-tls"
        assert _secret_of(cfg.api_keys, mounts) == "specdec-api-keys"


def test_cert_manager_issues_the_mounted_secrets_naming_what_is_dialled(objs):
    certs = {o["spec"]["secretName"]: o for o in objs if o["kind"] == "Certificate"}
    issuers = {o["metadata"]["name"] for o in objs if o["kind"] == "Issuer"}
    serve = yaml.safe_load(one(objs, "RayService", "specdec-coordinator")["spec"]
                           ["serveConfigV2"])["applications"][0]["args"]
    for role in ("draft", "target"):
        cert = certs[f"specdec-{role}-tls"]
        host = serve[role].split(":")[1]  # dns:NAME:PORT -> the name the router checks
        assert host in cert["spec"]["dnsNames"]
        assert "server auth" in cert["spec"]["usages"]
    assert "client auth" in certs["specdec-coordinator-client-tls"]["spec"]["usages"]
    for cert in certs.values():
        assert cert["spec"]["issuerRef"]["name"] in issuers
    assert certs["specdec-ca"]["spec"]["isCA"] is True


def test_standard_objects_validate_and_custom_kinds_are_known(objs):
    pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed")
    for obj in objs:
        key = (obj["apiVersion"], obj["kind"])
        if key in CUSTOM_KINDS:
            continue
        if obj["apiVersion"] == CERT_MANAGER[0]:
            assert obj["kind"] in CERT_MANAGER[1], key
            continue
        validate(obj)
