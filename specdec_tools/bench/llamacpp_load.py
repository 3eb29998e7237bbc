"""llama.cpp's server under the load of `specdec load` and `specdec bench --interactive`'s
sweep (peer kinds `llamacpp-cb-plain` and `llamacpp-cb-speculative`, built in a pinned
child by specdec_tools.bench.load_peers.build as GenAI's are).

One llama-server with a slot per stream (`-np` = the sweep's largest N, continuous
batching across slots as llama.cpp does by default), the pair's own GGUF files, the
draft on -md for the speculative kind. The child drives N closed-loop streams as
threads (specdec_tools.bench.load_http.run_streams), each POSTing the chat template's
token ids to /completion with stream=true; a chunk is one server-sent event carrying
token ids, timed when the client has read it, the clock the gRPC client keeps for the
coordinator's chunks.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

from specdec_tools.bench.llamacpp_peer import LlamaCppServer, completion_body
from specdec_tools.bench.load_report import Load, LoadSample, Window

KINDS = {
    "llamacpp-cb-plain": "llama.cpp server plain",
    "llamacpp-cb-speculative": "llama.cpp server speculative (-md)",
}
SLOTS = 32  # the sweep's largest N by default
CONTEXT_PER_SLOT = 1024  # a prompt of the mix and 64-256 new tokens fit


class LlamaCppLoad:
    """The child's side: one server, and `run(load)` -> Window."""

    def __init__(self, target_gguf: str, draft_gguf: str | None, k: int, threads: int,
                 tokenizer, slots: int = SLOTS):
        self.server = LlamaCppServer(target_gguf, draft_gguf, k, threads, slots=slots,
                                     context_per_slot=CONTEXT_PER_SLOT)
        self.tokenizer, self.slots = tokenizer, slots
        self.name = KINDS["llamacpp-cb-speculative" if draft_gguf else "llamacpp-cb-plain"]
        if draft_gguf:
            self.name += f" K={k}"

    def run(self, load: Load) -> Window:
        from specdec_tools.bench.load_http import run_streams

        if load.concurrency > self.slots:
            raise ValueError(f"{load.concurrency} streams, but the server has {self.slots} "
                             "slots")
        seconds, samples = run_streams(load, self._stream)
        return Window(self.name, None, load.concurrency, seconds, samples)

    def _stream(self, load: Load, stream: int, start) -> list[LoadSample]:
        t0 = start()
        out: list[LoadSample] = []
        while load.more(len(out), time.perf_counter() - t0):
            out.append(self._one(load, stream, len(out), t0))
        return out

    def _one(self, load: Load, stream: int, i: int, t0: float) -> LoadSample:
        message = load.message(stream, i)
        body = completion_body(self.tokenizer, message, load.max_new_tokens,
                               load.sampling(stream, i), stream=True)
        sent = time.perf_counter()
        s = LoadSample(self.name, message, 0, 0.0, concurrency=load.concurrency,
                       stream=stream, index=i, started=sent - t0,
                       temperature=load.temperature)
        try:
            with urllib.request.urlopen(self.server.request("/completion", body),
                                        timeout=load.timeout) as r:
                for raw in r:
                    line = raw.decode("utf-8").strip()
                    if not line.startswith("data: "):
                        continue
                    event = json.loads(line[len("data: "):])
                    ids = event.get("tokens") or []
                    if ids:
                        s.chunk_times.append(time.perf_counter() - sent)
                        s.chunk_tokens.append(len(ids))
                        s.token_ids += [int(t) for t in ids]
                    if event.get("stop"):
                        timings = event.get("timings", {})
                        s.drafted = int(timings.get("draft_n", 0))
                        s.accepted = int(timings.get("draft_n_accepted", 0))
                        break
        except urllib.error.HTTPError as exc:
            s.error = f"HTTP_{exc.code}"
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            s.error = type(exc).__name__
        s.seconds, s.tokens = time.perf_counter() - sent, len(s.token_ids)
        s.ttft = s.chunk_times[0] if s.chunk_times else None
        return s

    def close(self) -> None:
        self.server.close()
