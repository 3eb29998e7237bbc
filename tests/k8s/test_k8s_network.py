"""The NetworkPolicies, evaluated: who reaches which port of which pod.

A small evaluator of networking.k8s.io/v1 ingress semantics over the rendered objects:
a pod selected by no policy accepts everything; a selected pod accepts the union of the
rules of the policies that select it. Sources are pods (labels, namespace labels) and
addresses outside the cluster."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

import yaml
from k8s_objects import Pods, by_kind, selector_matches

NAMESPACE = "specdec"
ALL = frozenset({"*"})  # every port


@dataclass(frozen=True)
class Source:
    namespace: str | None  # None: an address outside the cluster
    labels: tuple = ()
    ip: str = "10.0.0.1"

    @property
    def namespace_labels(self) -> dict:
        return {"kubernetes.io/metadata.name": self.namespace} if self.namespace else {}


def pod_in(namespace: str, labels: dict) -> Source:
    return Source(namespace, tuple(sorted(labels.items())))


EXTERNAL = Source(None, ip="203.0.113.7")
CLIENT_POD = pod_in(NAMESPACE, {"app": "some-client"})
OTHER_NAMESPACE = pod_in("default", {"app": "some-client"})
PROMETHEUS = pod_in("monitoring", {"app.kubernetes.io/name": "prometheus"})
OPERATOR = pod_in("kuberay-system", {"app.kubernetes.io/name": "kuberay-operator"})


def container_ports(pods: Pods) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for c in pods.spec["containers"]
            for p in c.get("ports", []) if "name" in p}


def peer_matches(peer: dict, src: Source) -> bool:
    if "ipBlock" in peer:
        if src.namespace is not None:
            return False  # pod IPs and ipBlocks: left to the implementation; not relied on
        block = peer["ipBlock"]
        ip = ipaddress.ip_address(src.ip)
        return ip in ipaddress.ip_network(block["cidr"]) and not any(
            ip in ipaddress.ip_network(e) for e in block.get("except", []))
    if src.namespace is None:
        return False
    ns_sel, pod_sel = peer.get("namespaceSelector"), peer.get("podSelector")
    if ns_sel is None:
        ns_ok = src.namespace == NAMESPACE  # podSelector alone: the policy's namespace
    else:
        ns_ok = selector_matches(ns_sel, src.namespace_labels)
    pod_ok = pod_sel is None or selector_matches(pod_sel, dict(src.labels))
    return ns_ok and pod_ok


def rule_ports(rule: dict, named: dict[str, int]) -> frozenset:
    if not rule.get("ports"):
        return ALL
    out = set()
    for p in rule["ports"]:
        assert p.get("protocol", "TCP") == "TCP", p
        if "port" not in p:
            return ALL
        port = named.get(p["port"], p["port"]) if isinstance(p["port"], str) else p["port"]
        out.update(range(port, p.get("endPort", port) + 1))
    return frozenset(out)


def selecting(objs: list[dict], pods: Pods) -> list[dict]:
    out = []
    for pol in by_kind(objs, "NetworkPolicy"):
        types = pol["spec"].get("policyTypes") or ["Ingress"]
        if "Ingress" in types and selector_matches(pol["spec"]["podSelector"], pods.labels):
            out.append(pol)
    return out


def allowed(objs: list[dict], pods: Pods, src: Source) -> frozenset:
    """The ports of `pods` that `src` may open connections to."""
    policies = selecting(objs, pods)
    if not policies:
        return ALL
    named = container_ports(pods)
    ports: set = set()
    for pol in policies:
        for rule in pol["spec"].get("ingress") or []:
            peers = rule.get("from") or []
            if not peers or any(peer_matches(p, src) for p in peers):
                got = rule_ports(rule, named)
                if got == ALL:
                    return ALL
                ports |= got
    return frozenset(ports)


def test_every_pod_is_covered_by_an_ingress_policy(rendered):
    for pods in rendered.pods:
        assert selecting(rendered.objs, pods), f"{pods.where} accepts any connection"


def test_each_policy_selects_exactly_its_pool(rendered):
    for pol in by_kind(rendered.objs, "NetworkPolicy"):
        group = pol["metadata"]["name"].removeprefix("specdec-")
        selected = {p.group for p in rendered.pods
                    if selector_matches(pol["spec"]["podSelector"], p.labels)}
        assert selected == {group}, f"{pol['metadata']['name']} selects {selected}"


def test_policy_ports_are_ports_the_pods_listen_on(rendered):
    for pol in by_kind(rendered.objs, "NetworkPolicy"):
        pods = [p for p in rendered.pods if selector_matches(pol["spec"]["podSelector"],
                                                             p.labels)]
        listening = {p["containerPort"] for pp in pods for c in pp.spec["containers"]
                     for p in c.get("ports", [])}
        for rule in pol["spec"]["ingress"]:
            for port in rule.get("ports", []):
                assert port["port"] in listening, f"{pol['metadata']['name']}: {port}"


def test_model_services_accept_grpc_only_from_coordinator_pods(rendered):
    coordinator_pods = rendered.group("coordinator")
    assert len(coordinator_pods) >= 2  # the Ray head and a worker group
    for group in ("draft", "target"):
        (pods,) = rendered.group(group)
        grpc, metrics = container_ports(pods)["grpc"], container_ports(pods)["metrics"]
        for c in coordinator_pods:
            src = pod_in(NAMESPACE, c.labels)
            assert allowed(rendered.objs, pods, src) == {grpc}, f"{c.where} -> {group}"
        for other in ("draft", "target"):
            for p in rendered.group(other):
                src = pod_in(NAMESPACE, p.labels)
                assert allowed(rendered.objs, pods, src) == set(), f"{other} -> {group}"
        for src in (CLIENT_POD, OTHER_NAMESPACE, EXTERNAL, OPERATOR):
            assert allowed(rendered.objs, pods, src) == set(), f"{src} -> {group}"
        assert allowed(rendered.objs, pods, PROMETHEUS) == {metrics}


def test_clients_reach_only_the_coordinators_grpc_and_http_ports(rendered):
    (rs,) = by_kind(rendered.objs, "RayService")
    serve = yaml.safe_load(rs["spec"]["serveConfigV2"])
    for pods in rendered.group("coordinator"):
        grpc, http = container_ports(pods)["grpc"], container_ports(pods)["http"]
        assert (grpc, http) == (serve["grpc_options"]["port"], serve["http_options"]["port"])
        assert (grpc, http) == (50050, 8000)
        clients = {grpc, http}  # Serve's gRPC proxy and its HTTP proxy (the OpenAI API)
        for src in (CLIENT_POD, OTHER_NAMESPACE, EXTERNAL):
            assert allowed(rendered.objs, pods, src) == clients, f"{src} -> {pods.where}"
        for group in ("draft", "target"):  # no way back in but as a client
            (p,) = rendered.group(group)
            assert allowed(rendered.objs, pods, pod_in(NAMESPACE, p.labels)) == clients
        # Ray's metrics, and specdec's (one port per Serve replica on the pod)
        assert allowed(rendered.objs, pods, PROMETHEUS) == {*clients, 8080,
                                                            *range(9100, 9108)}
        # the dashboard, and the HTTP proxy's /-/healthz (a client port anyway)
        assert allowed(rendered.objs, pods, OPERATOR) == {*clients, 8265}
        for peer in rendered.group("coordinator"):  # Ray's own traffic between its pods
            assert allowed(rendered.objs, pods, pod_in(NAMESPACE, peer.labels)) == ALL


def test_evaluator_sees_an_open_policy(rendered):
    """The evaluator is not vacuous: a rule without `from` opens a model service."""
    objs = [dict(o) for o in rendered.objs]
    (pods,) = rendered.group("target")
    assert allowed(objs, pods, EXTERNAL) == set()
    pol = next(o for o in objs if o["kind"] == "NetworkPolicy"
               and o["metadata"]["name"] == "specdec-target")
    opened = {**pol, "spec": {**pol["spec"], "ingress": [*pol["spec"]["ingress"],
                                                          {"ports": [{"port": 50052}]}]}}
    objs[objs.index(pol)] = opened
    assert allowed(objs, pods, EXTERNAL) == {50052}
