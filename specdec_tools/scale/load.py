"""Client load for the scale-out runs: streams of generations, each checked.

A stream is a thread that sends one generation after another (GenerateStream, greedy,
K from the server) to the coordinator addresses it is given, in turn, until told to stop.
Every generation is an `Outcome`: when it ran, through which proxy, who served it (the
coordinator's --expose-replicas stats), its ids, and the error a client saw, if any.
`check` compares each with its prompt's reference: target-only greedy ids computed once,
beforehand, by a loop in this process straight against a target replica. Greedy
speculative output must equal them whatever replica, node or re-pin served it.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc

from specdec.v1 import generate_pb2, generate_pb2_grpc


def prompts(n: int, length: int = 6, vocab: int = 200, seed: int = 17) -> list[list[int]]:
    """n token-id prompts (ids from 3: clear of special tokens)."""
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(n)]


def references(target: str, prompt_list: Sequence[list[int]], max_new_tokens: int) -> list:
    """Target-only greedy ids of each prompt, from a loop in this process against the
    target replica at `target`."""
    from coordinator.deploy.config import CoordinatorConfig
    from coordinator.deploy.setup import build_service

    service = build_service(CoordinatorConfig(target=target, draft="", drafter="model"))
    return [list(service.generate(_request(p, max_new_tokens, 0)).token_ids)
            for p in prompt_list]


def _request(prompt: list[int], max_new_tokens: int, k: int | None):
    req = generate_pb2.GenerateRequest(prompt_token_ids=prompt, max_new_tokens=max_new_tokens)
    if k is not None:
        req.num_draft_tokens = k
    return req


@dataclass
class Outcome:
    prompt: int  # index into the prompt list
    via: str  # the proxy address the client dialled
    started: float  # time.monotonic()
    ended: float
    token_ids: list[int] = field(default_factory=list)
    error: str = ""  # "CODE: details" as the client saw it
    replica: str = ""  # the Serve replica that ran it
    node: str = ""  # its Ray node
    drafts: list[str] = field(default_factory=list)  # draft replicas pinned, in order
    targets: list[str] = field(default_factory=list)  # target replicas pinned, in order


def generate(stub, via: str, index: int, prompt: list[int], max_new_tokens: int,
             k: int | None = 4, timeout: float = 120.0) -> Outcome:
    out = Outcome(index, via, time.monotonic(), 0.0)
    try:
        for chunk in stub.GenerateStream(_request(prompt, max_new_tokens, k), timeout=timeout):
            out.token_ids += chunk.token_ids
            if chunk.finish_reason:
                s = chunk.stats
                out.replica, out.node = s.coordinator_replica, s.coordinator_node
                out.drafts, out.targets = list(s.draft_replicas), list(s.target_replicas)
    except grpc.RpcError as e:
        out.error = f"{e.code().name}: {e.details()}"
    out.ended = time.monotonic()
    return out


REFUSED = "UNAVAILABLE: failed to connect to all addresses"


class Streams:
    """`n` client streams over `addresses` (stream i starts at address i mod len), each
    cycling through the prompts from its own offset; `resize(n)` adds or stops streams
    (a stream told to stop finishes its generation first)."""

    def __init__(self, addresses: Sequence[str], prompt_list: Sequence[list[int]],
                 max_new_tokens: int, k: int | None = 4):
        self.addresses, self.prompts = list(addresses), list(prompt_list)
        self.max_new_tokens, self.k = max_new_tokens, k
        self.outcomes: list[Outcome] = []
        self.refused: dict[str, int] = {}  # connections a proxy refused, per address
        self._lock = threading.Lock()
        self._threads: list[tuple[threading.Thread, threading.Event]] = []
        self._channels = {a: grpc.insecure_channel(a) for a in self.addresses}

    def _run(self, i: int, stop: threading.Event) -> None:
        j = i
        while not stop.is_set():
            index = j % len(self.prompts)
            # As a load balancer in front of the proxies would: a proxy that refuses the
            # connection (Serve runs one only on nodes with a replica) got nothing, so
            # the generation goes to the next one; counted, not an error.
            for step in range(len(self.addresses)):
                address = self.addresses[(j + step) % len(self.addresses)]
                stub = generate_pb2_grpc.GeneratorStub(self._channels[address])
                out = generate(stub, address, index, self.prompts[index],
                               self.max_new_tokens, self.k)
                if not out.error.startswith(REFUSED):
                    break
                with self._lock:
                    self.refused[address] = self.refused.get(address, 0) + 1
            with self._lock:
                self.outcomes.append(out)
            j += 1

    @property
    def active(self) -> int:
        return sum(1 for _, stop in self._threads if not stop.is_set())

    def resize(self, n: int) -> None:
        live = [(t, s) for t, s in self._threads if not s.is_set()]
        for _, stop in live[n:]:
            stop.set()
        for i in range(len(live), n):
            stop = threading.Event()
            t = threading.Thread(target=self._run, args=(len(self._threads), stop),
                                 daemon=True, name=f"stream-{i}")
            self._threads.append((t, stop))
            t.start()

    def stop(self, timeout: float = 180.0) -> list[Outcome]:
        """Stop every stream, wait for their last generations; all outcomes."""
        for _, stop in self._threads:
            stop.set()
        deadline = time.monotonic() + timeout
        for t, _ in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        for channel in self._channels.values():
            channel.close()
        with self._lock:
            return list(self.outcomes)


@dataclass
class Checked:
    generations: int
    errors: list[str]  # what clients saw
    mismatches: list[str]  # outputs that differ from their reference

    @property
    def ok(self) -> bool:
        return not self.errors and not self.mismatches


def check(outcomes: Sequence[Outcome], refs: Sequence[list[int]]) -> Checked:
    errors = [f"prompt {o.prompt} via {o.via}: {o.error}" for o in outcomes if o.error]
    mismatches = [f"prompt {o.prompt} via {o.via} (replica {o.replica or '?'} on "
                  f"{o.node or '?'}, targets {o.targets})" for o in outcomes
                  if not o.error and o.token_ids != refs[o.prompt]]
    return Checked(len(outcomes), errors, mismatches)
