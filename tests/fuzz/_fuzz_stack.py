"""What the fuzz tests share (tests/fuzz/conftest.py builds the stack): the hypothesis
profiles, the stack and its recorded answers.

One stack for the whole folder: real draft and target servers (tiny models) on loopback
ports, the coordinator's GenerationService over them (coordinator.deploy.setup.build_service)
and its OpenAI frontend under uvicorn (tests/http_frontend.py). Each check ends with
`stack.assert_healthy()`: a normal request to every layer gives exactly the output it
gave before any fuzzing, and both services hold no session.

Hypothesis settings: the `specdec-fuzz` profile is derandomized (the same examples on
every run, as CI needs), has no example database, and bounds the examples per test
(`examples(n)`); `SPECDEC_FUZZ_PROFILE=specdec-fuzz-deep` runs many more, random ones.
Hypothesis keeps caches (its unicode tables) in its storage directory, by default
./.hypothesis in the repository; it goes under the system's temp folder instead.
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx
from hypothesis import HealthCheck, settings
from hypothesis.configuration import set_hypothesis_home_dir

from specdec import digest
from specdec.v1 import common_pb2, draft_pb2, draft_pb2_grpc, target_pb2, target_pb2_grpc

if not os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
    set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "specdec-hypothesis")

_COMMON = dict(database=None, deadline=None, print_blob=False,
               suppress_health_check=[HealthCheck.function_scoped_fixture,
                                      HealthCheck.too_slow, HealthCheck.data_too_large,
                                      HealthCheck.filter_too_much])
settings.register_profile("specdec-fuzz", derandomize=True, max_examples=40, **_COMMON)
settings.register_profile("specdec-fuzz-deep", derandomize=False, max_examples=1000,
                          **_COMMON)
PROFILE = os.environ.get("SPECDEC_FUZZ_PROFILE", "specdec-fuzz")
settings.load_profile(PROFILE)


def examples(n: int):
    """`n` examples per test in the CI profile (the deep profile keeps its own)."""
    if PROFILE == "specdec-fuzz":
        return settings(max_examples=n)
    return settings()


VOCAB = 768
PROMPT = [11, 22, 33, 44, 55, 66, 77]
GREEDY = common_pb2.SamplingParams()
SAMPLED = common_pb2.SamplingParams(temperature=0.8, top_k=50, top_p=0.95, seed=1234)
# What the model services may answer to bad input: never INTERNAL or UNKNOWN.
CLIENT_ERRORS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE,
                 grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.NOT_FOUND,
                 grpc.StatusCode.FAILED_PRECONDITION}
RPC_TIMEOUT_S = 30.0


def sid(tag: str = "fuzz") -> str:
    return f"{tag}-{uuid.uuid4().hex}"


@dataclass
class Reference:
    """The answers to the normal requests, recorded before any fuzzing."""

    propose_greedy: list[int] = field(default_factory=list)
    propose_sampled: draft_pb2.ProposeResponse | None = None
    verify: target_pb2.VerifyResponse | None = None
    generate_ids: list[int] = field(default_factory=list)
    generate_text: str = ""
    http_text: str = ""


class Stack:
    """The servers, stubs to them, the GenerationService and the HTTP frontend."""

    def __init__(self, draft_addr, draft_engine, target_addr, target_engine):
        self.draft_addr, self.draft_engine = draft_addr, draft_engine
        self.target_addr, self.target_engine = target_addr, target_engine
        self.draft_channel = grpc.insecure_channel(draft_addr)
        self.target_channel = grpc.insecure_channel(target_addr)
        self.draft = draft_pb2_grpc.DraftServiceStub(self.draft_channel)
        self.target = target_pb2_grpc.TargetServiceStub(self.target_channel)
        self.service = None
        self.http_url = None
        self.ref = Reference()

    # -- normal requests ----------------------------------------------------------------

    def propose(self, sampling=GREEDY, k=4) -> draft_pb2.ProposeResponse:
        s = sid("normal")
        try:
            return self.draft.Propose(draft_pb2.ProposeRequest(
                session_id=s, keep_len=0, keep_digest=digest.EMPTY, new_tokens=PROMPT,
                num_tokens=k, sampling=sampling), timeout=RPC_TIMEOUT_S)
        finally:
            self.draft.Release(common_pb2.ReleaseRequest(session_id=s), timeout=RPC_TIMEOUT_S)

    def verify(self) -> target_pb2.VerifyResponse:
        s = sid("normal")
        try:
            return self.target.Verify(target_pb2.VerifyRequest(
                session_id=s, keep_len=0, keep_digest=digest.EMPTY,
                new_tokens=PROMPT + self.ref.propose_greedy, num_draft=4, sampling=GREEDY,
                round_seed=9), timeout=RPC_TIMEOUT_S)
        finally:
            self.target.Release(common_pb2.ReleaseRequest(session_id=s), timeout=RPC_TIMEOUT_S)

    def generate(self):
        from specdec.v1 import generate_pb2

        return self.service.generate(generate_pb2.GenerateRequest(
            prompt_token_ids=PROMPT, max_new_tokens=12, num_draft_tokens=4,
            sampling=GREEDY))

    def http_completion(self, client: httpx.Client | None = None) -> httpx.Response:
        body = {"model": self.service.card.id, "prompt": PROMPT, "max_tokens": 12,
                "temperature": 0, "num_draft_tokens": 4}
        if client is not None:
            return client.post("/v1/completions", json=body)
        with httpx.Client(base_url=self.http_url, timeout=60) as http:
            return http.post("/v1/completions", json=body)

    def record(self) -> None:
        self.ref.propose_greedy = list(self.propose().tokens)
        assert len(self.ref.propose_greedy) == 4
        self.ref.propose_sampled = self.propose(SAMPLED)
        self.ref.verify = self.verify()
        resp = self.generate()
        self.ref.generate_ids, self.ref.generate_text = list(resp.token_ids), resp.text
        assert len(self.ref.generate_ids) == 12
        r = self.http_completion()
        assert r.status_code == 200, r.text
        self.ref.http_text = r.json()["choices"][0]["text"]
        assert self.ref.http_text == self.ref.generate_text
        self.assert_no_sessions()

    # -- checks -------------------------------------------------------------------------

    def sessions(self) -> tuple[int, int]:
        return len(self.draft_engine.model.store), len(self.target_engine.model.store)

    def assert_no_sessions(self, within_s: float = 5.0) -> None:
        """Both services hold no session (a closed generation frees its own within ~0.1 s;
        a pre-draft in flight may hold the draft's a moment longer)."""
        deadline = time.monotonic() + within_s
        while self.sessions() != (0, 0) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert self.sessions() == (0, 0), f"sessions held (draft, target): {self.sessions()}"

    def assert_healthy(self, layers=("draft", "target", "service", "http")) -> None:
        """Every layer still gives exactly its recorded answer, and no session is left."""
        ref = self.ref
        if "draft" in layers:
            assert list(self.propose().tokens) == ref.propose_greedy
            sampled = self.propose(SAMPLED)
            sampled.step_seconds = ref.propose_sampled.step_seconds  # a timing
            assert sampled == ref.propose_sampled
        if "target" in layers:
            got = self.verify()
            got.pass_sessions = ref.verify.pass_sessions
            got.pass_tokens = ref.verify.pass_tokens
            got.pass_seconds = ref.verify.pass_seconds
            assert got == ref.verify
        if "service" in layers and self.service is not None:
            resp = self.generate()
            assert (list(resp.token_ids), resp.text) == (ref.generate_ids, ref.generate_text)
        if "http" in layers and self.http_url is not None:
            r = self.http_completion()
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["text"] == ref.http_text
        self.assert_no_sessions()

    def release_all(self) -> None:
        """Release whatever sessions a batch of fuzzed requests left (by the stores' own
        ids: a fuzzed request may have started a session under any id)."""
        for engine, stub in ((self.draft_engine, self.draft),
                             (self.target_engine, self.target)):
            store = engine.model.store
            with store._lock:
                ids = list(store._idle) + list(store._busy)
            for s in ids:
                stub.Release(common_pb2.ReleaseRequest(session_id=s), timeout=RPC_TIMEOUT_S)


