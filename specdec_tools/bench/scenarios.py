"""In-process peers as harness scenarios, each `run(message, max_new_tokens, sampling)`
timed the same way (specdec's own scenarios are in specdec_tools.bench.system):

* in-process target: the same target backend called directly, no gRPC, no draft.
* OpenVINO GenAI: LLMPipeline plain, with draft_model (speculative), and prompt lookup,
  on the same IRs.
* HF transformers: plain torch decoding and assisted generation with the torch pair.
* llama.cpp's server: plain, and with the draft on -md (specdec_tools.bench.llamacpp_peer).

`build(kind, ...)` makes one by name; specdec_tools.bench.peers runs each in a child process
placed as its set-up says.
"""

from __future__ import annotations

import time

from specdec.sampling import SamplingParams
from specdec_tools.bench.harness import Sample
from specdec_tools.bench.prompts import chat_text

__all__ = ["KINDS", "Sample", "build", "chat_text"]


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
        if precision not in ("auto", "default"):  # "default": GenAI's out-of-the-box
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
        if precision == "default":
            self.name += ", out-of-the-box precision (no INFERENCE_PRECISION_HINT)"

    def run(self, message: str, max_new_tokens: int, sampling: SamplingParams) -> Sample:
        """One generation from the very token ids specdec's services get (the chat
        template applied once, by us). Given a string, LLMPipeline.generate applies the
        model's chat template itself by default (GenerationConfig.apply_chat_template):
        a second time over ours, which made it continue another prompt than specdec did
        (on the shipped translation prompt, 96 tokens of a repeated phrase against
        specdec's 21)."""
        import numpy as np
        import openvino as ov
        import openvino_genai as og

        gc = og.GenerationConfig()
        gc.max_new_tokens = max_new_tokens
        gc.apply_chat_template = False
        gc.eos_token_id = self.tokenizer.eos_token_id
        if self.mode in ("speculative", "lookup"):
            gc.num_assistant_tokens = self.k
        if self.mode == "lookup":
            gc.max_ngram_size = 3
        if not sampling.greedy:
            gc.do_sample, gc.temperature, gc.rng_seed = True, sampling.temperature, sampling.seed
        ids = self.tokenizer(chat_text(self.tokenizer, message), add_special_tokens=False,
                             return_tensors="np")["input_ids"].astype(np.int64)
        t0 = time.perf_counter()
        result = self.pipe.generate(ov.Tensor(ids), gc)
        seconds = time.perf_counter() - t0
        out = [int(t) for t in result.tokens[0]]
        n = result.perf_metrics.get_num_generated_tokens()
        ttft = result.perf_metrics.get_ttft().mean / 1000.0
        return Sample(self.name, message, n, seconds, ttft, token_ids=out)

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


# kind -> what `build` makes; sampled = run at temperatures > 0 too (the bench's choice)
KINDS = {
    "inprocess": "the target backend alone",
    "genai-plain": "OpenVINO GenAI plain",
    "genai-speculative": "OpenVINO GenAI speculative",
    "genai-lookup": "OpenVINO GenAI prompt lookup",
    "genai-plain-oob": "OpenVINO GenAI plain in its out-of-the-box precision",
    "hf-plain": "HF transformers plain",
    "hf-assisted": "HF transformers assisted generation",
    "llamacpp-plain": "llama.cpp's server on the target's GGUF",
    "llamacpp-speculative": "llama.cpp's server, the draft's GGUF on -md",
}
SAMPLED = {"genai-plain", "genai-speculative", "genai-plain-oob"}


def build(kind: str, target_ir: str, draft_ir: str, hf: str, k: int, threads: int,
          precision: str, draft_hf: str | None = None, target_gguf: str | None = None,
          draft_gguf: str | None = None):
    """One peer by kind; `threads` 0 = the runtime's default, `precision` what the target
    computes in (OpenVINO peers; torch computes in float32); `draft_hf`: HF assisted
    generation's draft folder (None: the target's own, int8-quantized); `target_gguf`,
    `draft_gguf`: llama.cpp's files (a pair prepared from GGUFs)."""
    from specdec.runtime.models import load_tokenizer

    tokenizer = load_tokenizer(str(hf))
    if kind == "inprocess":
        from specdec.runtime.openvino_backend import OpenVINOBackend

        backend = OpenVINOBackend(target_ir, "CPU", threads=threads,
                                  inference_precision=precision)
        return InProcessTarget(backend, tokenizer, [tokenizer.eos_token_id])
    if kind.startswith("genai-"):
        mode = kind.split("-")[1]
        return GenAIScenario(target_ir, draft_ir, mode, k, threads, tokenizer,
                             "default" if kind.endswith("-oob") else precision)
    if kind.startswith("llamacpp-"):
        from specdec_tools.bench.llamacpp_peer import LlamaCppScenario

        return LlamaCppScenario(target_gguf, draft_gguf if kind.endswith("speculative")
                                else None, k, threads, tokenizer)
    if kind.startswith("hf-"):
        import torch

        from specdec.runtime.models import load, quantize_int8

        if threads:
            torch.set_num_threads(threads)
        target, draft = load(str(hf)).model, None
        if kind == "hf-assisted" and draft_hf:
            draft = load(str(draft_hf)).model
        elif kind == "hf-assisted":
            loaded = load(str(hf))
            quantize_int8(loaded)
            draft = loaded.model
        return HFScenario(target, draft, k, tokenizer)
    raise ValueError(f"unknown peer kind {kind!r}; choose among {', '.join(KINDS)}")
