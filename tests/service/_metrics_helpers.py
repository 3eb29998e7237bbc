"""Shared helpers for the metrics tests: free ports, scrapes, deltas, metered services."""

from __future__ import annotations

import socket
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from draft_service.__main__ import create as create_draft
from draft_service.config import DraftConfig
from target_service.__main__ import create as create_target
from target_service.config import TargetConfig

PROMPT = [1, 2, 3, 4, 5]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Samples:
    """One scrape: {(sample name, labels): value}. A missing sample is a KeyError."""

    def __init__(self, port: int):
        url = f"http://127.0.0.1:{port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            text = resp.read().decode()
        self.values = {
            (s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples
        }

    def __call__(self, name: str, **labels) -> float:
        return self.values[(name, frozenset(labels.items()))]

    def has(self, name: str, **labels) -> bool:
        return (name, frozenset(labels.items())) in self.values


class Delta:
    """after - before for counters and histogram series (absent before = 0)."""

    def __init__(self, before: Samples, after: Samples):
        self.before, self.after = before, after

    def __call__(self, name: str, **labels) -> float:
        old = self.before(name, **labels) if self.before.has(name, **labels) else 0.0
        return self.after(name, **labels) - old


@pytest.fixture(scope="module")
def services():
    """((draft address, engine), (target address, engine)) with --metrics-port set."""
    made = []

    def up(create, cfg):
        server, port, engine = create(cfg)
        made.append((server, engine))
        server.start()
        return f"127.0.0.1:{port}", engine

    draft = up(create_draft, DraftConfig(model="tiny-random-draft", port=0, max_sessions=8,
                                         metrics_port=free_port()))
    target = up(create_target, TargetConfig(model="tiny-random", port=0, max_sessions=8,
                                            metrics_port=free_port()))
    yield draft, target
    for server, engine in made:
        server.stop(0)
        engine.model.metrics.close()
