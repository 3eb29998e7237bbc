"""Every overlay renders, and every object validates offline against the Kubernetes JSON
schemas (kubernetes-validate, Kubernetes 1.32, strict: unknown fields are errors)."""

from __future__ import annotations

import collections

import pytest
from k8s_objects import (
    CUSTOM_KINDS,
    K8S,
    by_kind,
    image_tag,
    one,
    pod_templates,
    render,
    validate,
)

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is not installed (see k8s/README.md)")

VOLUME_SOURCES = {"emptyDir", "persistentVolumeClaim", "configMap", "secret", "hostPath",
                  "projected", "downwardAPI", "ephemeral", "csi", "nfs", "image"}


def test_base_renders_alone(kustomize):
    objs = render(K8S / "base")
    kinds = collections.Counter(o["kind"] for o in objs)
    assert kinds == {"ConfigMap": 1, "Deployment": 2, "Service": 2,
                     "HorizontalPodAutoscaler": 2, "PodDisruptionBudget": 2,
                     "NetworkPolicy": 3, "RayService": 1}, kinds
    for pods in pod_templates(objs):
        for c in pods.containers():
            assert image_tag(c["image"]) not in ("", "latest"), f"{pods.where}: {c['image']}"


def test_every_object_validates_against_the_kubernetes_schemas(rendered):
    custom = []
    for obj in rendered.objs:
        if (obj["apiVersion"], obj["kind"]) in CUSTOM_KINDS:
            custom.append(obj)  # checked against KubeRay's fields in test_k8s_rayservice
            continue
        try:
            validate(obj)
        except kubernetes_validate.SchemaNotFoundError:
            pytest.fail(f"{obj['apiVersion']} {obj['kind']} has no Kubernetes schema and is "
                        "not a known custom resource: add a check for it")
    assert [o["kind"] for o in custom] == ["RayService"]


def test_validation_catches_a_broken_object():
    """The validator is not a no-op: a misspelt field and a wrong type are errors."""
    ok = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"},
          "spec": {"ports": [{"port": 1}]}}
    validate(ok)
    for broken in ({**ok, "spec": {"ports": [{"port": "one"}]}},
                   {**ok, "spec": {"ports": [{"port": 1}], "clusterIp": "None"}}):
        with pytest.raises(AssertionError):
            validate(broken)


def test_names_are_unique_per_kind(rendered):
    seen = collections.Counter((o["kind"], o["metadata"]["name"]) for o in rendered.objs)
    assert [k for k, n in seen.items() if n > 1] == []


def test_overlays_put_everything_in_one_namespace(rendered):
    namespaces = by_kind(rendered.objs, "Namespace")
    assert [n["metadata"]["name"] for n in namespaces] == ["specdec"]
    for o in rendered.objs:
        if o["kind"] != "Namespace":
            assert o["metadata"].get("namespace") == "specdec", o["metadata"]["name"]


def test_every_volume_has_exactly_one_source(rendered):
    for pods in rendered.pods:
        for v in pods.spec.get("volumes", []):
            sources = VOLUME_SOURCES & set(v)
            assert len(sources) == 1, f"{pods.where}: volume {v['name']} has {sorted(sources)}"


def test_every_reference_resolves(rendered):
    """ConfigMaps (the generated name has a hash), claims and mounted volumes exist."""
    for pods in rendered.pods:
        volumes = {v["name"]: v for v in pods.spec.get("volumes", [])}
        for c in pods.containers():
            for src in c.get("envFrom", []):
                if "configMapRef" in src:
                    one(rendered.objs, "ConfigMap", src["configMapRef"]["name"])
            for m in c.get("volumeMounts", []):
                assert m["name"] in volumes, f"{pods.where}/{c['name']}: no volume {m['name']}"
        for v in volumes.values():
            if "persistentVolumeClaim" in v:
                one(rendered.objs, "PersistentVolumeClaim", v["persistentVolumeClaim"]["claimName"])


def test_model_pvc_component_swaps_every_model_volume(renders):
    for name in ("cpu+model-pvc+manual-scaling", "gpu+model-pvc"):
        objs = renders[name].objs
        pvc = one(objs, "PersistentVolumeClaim", "specdec-models")
        assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]  # pods on several nodes
        with_models = [p for p in renders[name].pods
                       if any(v["name"] == "models" for v in p.spec.get("volumes", []))]
        assert {p.group for p in with_models} == {"draft", "target", "coordinator"}
        for p in with_models:
            models = next(v for v in p.spec["volumes"] if v["name"] == "models")
            assert models == {"name": "models",
                              "persistentVolumeClaim": {"claimName": "specdec-models"}}, p.where


def test_manual_scaling_component_removes_the_hpas(renders):
    assert by_kind(renders["cpu+model-pvc+manual-scaling"].objs, "HorizontalPodAutoscaler") == []
    assert len(by_kind(renders["cpu"].objs, "HorizontalPodAutoscaler")) == 2
