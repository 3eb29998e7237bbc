"""`specdec eval`'s modes and runs (issue 14): the open-ended prompts through the real
services in every decoding mode, side by side.

A `Mode` is one way to decode: the target's distribution (target-only K=0, or
speculative K>0) or the contrastive distribution of target (expert) and draft (amateur),
in the plain form (K=0, one contrastive step per token) or the speculative form (K>0,
Yuan et al. 2023), greedy or sampled. `EvalScenario` is a `SystemScenario` that sends a
raw-text prompt with the mode's decoding fields; `run_modes` runs every mode on every
(prompt, seed) through `harness.run_side_by_side`, each prompt by every mode back to back.
Scoring is in `quality_score`, the files in `quality_report`, the command in `eval_cli`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from specdec.client.request import DECODINGS, build_request
from specdec.client.request import FORMULATIONS as FORMULATION_NAMES
from specdec.sampling import SamplingParams
from specdec_tools.bench import harness
from specdec_tools.bench.harness import Sample
from specdec_tools.bench.system import SystemScenario

SPECULATIVE, CONTRASTIVE = DECODINGS  # the modes' names, as the client takes them
FORMULATIONS = tuple(FORMULATION_NAMES)


@dataclass(frozen=True)
class Mode:
    key: str  # what --modes names it by
    decoding: str  # SPECULATIVE (the target's distribution) or CONTRASTIVE
    k: int  # draft tokens per round; 0 = target-only / the plain contrastive form
    temperature: float  # 0 = greedy
    server_k: bool = False  # K left to the server (contrastive: chosen per round, 0 too)

    @property
    def contrastive(self) -> bool:
        return self.decoding == CONTRASTIVE

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def name(self) -> str:
        how = "greedy" if self.greedy else f"sampled T={self.temperature:g}"
        if self.contrastive:
            form = "plain" if self.k == 0 else f"speculative K={self.k}"
            if self.server_k:
                form = "K chosen per round"
            return f"contrastive {how}, {form}"
        return f"target-only {how}" if self.k == 0 else f"speculative {how}, K={self.k}"


MODE_KEYS = ("greedy", "sampled", "spec-sampled", "cd-greedy", "cd-greedy-spec",
             "cd-greedy-auto", "cd-sampled", "cd-sampled-spec", "cd-sampled-auto")


def modes(k: int = 4, temperature: float = 1.0,
          keys: Sequence[str] = MODE_KEYS) -> list[Mode]:
    """The eval's modes, in MODE_KEYS order, those in `keys` only."""
    table = {
        "greedy": Mode("greedy", SPECULATIVE, 0, 0.0),
        "sampled": Mode("sampled", SPECULATIVE, 0, temperature),
        "spec-sampled": Mode("spec-sampled", SPECULATIVE, k, temperature),
        "cd-greedy": Mode("cd-greedy", CONTRASTIVE, 0, 0.0),
        "cd-greedy-spec": Mode("cd-greedy-spec", CONTRASTIVE, k, 0.0),
        "cd-greedy-auto": Mode("cd-greedy-auto", CONTRASTIVE, k, 0.0, server_k=True),
        "cd-sampled": Mode("cd-sampled", CONTRASTIVE, 0, temperature),
        "cd-sampled-spec": Mode("cd-sampled-spec", CONTRASTIVE, k, temperature),
        "cd-sampled-auto": Mode("cd-sampled-auto", CONTRASTIVE, k, temperature,
                                server_k=True),
    }
    unknown = [x for x in keys if x not in table]
    if unknown:
        raise ValueError(f"unknown mode(s) {', '.join(unknown)}; choose among "
                         f"{', '.join(MODE_KEYS)}")
    return [table[x] for x in MODE_KEYS if x in keys]


