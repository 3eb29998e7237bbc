"""Draft, target and coordinator as child processes on loopback (`specdec up`, demo).

With `tls_dir`, every hop is TLS with development certificates made there on the fly
(specdec.certs; an existing CA in the folder is kept): mutual TLS from the coordinator to
the draft and target, and TLS on the coordinator's client API (gRPC and HTTPS).
`Stack.client_tls` is what a client of ours needs then (the CA, and the `client`
certificate, which the API does not require but accepts)."""

from __future__ import annotations

import logging
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path

from specdec import launcher
from specdec import pair as pairs

log = logging.getLogger(__name__)


@dataclass
class StackConfig:
    pair: pairs.Pair = pairs.DEFAULT_PAIR  # model, backend, weights, threads of each service
    # The coordinator's options; None = not passed on, so the coordinator's own default
    # (coordinator.loop.policy) applies: each default is defined there alone.
    k: int | None = None
    draft_port: int = 50051
    target_port: int = 50052
    port: int = 50050
    http_port: int = 8000  # the OpenAI-compatible HTTP API and /demo (0 = not exposed)
    pin: bool = True  # specdec.pair.placement(): draft on the first CPU, target on the second
    pipeline: bool | None = None
    no_draft: bool = False
    drafter: str | None = None  # model | lookup | hybrid (coordinator.drafters.base)
    lookup_cache: int | None = None  # recent outputs per tenant; 0 = off
    tls_dir: str = ""  # "" = plaintext; else dev certificates here and TLS on every hop


@dataclass
class Stack:
    draft: launcher.ServiceProcess | None
    target: launcher.ServiceProcess
    coordinator: launcher.ServiceProcess
    http_port: int = 0
    client_tls: object = None  # specdec.tls.ClientTLS for the client API, None = plaintext
    tls_paths: dict | None = None  # specdec.certs.make_dev_certs' result, with tls_dir

    @property
    def address(self) -> str:
        return self.coordinator.address

    @property
    def http_url(self) -> str | None:
        """The HTTP API's base URL (None when it is not exposed)."""
        host = self.address.rsplit(":", 1)[0]
        scheme = "https" if self.client_tls is not None else "http"
        return f"{scheme}://{host}:{self.http_port}" if self.http_port > 0 else None


def coordinator_client_tls(paths: dict) -> dict[str, str]:
    """CoordinatorConfig's fields for mutual TLS to the draft and target, from
    make_dev_certs' paths."""
    crt, key = paths["coordinator-client"]
    return {"tls_ca": str(paths["ca"][0]), "tls_cert": str(crt), "tls_key": str(key)}


def with_service_tls(pair: pairs.Pair, paths: dict) -> pairs.Pair:
    """`pair` with each service serving mutual TLS from make_dev_certs' paths."""
    ca = str(paths["ca"][0])

    def served(spec):
        crt, key = paths[spec.role]
        return spec.with_(extra=spec.extra + ("--tls-cert", str(crt), "--tls-key", str(key),
                                              "--tls-client-ca", ca))

    return replace(pair, target=served(pair.target), draft=served(pair.draft))


def coordinator_tls_flags(paths: dict) -> list[str]:
    """The coordinator's flags for mutual TLS inside and TLS on its client API."""
    api_crt, api_key = paths["coordinator"]
    inside = [x for name, value in coordinator_client_tls(paths).items()
              for x in (f"--{name.replace('_', '-')}", value)]
    return inside + ["--api-tls-cert", str(api_crt), "--api-tls-key", str(api_key)]


def coordinator_options(cfg: StackConfig) -> list[str]:
    """The coordinator's flags for the options `cfg` sets (the rest keep its defaults)."""
    out = [] if cfg.k is None else ["--k", str(cfg.k)]
    if cfg.pipeline is not None:
        out.append("--pipeline" if cfg.pipeline else "--no-pipeline")
    if cfg.drafter is not None:
        out += ["--drafter", cfg.drafter]
    if cfg.lookup_cache is not None:
        out += ["--lookup-cache", str(cfg.lookup_cache)]
    return out


def start(cfg: StackConfig, stack: ExitStack, echo: bool = False) -> Stack:
    """Start all three; each is stopped (SIGTERM) when `stack` closes."""
    pair, coord_tls, client, paths = cfg.pair, [], None, None
    if cfg.tls_dir:
        from specdec import certs
        from specdec.tls import client_tls

        paths = certs.make_dev_certs(Path(cfg.tls_dir), days=30,
                                     say=lambda m: log.debug("certs: %s", m))
        pair, coord_tls = with_service_tls(pair, paths), coordinator_tls_flags(paths)
        client = client_tls(str(paths["ca"][0]), *map(str, paths["client"]))
        log.info("TLS on every hop, certificates in %s", cfg.tls_dir)
    running = pairs.start(pair, stack, pin=cfg.pin, target_port=cfg.target_port,
                          draft_port=cfg.draft_port, with_draft=not cfg.no_draft, echo=echo)
    # the tokenizer from the target's own name or folder (a folder's model id, its
    # basename, names nothing the coordinator could load)
    model = pair.target.model
    coord_args = ["--model", str(Path(model).resolve()) if Path(model).exists() else model,
                  "--target", running.target.address, "--port", str(cfg.port),
                  "--http-port", str(cfg.http_port), *coordinator_options(cfg), *coord_tls]
    if running.draft:
        coord_args += ["--draft", running.draft.address]
    log.info("starting coordinator (Ray Serve) ...")
    coordinator = launcher.start("coordinator", coord_args, timeout=300, echo=echo,
                                 name="coordinator (Ray Serve)")
    stack.callback(coordinator.stop)
    log.info("coordinator ready at %s", coordinator.address)
    return Stack(running.draft, running.target, coordinator, cfg.http_port, client, paths)
