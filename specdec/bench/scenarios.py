"""Benchmark scenarios: one `run(messages)` each, timed the same way.

* system K=k: the real draft/target services (processes, optionally pinned) and the
  coordinator's GenerationService in this process (Ray Serve's proxy is left out; its
  cost per request is measured separately in the README).
* in-process target: the same target backend called directly, no gRPC, no draft.
* OpenVINO GenAI: LLMPipeline plain, with draft_model (speculative), and prompt lookup,
  on the same IRs and threads.
* HF transformers: plain torch decoding and assisted generation with the torch pair.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from specdec.sampling import SamplingParams


@dataclass
class Sample:
    scenario: str
    prompt: str
    tokens: int
    seconds: float
    ttft: float | None = None
    token_ids: list[int] = field(default_factory=list)
    kinds: list[int] = field(default_factory=list)  # system scenarios only
    rounds: int = 0
    propose_s: list[float] = field(default_factory=list)
    verify_s: list[float] = field(default_factory=list)
    wire_bytes: int = 0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def chat_text(tokenizer, message: str) -> str:
    return tokenizer.apply_chat_template([{"role": "user", "content": message}],
                                         tokenize=False, add_generation_prompt=True)


class SystemScenario:
    """Through the real services; `k` = 0 is target-only on the same target."""

    def __init__(self, service, k: int, label: str = ""):
        self.service, self.k = service, k
        self.name = "target-only (system, K=0)" if k == 0 else f"specdec K={k}{label}"

    def _calls(self):
        loop = self.service.loop
        routers = [r for r in (loop.draft, loop.target) if r is not None]
        return [c for r in routers for c in (rep.client for rep in r.replicas())]

    def run(self, message: str, max_new_tokens: int, sampling: SamplingParams) -> Sample:
        from specdec import wire
        from specdec.v1 import generate_pb2

        req = generate_pb2.GenerateRequest(max_new_tokens=max_new_tokens,
                                           num_draft_tokens=self.k,
                                           sampling=wire.sampling_to_proto(sampling))
        req.messages.add(role="user", content=message)
        clients = self._calls()
        marks = [(len(c.bytes.recent), c.bytes.sent + c.bytes.received) for c in clients]
        t0 = time.perf_counter()
        ttft = None
        ids, kinds, rounds = [], [], 0
        for chunk in self.service.stream(req):
            if ttft is None and chunk.token_ids:
                ttft = time.perf_counter() - t0
            ids += chunk.token_ids
            kinds += chunk.kinds
            if chunk.finish_reason:
                rounds = chunk.stats.rounds
        seconds = time.perf_counter() - t0
        sample = Sample(self.name, message, len(ids), seconds, ttft, ids, kinds, rounds)
        for client, (n, nbytes) in zip(clients, marks, strict=True):
            calls = [c.seconds for c in list(client.bytes.recent)[n:]]
            is_draft = type(client).__name__ == "DraftClient"
            (sample.propose_s if is_draft else sample.verify_s).extend(calls)
            sample.wire_bytes += client.bytes.sent + client.bytes.received - nbytes
        return sample

    def close(self) -> None:
        pass


class InProcessTarget:
    """The target backend called directly: what the engine costs without the system."""

    name = "in-process target (no gRPC)"

    def __init__(self, backend, tokenizer, eos_ids):
        self.backend, self.tokenizer, self.eos = backend, tokenizer, set(eos_ids)

    def run(self, message: str, max_new_tokens: int, sampling: SamplingParams) -> Sample:
        from specdec.sampling import generator, process_logits, sample

        ids = self.tokenizer.encode(chat_text(self.tokenizer, message), add_special_tokens=False)
        gen = generator(sampling.seed, "inprocess")
        t0 = time.perf_counter()
        cache = self.backend.new_cache()
        logits = self.backend.forward(cache, ids)[0]
        out: list[int] = []
        ttft = None
        while len(out) < max_new_tokens:
            probs = process_logits(logits, sampling)
            token = int(probs.argmax()) if sampling.greedy else sample(probs, gen)
            out.append(token)
            ttft = ttft or time.perf_counter() - t0
            if token in self.eos:
                break
            logits = self.backend.forward(cache, [token])[0]
        return Sample(self.name, message, len(out), time.perf_counter() - t0, ttft, out)

    def close(self) -> None:
        pass


class GenAIScenario:
    """OpenVINO GenAI's in-process LLMPipeline: plain, speculative, or prompt lookup."""

    def __init__(self, target_ir, draft_ir, mode: str, k: int, threads: int, tokenizer,
                 precision: str = "auto"):
        import openvino_genai as og

        from specdec.runtime.openvino_backend import cap_cpu_isa_below_amx

        cap_cpu_isa_below_amx()  # GenAI's compiles share the process's oneDNN
        draft_cfg = {"INFERENCE_NUM_THREADS": threads} if threads else {}
        cfg = dict(draft_cfg)  # the target computes in what specdec's target does
        if precision != "auto":
            cfg["INFERENCE_PRECISION_HINT"] = precision
        self.tokenizer, self.mode, self.k = tokenizer, mode, k
        if mode == "speculative":
            draft = og.draft_model(str(draft_ir), "CPU", **draft_cfg)
            self.pipe = og.LLMPipeline(str(target_ir), "CPU", draft_model=draft, **cfg)
            self.name = f"OpenVINO GenAI speculative K={k}"
        elif mode == "lookup":
            self.pipe = og.LLMPipeline(str(target_ir), "CPU", prompt_lookup=True, **cfg)
            self.name = f"OpenVINO GenAI prompt lookup K={k}"
        else:
            self.pipe = og.LLMPipeline(str(target_ir), "CPU", **cfg)
            self.name = "OpenVINO GenAI plain"

    def run(self, message: str, max_new_tokens: int, sampling: SamplingParams) -> Sample:
        import openvino_genai as og

        gc = og.GenerationConfig()
        gc.max_new_tokens = max_new_tokens
        if self.mode in ("speculative", "lookup"):
            gc.num_assistant_tokens = self.k
        if self.mode == "lookup":
            gc.max_ngram_size = 3
        if not sampling.greedy:
            gc.do_sample, gc.temperature, gc.rng_seed = True, sampling.temperature, sampling.seed
        text = chat_text(self.tokenizer, message)
        t0 = time.perf_counter()
        result = self.pipe.generate([text], gc)
        seconds = time.perf_counter() - t0
        n = result.perf_metrics.get_num_generated_tokens()
        ttft = result.perf_metrics.get_ttft().mean / 1000.0
        return Sample(self.name, message, n, seconds, ttft)

    def close(self) -> None:
        self.pipe = None


