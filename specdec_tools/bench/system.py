"""specdec itself as harness scenarios: through the coordinator's GenerationService (chat
messages), its SpeculativeLoop (token-id prompts), or a running coordinator's gRPC stub.
K=0 is target-only decoding on the same target service."""

from __future__ import annotations

import time

from specdec.sampling import SamplingParams
from specdec_tools.bench.harness import Sample

BASELINE = "target-only (system, K=0)"


def _clients(service) -> list:
    loop = service.loop
    routers = [r for r in (loop.draft, loop.target) if r is not None]
    return [c for r in routers for c in (rep.client for rep in r.replicas())]


class _WireLog:
    """Per-call latencies and wire bytes of a service's clients during one generation."""

    def __init__(self, service):
        self.clients = _clients(service)
        self.marks = [(len(c.bytes.recent), c.bytes.sent + c.bytes.received)
                      for c in self.clients]

    def into(self, sample: Sample) -> Sample:
        for client, (n, nbytes) in zip(self.clients, self.marks, strict=True):
            calls = [c.seconds for c in list(client.bytes.recent)[n:]]
            is_draft = type(client).__name__ == "DraftClient"
            (sample.propose_s if is_draft else sample.verify_s).extend(calls)
            sample.wire_bytes += client.bytes.sent + client.bytes.received - nbytes
        return sample


def _request(message: str, max_new_tokens: int, k: int, sampling: SamplingParams):
    from specdec import wire
    from specdec.v1 import generate_pb2

    req = generate_pb2.GenerateRequest(max_new_tokens=max_new_tokens, num_draft_tokens=k,
                                       sampling=wire.sampling_to_proto(sampling))
    req.messages.add(role="user", content=message)
    return req


def _name(k: int, label: str) -> str:
    return BASELINE if k == 0 else f"specdec K={k}{label}"


class SystemScenario:
    """A chat message through the real services and the GenerationService in this
    process (Ray Serve's proxy is left out: it adds the same cost to every scenario).
    A subclass may build another request (`request`); `last_stats` is the
    GenerationStats of the latest run."""

    def __init__(self, service, k: int, label: str = ""):
        self.service, self.k, self.name = service, k, _name(k, label)
        self.last_stats = None

    def request(self, message: str, max_new_tokens: int, sampling: SamplingParams):
        return _request(message, max_new_tokens, self.k, sampling)

    def run(self, message: str, max_new_tokens: int, sampling: SamplingParams) -> Sample:
        req = self.request(message, max_new_tokens, sampling)
        log = _WireLog(self.service)
        t0 = time.perf_counter()
        ttft = None
        ids, kinds, text, stats = [], [], [], None
        for chunk in self.service.stream(req):
            if ttft is None and chunk.token_ids:
                ttft = time.perf_counter() - t0
            ids += chunk.token_ids
            kinds += chunk.kinds
            text.append(chunk.text)
            if chunk.finish_reason:
                stats = chunk.stats
        seconds = time.perf_counter() - t0
        self.last_stats = stats
        sample = Sample(self.name, message, len(ids), seconds, ttft, ids, kinds,
                        stats.rounds if stats else 0, text="".join(text))
        if stats is not None:
            sample.drafted, sample.accepted = stats.drafted_tokens, stats.accepted_tokens
        return log.into(sample)

    def close(self) -> None:
        pass


class LoopScenario:
    """Token-id prompts through the service's SpeculativeLoop (no tokenizer, no EOS)."""

    def __init__(self, service, k: int, label: str = ""):
        self.service, self.k, self.name = service, k, _name(k, label)

    def run(self, prompt: list[int], max_new_tokens: int, sampling: SamplingParams) -> Sample:
        log = _WireLog(self.service)
        r = self.service.loop.generate(prompt, max_new_tokens, sampling, self.k)
        st = r.stats
        sample = Sample(self.name, str(list(prompt)), len(r.token_ids), st.seconds, None,
                        list(r.token_ids), [int(k) for k in r.kinds], st.rounds,
                        drafted=st.drafted_tokens, accepted=st.accepted_tokens,
                        rejections=st.rejections)
        return log.into(sample)


class GrpcScenario:
    """A chat message through a running coordinator's Generator stub (Ray Serve's proxy
    included)."""

    def __init__(self, stub, k: int, label: str = "", timeout: float = 600.0):
        self.stub, self.k, self.timeout, self.name = stub, k, timeout, _name(k, label)

    def run(self, message: str, max_new_tokens: int, sampling: SamplingParams) -> Sample:
        req = _request(message, max_new_tokens, self.k, sampling)
        t0 = time.perf_counter()
        resp = self.stub.Generate(req, timeout=self.timeout)
        st = resp.stats
        return Sample(self.name, message, len(resp.token_ids), time.perf_counter() - t0,
                      None, list(resp.token_ids), list(resp.kinds), st.rounds,
                      text=resp.text, drafted=st.drafted_tokens, accepted=st.accepted_tokens)
