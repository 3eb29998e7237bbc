"""OpenVINO GenAI's continuous-batching pipeline under the load of `specdec load` (and
llama.cpp's server, specdec_tools.bench.llamacpp_load, started the same way).

The peer is `openvino_genai.ContinuousBatchingPipeline` on the same IRs as specdec's
services (fp32 target computing in f32 with an f32 KV cache; with the int8 draft as
`draft_model` for the speculative kind), run in a pinned child process placed by a
set-up of specdec_tools.bench.peers (peer kinds `genai-cb-plain` and `genai-cb-speculative`;
specdec_tools.bench.peer_child builds them with `build` here).

The child drives the load itself, one thread: N closed-loop streams as in
specdec_tools.bench.load, each request added with `add_request` and the pipeline advanced
with `step()`; after every step each request's GenerationHandle is read, so a token's
timestamp is the end of the step that produced it (one chunk per step, several tokens
per chunk when the draft's tokens were accepted), the same clock the gRPC client keeps
for the coordinator's chunks.
"""

from __future__ import annotations

import itertools
import time

from specdec_tools.bench.load_report import Load, LoadSample, Window
from specdec_tools.bench.peers import SETUPS, PeerProcess

CACHE_GB = 1  # SchedulerConfig.cache_size: 32 streams x ~200 tokens need ~0.3 GB in f32

CONFIG = (f"ContinuousBatchingPipeline on the fp32 IR, INFERENCE_PRECISION_HINT f32, "
          f"KV_CACHE_PRECISION f32, SchedulerConfig.cache_size {CACHE_GB} GB (otherwise "
          "GenAI's defaults); speculative: the int8 IR as draft_model, num_assistant_tokens K")

GENAI_KINDS = {
    "genai-cb-plain": "OpenVINO GenAI continuous batching plain",
    "genai-cb-speculative": "OpenVINO GenAI continuous batching speculative",
}
LLAMACPP_KINDS = {  # specdec_tools.bench.llamacpp_load
    "llamacpp-cb-plain": "llama.cpp server plain",
    "llamacpp-cb-speculative": "llama.cpp server speculative (-md)",
}
KINDS = {**GENAI_KINDS, **LLAMACPP_KINDS}
FAMILIES = {"genai": GENAI_KINDS, "llamacpp": LLAMACPP_KINDS}  # --peers names


class GenAILoad:
    """The child's side: the pipeline, and `run(load)` -> Window."""

    def __init__(self, target_ir, draft_ir, speculative: bool, k: int, threads: int,
                 tokenizer, precision: str = "f32"):
        import openvino_genai as og

        from specdec.runtime.openvino_backend import cap_cpu_isa_below_amx

        cap_cpu_isa_below_amx()  # before any compile: GenAI's share the process's oneDNN
        threads_cfg = {"INFERENCE_NUM_THREADS": threads} if threads else {}
        props = {**threads_cfg, "KV_CACHE_PRECISION": "f32"}  # as specdec's target keeps
        if precision not in ("auto", "default"):
            props["INFERENCE_PRECISION_HINT"] = precision
        self.k = k if speculative else 0
        if speculative:
            props["draft_model"] = og.draft_model(str(draft_ir), "CPU", **threads_cfg)
        scheduler = og.SchedulerConfig()
        scheduler.cache_size = CACHE_GB
        self.pipe = og.ContinuousBatchingPipeline(str(target_ir), scheduler, "CPU", props)
        self.tokenizer, self.og = tokenizer, og
        self.name = KINDS["genai-cb-speculative" if speculative else "genai-cb-plain"]
        if speculative:
            self.name += f" K={k}"
        self._ids = itertools.count()

    def _config(self, load: Load, stream: int, i: int):
        gc = self.pipe.get_config()  # the model's own (its EOS), then ours
        gc.max_new_tokens = load.max_new_tokens
        if self.k:
            gc.num_assistant_tokens = self.k
        sampling = load.sampling(stream, i)
        if not sampling.greedy:
            gc.do_sample, gc.temperature, gc.rng_seed = True, sampling.temperature, sampling.seed
        return gc

    def run(self, load: Load) -> Window:
        from specdec_tools.bench.scenarios import chat_text

        running = self.og.GenerationStatus.RUNNING
        active: dict[int, tuple] = {}  # stream -> (handle, sample, sent)
        sent_count = [0] * load.concurrency
        done: list[LoadSample] = []
        t0 = time.perf_counter()

        def submit(stream: int) -> None:
            now = time.perf_counter()
            i = sent_count[stream]
            if not load.more(i, now - t0):
                return
            sent_count[stream] += 1
            message = load.message(stream, i)
            handle = self.pipe.add_request(next(self._ids), chat_text(self.tokenizer, message),
                                           self._config(load, stream, i))
            sample = LoadSample(self.name, message, 0, 0.0, concurrency=load.concurrency,
                                stream=stream, index=i, started=now - t0,
                                temperature=load.temperature)
            active[stream] = (handle, sample, now)

        for stream in range(load.concurrency):
            submit(stream)
        while active:
            self.pipe.step()
            now = time.perf_counter()
            for stream, (handle, s, sent) in list(active.items()):
                if handle.can_read():
                    for out in handle.read().values():
                        ids = list(out.generated_ids)
                        if ids:
                            s.chunk_times.append(now - sent)
                            s.chunk_tokens.append(len(ids))
                            s.token_ids += ids
                status = handle.get_status()
                if status != running:
                    s.seconds, s.tokens = now - sent, len(s.token_ids)
                    s.ttft = s.chunk_times[0] if s.chunk_times else None
                    if status != self.og.GenerationStatus.FINISHED:
                        s.error = status.name
                    done.append(s)
                    del active[stream]
                    submit(stream)
        seconds = max((s.started + s.seconds for s in done), default=0.0)
        return Window(self.name, None, load.concurrency, seconds, done)

    def close(self) -> None:
        self.pipe = None


