"""python -m coordinator --draft ADDR[,ADDR] --target ADDR[,ADDR] [--port 50050] (see --help).

Starts an embedded Ray (or joins --ray-address), starts Serve's gRPC proxy on --port
with specdec.v1.Generator and grpc.health.v1, deploys the coordinator and serves until
SIGTERM/SIGINT, then shuts Serve and Ray down.

Ray 2.60 turns on token authentication for a new local cluster and writes the token to
~/.ray/auth_token. The embedded cluster here keeps token auth on but takes a random
per-run token from RAY_AUTH_TOKEN instead, so nothing is written outside Ray's session
folder (under the system temp dir). Set RAY_AUTH_MODE / RAY_AUTH_TOKEN yourself to
override; with --ray-address, the cluster's own settings apply.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import sys
import tempfile
import threading
import time

from coordinator.deploy.config import RAY_ENVIRONMENT, CoordinatorConfig, from_args

log = logging.getLogger("coordinator")


def ray_environment(cfg: CoordinatorConfig) -> None:
    """Token auth with a per-run token in the environment, and RAY_ENVIRONMENT (must
    precede `import ray`)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    for key, value in RAY_ENVIRONMENT.items():
        os.environ.setdefault(key, value)
    if not cfg.ray_address:
        os.environ.setdefault("RAY_AUTH_MODE", "token")
        os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))


# What ray.init raises when a local node's start timed out on a busy host: the raylet
# registering with its GCS (a fixed 30 s), or the GCS writing its port file.
RAY_START_TIMEOUTS = ("timed out during startup", "Timed out waiting for file")


def start_ray(cfg: CoordinatorConfig) -> None:
    """Join --ray-address, or start a local Ray. Ray gives a new node fixed times to
    start (RAY_START_TIMEOUTS), which a busy host (a test suite, a benchmark beside it)
    can exceed; a start that timed out so is retried, its processes stopped, for as long
    as --startup-timeout allows."""
    import ray

    if cfg.ray_address:
        ray.init(address=cfg.ray_address, log_to_driver=False)
        return
    deadline = time.monotonic() + cfg.startup_timeout
    attempt = 1
    while True:
        try:
            ray.init(
                num_cpus=os.cpu_count() or 1, include_dashboard=False, log_to_driver=False,
                _temp_dir=os.path.join(tempfile.gettempdir(), f"specdec-ray-{os.getuid()}"),
                configure_logging=False,
            )
            return
        except Exception as exc:  # noqa: BLE001 - Ray raises a bare Exception for this
            timed_out = any(m in str(exc) for m in RAY_START_TIMEOUTS)
            if not timed_out or time.monotonic() > deadline:
                raise
            log.warning("Ray's node did not start within Ray's own time (attempt %d; a "
                        "busy host?): %s; retrying until --startup-timeout (%.0f s in all)",
                        attempt, str(exc).splitlines()[0][:200], cfg.startup_timeout)
            _stop_children()
            attempt += 1


def _stop_children() -> None:
    """Stop what a failed Ray start left running (its GCS, raylet and helpers)."""
    import psutil

    children = psutil.Process().children(recursive=True)
    for child in children:
        child.terminate()
    _, alive = psutil.wait_procs(children, timeout=10)
    for child in alive:
        child.kill()


def api_tls(cfg: CoordinatorConfig):
    """The client API's ServerTLS, or None for plaintext (ValueError: an incomplete set of
    flags or unusable files)."""
    from specdec.tls import server_tls

    return server_tls(cfg.api_tls_cert, cfg.api_tls_key, cfg.api_tls_client_ca, "--api-tls")