class HFScenario:
    """transformers' generate(): plain torch, or assisted generation with a torch draft."""

    def __init__(self, target, draft, k: int, tokenizer):
        self.target, self.draft, self.k, self.tokenizer = target, draft, k, tokenizer
        self.name = (f"HF assisted generation K={k} (torch)" if draft is not None
                     else "HF plain (torch)")

    def run(self, message: str, max_new_tokens: int, sampling: SamplingParams) -> Sample:
        import torch

        ids = self.tokenizer(chat_text(self.tokenizer, message), return_tensors="pt",
                             add_special_tokens=False)
        kwargs = dict(max_new_tokens=max_new_tokens, do_sample=not sampling.greedy,
                      pad_token_id=self.tokenizer.eos_token_id)
        if not sampling.greedy:
            kwargs["temperature"] = sampling.temperature
            torch.manual_seed(sampling.seed)
        if self.draft is not None:
            kwargs["assistant_model"] = self.draft
            self.draft.generation_config.num_assistant_tokens = self.k
            self.draft.generation_config.num_assistant_tokens_schedule = "constant"
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = self.target.generate(**ids, **kwargs)
        seconds = time.perf_counter() - t0
        new = out[0, ids["input_ids"].shape[1]:].tolist()
        return Sample(self.name, message, len(new), seconds, None, new)

    def close(self) -> None:
        pass