def build(kind: str, target_ir: str, draft_ir: str, hf: str, k: int, threads: int,
          precision: str, target_gguf: str | None = None, draft_gguf: str | None = None):
    """In the child (specdec_tools.bench.peer_child), as specdec_tools.bench.scenarios.build;
    llama.cpp's kinds need the pair's GGUF files."""
    from specdec.runtime.models import load_tokenizer

    if kind not in KINDS:
        raise ValueError(f"unknown load peer kind {kind!r}; choose among {', '.join(KINDS)}")
    speculative = kind.endswith("-speculative")
    if kind in LLAMACPP_KINDS:
        from specdec_tools.bench.llamacpp_load import LlamaCppLoad

        return LlamaCppLoad(target_gguf, draft_gguf if speculative else None, k, threads,
                            load_tokenizer(str(hf)))
    return GenAILoad(target_ir, draft_ir, speculative, k, threads, load_tokenizer(str(hf)),
                     precision)


class LoadPeer(PeerProcess):
    """The parent's side: a GenAILoad in a pinned child; `window(load)` like
    specdec_tools.bench.load.GrpcVariant's."""

    def __init__(self, kind: str, setup, target_cpu: int | None, options: dict,
                 baseline: str | None = None):
        super().__init__(kind, setup, target_cpu, options)
        self.baseline = baseline

    def window(self, load: Load, phase: str = "measure") -> Window:
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.kind}'s process is gone (exit {self.proc.returncode})")
        self.timeout = load.window_timeout()
        self.conn.send((load,))
        status, w = self._recv()
        if status != "ok":
            raise RuntimeError(w)
        w.scenario, w.baseline, w.phase = self.name, self.baseline, phase
        for s in w.samples:
            s.scenario = self.name
        return w


def start(setup_key: str, target_cpu: int | None, options: dict, say=print,
          families: tuple[str, ...] = ("genai",)) -> list[LoadPeer]:
    """Each family's two kinds in one set-up (a speculative kind's baseline is its own
    family's plain one); a peer that cannot start is noted and left out."""
    setup, started = SETUPS[setup_key], []
    for family in families:
        baseline = None
        for kind in FAMILIES[family]:
            try:
                peer = LoadPeer(kind, setup, target_cpu, options, baseline)
            except (RuntimeError, TimeoutError, ImportError) as exc:
                say(f"note: peer {kind} ({setup.label}) skipped: {exc}")
                continue
            baseline = baseline or peer.name
            started.append(peer)
    return started