def deploy(cfg: CoordinatorConfig, tls=None):
    """Start Serve's proxies and the app, bounded by --startup-timeout; with `tls` (a
    ServerTLS), Serve's HTTP proxy on loopback and coordinator.deploy.front's TLS servers in
    front (returned, to stop at shutdown), else None."""
    from ray import serve
    from ray.serve.config import HTTPOptions, gRPCOptions

    from coordinator.deploy.app import APP_NAME, SERVICER_FUNCTIONS, application

    if tls is None:
        serve.start(
            http_options=HTTPOptions(host=cfg.http_host, port=cfg.http_port),
            grpc_options=gRPCOptions(port=cfg.port,
                                     grpc_servicer_functions=SERVICER_FUNCTIONS),
        )
    else:
        from coordinator.deploy.front import TLSFront, free_loopback_port

        front = TLSFront(tls, cfg.port, cfg.http_host, cfg.http_port,
                         free_loopback_port() if cfg.http_port > 0 else 0)
        # No servicer functions: Serve's plaintext gRPC proxy is not started at all.
        serve.start(http_options=HTTPOptions(host="127.0.0.1",
                                             port=front.http_backend_port or cfg.http_port),
                    grpc_options=gRPCOptions(port=cfg.port, grpc_servicer_functions=[]))
    failure: list[BaseException] = []

    def run():
        try:
            serve.run(application(cfg.to_dict()), name=APP_NAME, route_prefix="/")
        except BaseException as exc:  # noqa: BLE001 - reported below
            failure.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(cfg.startup_timeout)
    if t.is_alive():
        raise TimeoutError(f"Serve did not deploy the coordinator within "
                           f"{cfg.startup_timeout:.0f} s (not enough CPUs for the replicas?)")
    if failure:
        raise failure[0]
    if tls is None:
        return None
    front.start(serve.get_deployment_handle("Coordinator", app_name=APP_NAME))
    return front


# Serve's proxy (it forwards every streamed chunk) and controller (it polls) are not on a
# step's critical path; the lockstep engine in the replica and the model services are.
BACKGROUND = ("ray::ProxyActor", "ray::ServeController")
BACKGROUND_NICENESS = 15


def background_serve_processes() -> None:
    """Lower the CPU priority of the Ray cluster this process started: Serve's proxy and
    controller (BACKGROUND), so that on a machine the model services keep busy they use
    the services' idle moments, while the replicas keep the services' priority
    (RAY_ENVIRONMENT). Best effort, Linux only: found as descendants of this process."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()  # noqa: SIM115 - tiny read
                children.setdefault(int(stat[stat.rindex(")") + 2:].split()[1]),
                                    []).append(int(entry))
            except (OSError, ValueError):
                continue
    todo, lowered = list(children.get(os.getpid(), [])), []
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            title = open(f"/proc/{pid}/cmdline").read()  # noqa: SIM115 - tiny read
            if title.startswith(BACKGROUND):
                os.setpriority(os.PRIO_PROCESS, pid, BACKGROUND_NICENESS)
                lowered.append(title.split()[0].rstrip("\x00"))
        except OSError:
            continue
    if lowered:
        log.info("lower CPU priority (niceness %d) for %s", BACKGROUND_NICENESS,
                 ", ".join(sorted(lowered)))


def main(argv: list[str] | None = None) -> int:
    cfg = from_args(argv)
    logging.basicConfig(level=cfg.log_level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    t0 = time.perf_counter()
    ray_environment(cfg)
    import ray
    from ray import serve

    from coordinator.deploy.setup import build_service

    front = None
    try:
        tls = api_tls(cfg)
        # Check the services (reachable, same tokenizer) before Ray: a clear error now
        # beats a replica that fails in a loop inside Serve.
        build_service(cfg)
        if cfg.api_keys:  # a bad key file fails here, not in every replica
            from coordinator.api.auth import APIKeys

            APIKeys.load(cfg.api_keys, cfg.api_key_concurrency)
        start_ray(cfg)
        front = deploy(cfg, tls)
        if not cfg.ray_address:
            background_serve_processes()
    except (OSError, ValueError, TimeoutError, ConnectionError) as exc:
        log.error("cannot start the coordinator: %s", exc)
        if ray.is_initialized():
            serve.shutdown()
            ray.shutdown()
        return 2
    # After ray.init, which installs its own SIGTERM handler.
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: stop.set())
    metrics = f" metrics-port={cfg.metrics_port}" if cfg.metrics_port > 0 else ""
    scheme = "https" if front is not None else "http"
    if cfg.http_port > 0:
        metrics += f" http={scheme}://{cfg.http_host}:{cfg.http_port}"
    if front is not None:
        metrics += " tls=on"
    log.info("coordinator service ready in %.1f s: draft=%s target=%s%s address=%s:%d",
             time.perf_counter() - t0, cfg.draft or "(none)", cfg.target, metrics, cfg.host,
             cfg.port)
    stop.wait()
    log.info("shutting down Serve and Ray")
    if front is not None:
        front.stop()
    serve.shutdown()
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