# (scenario, baseline) mode keys whose tok/s ratio the eval reports (harness.speedup);
# the first is issue 14's: the speculative contrastive form against the plain form.
COMPARISONS = [("cd-greedy-spec", "cd-greedy"), ("cd-sampled-spec", "cd-sampled"),
               ("cd-greedy-auto", "cd-greedy"), ("cd-sampled-auto", "cd-sampled"),
               ("spec-sampled", "sampled"), ("cd-greedy", "greedy")]


@dataclass(frozen=True)
class ContrastiveSettings:
    """GenerateRequest.contrastive; None = the server's default (alpha 0.1, beta 0.5,
    amateur temperature 1)."""

    alpha: float | None = None
    beta: float | None = None
    amateur_temperature: float | None = None
    formulation: str = "obrien"


@dataclass
class EvalSample(Sample):
    """A Sample with what the eval adds: the mode's key and the mean |V_head|."""

    mode: str = ""
    mean_head_size: float | None = None


def request(prompt: str, max_new_tokens: int, sampling: SamplingParams, mode: Mode | None,
            settings: ContrastiveSettings | None = None):
    """A raw-text GenerateRequest in `mode` (None: a plain one, for tokenizing), built by
    the client library's one request builder."""
    options = dict(max_new_tokens=max_new_tokens, temperature=sampling.temperature,
                   top_k=sampling.top_k, top_p=sampling.top_p, seed=sampling.seed)
    if mode is not None:
        if not mode.server_k:
            options["num_draft_tokens"] = mode.k
        if mode.contrastive:
            s = settings or ContrastiveSettings()
            options.update(decoding=CONTRASTIVE, alpha=s.alpha, beta=s.beta,
                           amateur_temperature=s.amateur_temperature,
                           formulation=s.formulation)
    return build_request(prompt, **options)


def prompt_ids(service, prompt: str) -> list[int]:
    """The ids the coordinator feeds for `prompt` (its own tokenization, via plan())."""
    return list(service.plan(request(prompt, 1, SamplingParams(), None)).prompt_ids)


class EvalScenario(SystemScenario):
    """One mode through the GenerationService in this process, raw-text prompts."""

    def __init__(self, service, mode: Mode, settings: ContrastiveSettings | None = None):
        super().__init__(service, mode.k)
        self.mode, self.settings = mode, settings or ContrastiveSettings()
        self.name, self.temperature = mode.name, mode.temperature

    def request(self, message: str, max_new_tokens: int, sampling: SamplingParams):
        return request(message, max_new_tokens, sampling, self.mode, self.settings)

    def run(self, message: str, max_new_tokens: int, sampling: SamplingParams) -> EvalSample:
        sample = super().run(message, max_new_tokens, sampling)
        stats = self.last_stats
        head = stats.mean_head_size if self.mode.contrastive and stats is not None else None
        fields = {f.name: getattr(sample, f.name) for f in dataclasses.fields(Sample)}
        return EvalSample(**fields, mode=self.mode.key, mean_head_size=head)


def run_modes(service, chosen: Sequence[Mode], prompts: Sequence[str], seeds: Sequence[int],
              max_new_tokens: int, settings: ContrastiveSettings | None = None, *,
              warmup_tokens: int = 8, say: Callable[[str], None] = print) -> list[EvalSample]:
    """Every (seed, prompt) through every mode, back to back (greedy modes repeat over
    the seeds too: their texts do not change, their timings are more samples). The
    sampling seed of repeat r is seeds[r]. A short warm-up per mode first, discarded."""
    scenarios = [EvalScenario(service, m, settings) for m in chosen]
    if warmup_tokens and prompts:
        for sc in scenarios:
            sc.run(prompts[0], warmup_tokens, SamplingParams(sc.temperature, seed=1))
    temperatures = sorted({m.temperature for m in chosen})
    return harness.run_side_by_side(
        scenarios, list(prompts), max_new_tokens, len(seeds), temperatures,
        include=lambda sc, t: sc.temperature == t, desc="eval", say=say,
        seed=lambda repeat, _i: seeds[repeat])
