"""The one side-by-side harness: speculative vs target-only, interleaved, and the one
definition of speedup.

A scenario is any object with a `name` and `run(prompt, max_new_tokens, sampling) ->
Sample` (the prompt is a chat message or a list of token ids, whatever the scenario
takes). `run_side_by_side` runs a list of scenarios interleaved over prompts x repeats x
temperatures, each prompt by every scenario back to back, and returns the samples;
`speedup` reduces them with `SPEEDUP_DEFINITION`. `specdec demo`, `specdec bench-pairs`,
`specdec rpc-bench` and `specdec bench` all go through these two functions.
"""

from __future__ import annotations

import os
import platform
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from tqdm import tqdm

from specdec.sampling import SamplingParams


def machine() -> str:
    """The machine a bench ran on, for its results: the CPU model too, since machines
    of one name differ (the same bench gave 1.53x on one 2-core host and 1.29x on
    another)."""
    return (f"{platform.machine()}, {len(os.sched_getaffinity(0))} CPUs ({cpu_model()}), "
            f"{platform.processor() or platform.system()}, Python {platform.python_version()}")


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo ("unknown CPU" where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def comma_list(text: str) -> list[str]:
    """A flag's comma-separated values, blanks dropped."""
    return [x.strip() for x in text.split(",") if x.strip()]


SPEEDUP_DEFINITION = (
    "speedup = the median, over (prompt, repeat) pairs, of speculative tok/s divided by "
    "target-only tok/s of the same prompt and repeat, the two run back to back")


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
    repeat: int = 0  # set by run_side_by_side
    temperature: float = 0.0  # set by run_side_by_side
    text: str = ""
    drafted: int = 0  # drafted tokens (system scenarios)
    accepted: int = 0  # accepted drafts
    rejections: int = 0  # rounds that ended in a recovered token

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def _key(s: Sample) -> tuple:
    return (s.prompt, s.repeat, s.temperature)


def ratios(samples: Iterable[Sample], scenario: str, baseline: str) -> list[float]:
    """Per (prompt, repeat): `scenario`'s tok/s over `baseline`'s of the same prompt and
    repeat (and temperature); pairs missing either side are left out."""
    base: dict[tuple, list[Sample]] = defaultdict(list)
    spec: dict[tuple, list[Sample]] = defaultdict(list)
    for s in samples:
        if s.scenario == baseline:
            base[_key(s)].append(s)
        if s.scenario == scenario:
            spec[_key(s)].append(s)
    out = []
    for key, group in spec.items():
        for s, b in zip(group, base.get(key, []), strict=False):
            if b.tokens_per_s:
                out.append(s.tokens_per_s / b.tokens_per_s)
    return out


def speedup(samples: Iterable[Sample], scenario: str, baseline: str) -> float | None:
    """SPEEDUP_DEFINITION: the median of `ratios`; None without a single pair."""
    r = ratios(list(samples), scenario, baseline)
    return statistics.median(r) if r else None


def median_tps(samples: Iterable[Sample], scenario: str) -> float | None:
    tps = [s.tokens_per_s for s in samples if s.scenario == scenario]
    return statistics.median(tps) if tps else None


def run_side_by_side(scenarios: Sequence, prompts: Sequence, max_new_tokens: int,
                     repeats: int = 1, temperatures: Sequence[float] = (0.0,), *,
                     include: Callable[[object, float], bool] | None = None,
                     failed: dict[str, str] | None = None, warmup: bool = False,
                     desc: str = "side by side", say: Callable[[str], None] = print,
                     seed: Callable[[int, int], int] = lambda repeat, prompt_index: repeat,
                     ) -> list[Sample]:
    """Every prompt (x repeat x temperature) through every scenario in turn, with a
    progress bar; returns the samples, tagged with repeat and temperature. The sampling
    seed is `seed(repeat, prompt_index)` (default: the repeat).

    `include(scenario, temperature)` can leave a scenario out at a temperature. A
    scenario with a true `may_fail` attribute (a peer) that raises is recorded in
    `failed` ("name @ temperature T" -> error) and skipped from then on; any other error
    propagates. `warmup` first runs every scenario once on the first prompt, discarded.
    """
    failed = {} if failed is None else failed
    if warmup and prompts:
        for scenario in scenarios:
            scenario.run(prompts[0], max_new_tokens, SamplingParams())
    samples: list[Sample] = []
    jobs = [(rep, t, i) for rep in range(repeats) for t in temperatures
            for i in range(len(prompts))]
    for rep, temperature, i in tqdm(jobs, desc=desc, unit="prompt"):
        prompt = prompts[i]
        sampling = SamplingParams(temperature=temperature, seed=seed(rep, i))
        for scenario in scenarios:
            key = f"{scenario.name} @ temperature {temperature}"
            if key in failed or (include is not None and not include(scenario, temperature)):
                continue
            try:
                sample = scenario.run(prompt, max_new_tokens, sampling)
            except Exception as exc:  # noqa: BLE001 - a peer's failure is a finding
                if not getattr(scenario, "may_fail", False):
                    raise
                failed[key] = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
                say(f"note: {key} failed and is skipped from now on: {failed[key]}")
                continue
            sample.repeat, sample.temperature = rep, temperature
            samples.append(sample)
    return samples
