"""The soak's topology and its faults: one draft, two target replicas and a Ray Serve
coordinator (`--target A,B`) as real processes on loopback, killed and restarted on a
schedule.

Every model service gets a fixed gRPC port and a metrics port (`--metrics-port`), so a
restart comes back on the same addresses, and its live sessions can be read from its
`specdec_<role>_live_sessions` gauge; the coordinator's metrics port gives
`specdec_coordinator_active_generations`. RSS comes from /proc/PID/status (VmRSS), for
each model service and for every process of the coordinator's tree (the driver, Ray's
GCS and raylet, Serve's controller, proxy and the Coordinator replica).

The faults, in this order (times are fractions of the run, `--fault-at`):
  1. draft-kill       kill -9 the draft, restart it at once on its port. Designed outcome:
                      no error; generations go target-only and speculate again later.
  2. target-kill      kill -9 target A and leave it dead. Designed outcome: no error; every
                      generation pinned to A re-pins to B and repeats its round.
  3. target-restart   SIGTERM target B (it drains for its --grace, then exits) and restart
                      it on its port. No target is left until B is back: UNAVAILABLE ("no
                      target replica ...") is the designed error from the SIGTERM until B
                      is ready plus a recovery allowance (see `no_target_windows`).
So the run ends on the restarted draft and the restarted B alone, which must serve exact
greedy output after the coordinator saw every target fail.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from specdec import launcher
from specdec.pair import Pair, ServiceSpec, placement
from specdec_tools.bench.drain import free_port, live_sessions, sample, scrape

log = logging.getLogger("specdec_tools.soak.cli")

FAULTS = ("draft-kill", "target-kill", "target-restart")
# Early enough that the run sees the recovery: target B's restart takes ~30 s on two
# loaded cores with the real model, and the router's doubling back-off can keep it unused
# about as long again once it is back.
DEFAULT_FAULT_AT = (0.1, 0.25, 0.4)
# After B is ready again, UNAVAILABLE stays designed this long plus B's downtime: while B
# was down the router marked it failed on every try, doubling its back-off (2 s, 4 s,
# 8 s, ...: the next try after B is back is at most one downtime + 2 s later), and the
# channel's own reconnect back-off adds at most 2 s (coordinator.remote.routing).
RECOVERY_SLACK_S = 5.0


def rss_mib(pid: int) -> float | None:
    """VmRSS of a process in MiB (None once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def process_tree(root: int) -> dict[int, str]:
    """{pid: name} of `root` and all its descendants (name: argv[0], Ray's process title
    for its workers, e.g. ray::ServeReplica:specdec:Coordinator)."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
        names[int(entry.name)] = _name(argv)
    tree, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in names and pid not in tree:
            tree[pid] = names[pid]
            todo += [p for p, parent in parents.items() if parent == pid]
    return tree


def _name(argv: list[bytes]) -> str:
    words = [a.decode(errors="replace") for a in argv if a]
    if not words:
        return "?"
    if words[0].startswith("ray::"):  # its title names the task running now: cut it
        return words[0].split()[0].split(".")[0]
    if "-m" in words[:3]:
        return words[words.index("-m") + 1]
    script = next((w for w in words[1:4] if w.endswith(".py")), None)
    return os.path.basename(script or words[0])


def _last_error(lines: list[str]) -> str:
    """The exception a logged traceback ended with (its last unindented '...Error' line
    before the next log line)."""
    last = ""
    for line in lines:
        if line.startswith(("INFO", "WARNING", "ERROR", "DEBUG")):
            break
        if line and not line[0].isspace() and "Error" in line:
            last = line
    return last


@dataclass
class ModelService:
    """One model service slot: a role, fixed ports, and its current process."""

    name: str  # "draft", "target-a", "target-b"
    spec: ServiceSpec
    cpus: int | None
    port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    proc: launcher.ServiceProcess | None = None
    pids: list[int] = field(default_factory=list)  # every process it ran, in order
    logs: list[launcher.ServiceProcess] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 300.0, tries: int = 3) -> None:
        """Start (or restart) it on its ports. Between a kill and its restart another
        process may take a port as its own ephemeral one; a taken metrics port is then
        replaced by a free one (only the soak reads it), and a taken gRPC port, which the
        coordinator knows, is waited for."""
        for attempt in range(1, tries + 1):
            args = self.spec.args(self.port, self.cpus) + ["--metrics-port",
                                                           str(self.metrics_port)]
            try:
                self.proc = launcher.start(self.spec.module, args, timeout=timeout,
                                           name=self.name)
                break
            except RuntimeError as exc:
                taken = "Address already in use" in str(exc) or "address in use" in str(exc)
                if not taken or attempt == tries:
                    raise
                if "cannot serve metrics" in str(exc):
                    old, self.metrics_port = self.metrics_port, free_port()
                    log.warning("%s: metrics port %d is taken; restarting it on %d",
                                self.name, old, self.metrics_port)
                else:
                    log.warning("%s: port %d is taken; trying again in 2 s", self.name,
                                self.port)
                    time.sleep(2.0)
        self.pids.append(self.proc.proc.pid)
        self.logs.append(self.proc)
        log.info("%s ready at %s (pid %d, metrics port %d)", self.name, self.address,
                 self.proc.proc.pid, self.metrics_port)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.proc.poll() is None

    def signal(self, sig: int, wait_s: float = 60.0) -> int | None:
        """Send `sig` and wait for the process to exit; its exit status."""
        if not self.alive():
            return None
        self.proc.proc.send_signal(sig)
        try:
            return self.proc.proc.wait(wait_s)
        except Exception:  # noqa: BLE001 - it ignored the signal: SIGKILL, and say so
            log.warning("%s did not exit within %.0f s of %s; killing it", self.name, wait_s,
                        signal.Signals(sig).name)
            self.proc.proc.kill()
            return self.proc.proc.wait()

    def sessions(self) -> int | None:
        """Live sessions from its metrics gauge (None when it is not running)."""
        if not self.alive():
            return None
        return int(live_sessions(self.metrics_port, self.spec.role))

    def kv_pool_mib(self) -> float | None:
        """Its KV block pool in MiB (metrics' kv_pool_bytes); None if it cannot say."""
        try:
            pool = scrape(self.metrics_port).get(f"specdec_{self.spec.role}_kv_pool_bytes")
        except OSError:
            return None
        return None if pool is None else round(pool / 2**20, 1)

    def stop(self) -> None:
        if self.alive():
            self.proc.stop()


@dataclass
class Topology:
    """Draft, targets A and B, and the coordinator over them."""

    draft: ModelService
    targets: list[ModelService]
    coordinator: launcher.ServiceProcess | None = None
    port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)

    @classmethod
    def plan(cls, pair: Pair, pin: bool = True) -> Topology:
        """Draft on the first CPU, both targets on the second (specdec.pair.placement)."""
        cpus = placement(pin)
        return cls(ModelService("draft", pair.draft, cpus["draft"]),
                   [ModelService(f"target-{x}", pair.target, cpus["target"]) for x in "ab"])

    @property
    def services(self) -> list[ModelService]:
        return [self.draft, *self.targets]

    @property
    def address(self) -> str:
        return self.coordinator.address

    def start(self, max_concurrency: int, coordinator_flags: list[str] = ()) -> None:
        for service in self.services:
            service.start()
        args = ["--draft", self.draft.address,
                "--target", ",".join(t.address for t in self.targets),
                "--port", str(self.port), "--http-port", "0",
                "--metrics-port", str(self.metrics_port),
                "--max-concurrency", str(max_concurrency), *coordinator_flags]
        log.info("starting the coordinator (Ray Serve): %s", " ".join(args))
        self.coordinator = launcher.start("coordinator", args, timeout=300,
                                          name="coordinator")
        log.info("coordinator ready at %s (pid %d)", self.address,
                 self.coordinator.proc.pid)

    def active_generations(self) -> int:
        """The coordinator replica's active-generations gauge."""
        return int(sample(self.metrics_port, "specdec_coordinator_active_generations"))

    def processes(self) -> dict[str, int]:
        """{label: pid} of every live process: the model services and the coordinator's
        tree (labels 'coordinator/<name>', with the pid when a name repeats)."""
        out = {s.name: s.proc.proc.pid for s in self.services if s.alive()}
        if self.coordinator is not None and self.coordinator.proc.poll() is None:
            tree = process_tree(self.coordinator.proc.pid)
            counts: dict[str, int] = {}
            for name in tree.values():
                counts[name] = counts.get(name, 0) + 1
            for pid, name in sorted(tree.items()):
                label = "coordinator/" + (name if counts[name] == 1 else f"{name}[{pid}]")
                out[label] = pid
        return out

    def stop(self, log_dir: Path | None = None) -> None:
        if self.coordinator is not None:
            code = self.coordinator.stop(timeout=60)
            log.info("coordinator stopped (exit %s)", code)
        for service in self.services:
            service.stop()
        if log_dir is not None:
            self.write_logs(log_dir)

    def coordinator_errors(self) -> list[str]:
        """ERROR lines the coordinator logged (an internal error: `generation failed` with
        its traceback, asyncio's 'Task exception was never retrieved') in Ray's worker
        logs of this coordinator's session (session_*_<driver pid>)."""
        if self.coordinator is None:
            return []
        import glob
        import tempfile

        root = Path(tempfile.gettempdir()) / f"specdec-ray-{os.getuid()}"
        out = []
        pattern = f"session_*_{self.coordinator.proc.pid}/logs/worker-*.err"
        for path in sorted(glob.glob(str(root / pattern))):
            lines = Path(path).read_text(errors="replace").splitlines()
            for i, line in enumerate(lines):
                if line.startswith("ERROR:coordinator") or \
                        line.startswith("ERROR:asyncio"):
                    out.append(f"{line} -> {_last_error(lines[i + 1:i + 200])}"[:300])
        return out

    def write_logs(self, folder: Path) -> None:
        """Every process's output: <name>.<pid>.log."""
        folder.mkdir(parents=True, exist_ok=True)
        procs = [p for s in self.services for p in s.logs] + \
            ([self.coordinator] if self.coordinator is not None else [])
        for p in procs:
            (folder / f"{p.name}.{p.proc.pid}.log").write_text(p.output)
        log.info("service logs in %s", folder)


@dataclass
class Fault:
    name: str  # one of FAULTS
    service: str  # the victim's name
    planned_s: float  # when, from the start of the run
    at_s: float | None = None  # the signal was sent
    exited_s: float | None = None  # the victim was gone
    back_s: float | None = None  # a restarted victim was ready again (None: left dead)
    detail: str = ""

    def as_dict(self) -> dict:
        return {k: (round(v, 2) if isinstance(v, float) else v)
                for k, v in self.__dict__.items()}


class FaultInjector:
    """Runs the three faults at their times in a thread; `rss_hook(label)` is called for
    RSS snapshots just before a victim is signalled and once a restart is ready."""

    def __init__(self, topo: Topology, duration_s: float, fault_at=DEFAULT_FAULT_AT,
                 rss_hook: Callable[[str], None] | None = None):
        a, b = topo.targets
        self.topo = topo
        self.faults = [Fault("draft-kill", topo.draft.name, fault_at[0] * duration_s),
                       Fault("target-kill", a.name, fault_at[1] * duration_s),
                       Fault("target-restart", b.name, fault_at[2] * duration_s)]
        self.rss_hook = rss_hook or (lambda label: None)
        self.errors: list[str] = []
        self._t0 = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, t0: float) -> None:
        self._t0 = t0
        self._thread = threading.Thread(target=self._run, name="faults", daemon=True)
        self._thread.start()

    def now(self) -> float:
        return time.monotonic() - self._t0

    def _run(self) -> None:
        services = {s.name: s for s in self.topo.services}
        for fault in self.faults:
            if self._stop.wait(max(0.0, fault.planned_s - self.now())):
                return
            try:
                self._inject(fault, services[fault.service])
            except Exception as exc:  # noqa: BLE001 - a failed restart fails the soak
                self.errors.append(f"{fault.name}: {type(exc).__name__}: {exc}"[:2000])
                log.error("fault %s failed: %s", fault.name, exc)

    def _inject(self, fault: Fault, victim: ModelService) -> None:
        self.rss_hook(f"before {fault.name}")
        sig = signal.SIGTERM if fault.name == "target-restart" else signal.SIGKILL
        fault.at_s = self.now()
        log.info("FAULT at %.1f s: %s %s (pid %d)", fault.at_s, signal.Signals(sig).name,
                 victim.name, victim.proc.proc.pid)
        code = victim.signal(sig)
        fault.exited_s = self.now()
        fault.detail = f"{signal.Signals(sig).name} pid {victim.pids[-1]}, exit {code}"
        if fault.name == "target-kill":
            log.info("FAULT %s: %s gone at %.1f s, left dead", fault.name, victim.name,
                     fault.exited_s)
            return
        log.info("FAULT %s: %s exited (%s) at %.1f s; restarting it on port %d", fault.name,
                 victim.name, code, fault.exited_s, victim.port)
        victim.start()
        fault.back_s = self.now()
        fault.detail += f"; restarted as pid {victim.pids[-1]}"
        log.info("FAULT %s: %s back at %.1f s (down %.1f s)", fault.name, victim.name,
                 fault.back_s, fault.back_s - fault.at_s)
        self.rss_hook(f"after {fault.name}")

    def no_target_windows(self) -> list[tuple[float, float]]:
        """When UNAVAILABLE is designed: from the SIGTERM of the last target to its
        return plus its downtime plus RECOVERY_SLACK_S (open-ended while it is not back)."""
        out = []
        for f in self.faults:
            if f.name == "target-restart" and f.at_s is not None:
                if f.back_s is None:
                    out.append((f.at_s, float("inf")))
                else:
                    out.append((f.at_s, f.back_s + (f.back_s - f.at_s) + RECOVERY_SLACK_S))
        return out

    def join(self, timeout: float | None = None) -> None:
        """Wait for the remaining faults (their times may be past the run's end)."""
        if self._thread is not None:
            self._thread.join(timeout)

    def cancel(self) -> None:
        self._stop.set()
