"""`specdec bench-params`: sampling parameters, structured outputs, Predicted Outputs and
the prefix cache, through the real services (issues 31, 32).

Speculation stays on with every sampling parameter, and it should pay as much: for each
variant (plain, penalties, logprobs, both) it runs target-only and speculative decoding
(the server's K, as `specdec up` deploys it) back to back per prompt and reports the
speedup (harness.SPEEDUP_DEFINITION) and its ratio to the plain variant's. Greedy runs
check every variant's speculative text against its own target-only text.

Structured outputs: the prompts with a sentence asking for JSON, unconstrained and with
a strict schema; the constrained speedup (over constrained target-only) is reported as
a share of the unconstrained one on the same prompts (the issue asks within 15%).

Predicted Outputs: the plain request with its target-only answer as the prediction,
and with an edited one (a sentence inserted, a stretch taken out): the speedup over
plain target-only, the share of completion tokens accepted from the prediction, and the
prediction's tokens not taken. Both must give the target-only text.

The prefix cache: time to first token of a ~600-token prompt sent a second time, of one
that shares all but its last line, and of a multi-turn chat's second turn, each over the
same request with a prefix nobody sent before (the median over repeats).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from contextlib import ExitStack
from pathlib import Path

from specdec import wire
from specdec.grammar import Grammar
from specdec.sampling import SamplingParams
from specdec_tools.bench import harness
from specdec_tools.bench.chat_prompts import PROMPTS
from specdec_tools.bench.system import SystemScenario

# Structured outputs: the answer as JSON of this schema (strict: every property
# required, no others), the prompt saying so as a client's would.
SCHEMA = {"type": "object", "additionalProperties": False,
          "required": ["topic", "answer", "confidence"],
          "properties": {"topic": {"type": "string", "maxLength": 60},
                         "answer": {"type": "string"},
                         "confidence": {"enum": ["low", "medium", "high"]}}}
JSON_HINT = (' Reply in JSON: {"topic": a few words, "answer": your answer, '
             '"confidence": "low", "medium" or "high"}.')
VARIANTS = {  # name -> (sampling fields, logprobs)
    "plain": ({}, None),
    "penalties": (dict(presence_penalty=0.5, frequency_penalty=0.5, repetition_penalty=1.1,
                       logit_bias={11: -2.0}), None),
    "logprobs": ({}, 5),
    "penalties+logprobs": (dict(presence_penalty=0.5, frequency_penalty=0.5), 5),
    "json_schema": (dict(grammar=Grammar.of("json_schema", json.dumps(SCHEMA))), None),
}
# The unconstrained speedup a constrained one is compared with: the same JSON prompts.
PLAIN_JSON = "json prompts, unconstrained"
VARIANTS[PLAIN_JSON] = ({}, None)
LINES = [f"Line {i}: the inventory lists {i * 7 % 13} crates of apples, pears and plums "
         f"shipped from warehouse {i % 5} to the northern depot on day {i}." for i in range(22)]


class VariantScenario(SystemScenario):
    """A chat message with a variant's parameters; K = 0, or the server's (unset).
    `answers`: where the plain target-only run leaves each message's text."""

    def __init__(self, service, variant: str, speculative: bool, answers: dict | None = None):
        super().__init__(service, 0 if not speculative else 1)
        self.variant, self.speculative, self.answers = variant, speculative, answers
        self.name = f"{variant}: " + ("specdec" if speculative else "target-only")

    def run(self, message, max_new_tokens, sampling):
        sample = super().run(message, max_new_tokens, sampling)
        sample.stats = self.last_stats
        if self.answers is not None:
            self.answers[message] = sample.text
        return sample

    def request(self, message, max_new_tokens, sampling):
        fields, logprobs = VARIANTS[self.variant]
        if self.variant in ("json_schema", PLAIN_JSON):
            message += JSON_HINT
        req = super().request(message, max_new_tokens, sampling)
        if self.speculative:
            req.ClearField("num_draft_tokens")  # the server's K, load-aware
        for name, value in fields.items():
            if name == "logit_bias":
                req.sampling.logit_bias.update(value)
            elif name == "grammar":
                req.sampling.grammar.CopyFrom(wire.grammar_to_proto(value))
            else:
                setattr(req.sampling, name, value)
        if logprobs is not None:
            req.logprobs = logprobs
        return req


def edit(text: str) -> str:
    """A prediction as an edit would leave it: a sentence inserted a third of the way
    in, and a stretch before the middle taken out."""
    third, half = len(text) // 3, len(text) // 2
    return text[:third] + " Here is one more thing to add. " + text[half:]


class PredictionScenario(SystemScenario):
    """The plain request with the target-only answer as its prediction (or `edit`ed)."""

    def __init__(self, service, answers: dict, edited: bool):
        super().__init__(service, 1)
        self.answers, self.edited = answers, edited
        self.name = "prediction: " + ("edited" if edited else "the answer")

    def request(self, message, max_new_tokens, sampling):
        req = super().request(message, max_new_tokens, sampling)
        req.ClearField("num_draft_tokens")
        answer = self.answers[message]
        req.prediction = edit(answer) if self.edited else answer
        return req

    def run(self, message, max_new_tokens, sampling):
        sample = super().run(message, max_new_tokens, sampling)
        sample.stats = self.last_stats
        return sample


def _ttft(service, messages: list[dict]) -> float:
    from specdec.v1 import generate_pb2

    req = generate_pb2.GenerateRequest(max_new_tokens=1)
    for m in messages:
        req.messages.add(**m)
    t0 = time.perf_counter()
    for _ in service.stream(req):
        return time.perf_counter() - t0
    return time.perf_counter() - t0


def prefix_ttft(service, repeats: int, progress) -> dict:
    """TTFT ratios of the three cache hits over their misses (median of repeats)."""
    rows = {"repeat": [], "all_but_last_line": [], "second_turn": []}
    for rep in progress(range(repeats)):
        tag = f"{time.time_ns()}-{rep}"
        doc = "\n".join([f"Report {tag}."] + LINES)
        first = _ttft(service, [{"role": "user", "content": doc + "\nSummarise it."}])
        rows["repeat"].append(_ttft(service, [{"role": "user",
                                               "content": doc + "\nSummarise it."}]) / first)
        rows["all_but_last_line"].append(_ttft(service, [{
            "role": "user", "content": doc + "\nWhich depot gets them?"}]) / first)
        turn = [{"role": "user", "content": doc + "\nSummarise it."},
                {"role": "assistant", "content": "The report lists crates of fruit."},
                {"role": "user", "content": "Which warehouse shipped the most?"}]
        fresh = [{"role": "user", "content": f"Report {tag}-new." + doc[len(f'Report {tag}.'):]
                  + "\nSummarise it."}] + turn[1:]
        miss = _ttft(service, fresh)  # the same length, nothing cached past the template
        rows["second_turn"].append(_ttft(service, turn) / miss)
    return {k: statistics.median(v) for k, v in rows.items()} | {"samples": rows}


def run(args) -> int:
    from tqdm import tqdm

    from coordinator.deploy.config import CoordinatorConfig
    from coordinator.deploy.setup import build_service
    from specdec import pair as pairs
    from specdec.prepare import prepare_smollm2
    from specdec.runtime.openvino_export import export

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    hf = prepare_smollm2()
    export(hf, "fp32", say=say), export(hf, "int8", say=say)
    pair = pairs.DEFAULT_PAIR.with_models(args.model, args.model)
    messages = [m for _, m in PROMPTS[:args.prompts]]
    variants = args.variants or list(VARIANTS)
    with ExitStack() as stack:
        say("== starting target and draft services (the default pair)")
        running = pairs.start(pair, stack, pin=True)
        service = build_service(CoordinatorConfig(target=running.target.address,
                                                  draft=running.draft.address))
        answers: dict[str, str] = {}
        scenarios = [VariantScenario(service, v, spec, answers if (v, spec) == ("plain", False)
                                     else None) for v in variants for spec in (False, True)]
        if "plain" in variants:  # the predictions are plain target-only's answers
            scenarios += [PredictionScenario(service, answers, edited)
                          for edited in (False, True)]
        # One token of each prompt first: every scenario then finds the prompt in the
        # prefix cache alike (else the first to run would pay its prefill alone).
        for message in messages:
            scenarios[0].run(message, 1, SamplingParams())
        samples = harness.run_side_by_side(scenarios, messages, args.max_new_tokens,
                                           args.repeats, warmup=True, desc="variants",
                                           say=say)
        ttft = {}
        if args.ttft_repeats:
            say("== prefix cache: time to first token, hits over misses")
            ttft = prefix_ttft(service, args.ttft_repeats,
                               lambda xs: tqdm(xs, desc="prefix cache", unit="repeat"))
    rows, inexact = [], []
    for v in variants:
        spec, base = f"{v}: specdec", f"{v}: target-only"
        texts = {(s.prompt, s.repeat): s.token_ids for s in samples if s.scenario == base}
        if any(s.token_ids != texts[(s.prompt, s.repeat)]
               for s in samples if s.scenario == spec):
            inexact.append(v)
        drafted = sum(s.drafted for s in samples if s.scenario == spec)
        accepted = sum(s.stats.accepted_tokens for s in samples if s.scenario == spec)
        rows.append(dict(variant=v, speedup=harness.speedup(samples, spec, base),
                         drafted_tokens=drafted,
                         acceptance=accepted / drafted if drafted else None,
                         # structured outputs: committed without a pass (jump-forward)
                         forced_tokens=sum(s.stats.forced_tokens for s in samples
                                           if s.scenario == spec),
                         tokens=sum(s.tokens for s in samples if s.scenario == spec)))
    base = "plain: target-only"
    texts = {(s.prompt, s.repeat): s.token_ids for s in samples if s.scenario == base}
    for name in ("prediction: the answer", "prediction: edited") if "plain" in variants \
            else ():
        mine = [s for s in samples if s.scenario == name]
        if any(s.token_ids != texts[(s.prompt, s.repeat)] for s in mine):
            inexact.append(name)
        tokens = sum(s.tokens for s in mine)
        accepted = sum(s.stats.prediction_accepted_tokens for s in mine)
        rejected = sum(max(0, s.stats.prediction_tokens - s.stats.prediction_accepted_tokens)
                       for s in mine)
        rows.append(dict(variant=name, speedup=harness.speedup(samples, name, base),
                         drafted_tokens=sum(s.drafted for s in mine),
                         accepted_prediction_share=accepted / tokens if tokens else None,
                         rejected_prediction_tokens=rejected))
    plain = rows[0]["speedup"]
    for r in rows:
        r["vs_plain"] = r["speedup"] / plain if plain else None
    unconstrained = next((r["speedup"] for r in rows if r["variant"] == PLAIN_JSON), None)
    for r in rows:
        if r["variant"] == "json_schema" and unconstrained:
            # the rule: within 15% of the unconstrained speedup, same prompts
            r["vs_unconstrained"] = r["speedup"] / unconstrained
    meta = dict(command=" ".join(sys.argv), date=time.strftime("%Y-%m-%d"),
                speedup_definition=harness.SPEEDUP_DEFINITION, prompts=len(messages),
                repeats=args.repeats, max_new_tokens=args.max_new_tokens)
    md = ["| variant | speedup | / plain's | drafted tokens | accepted / drafted | "
          "accepted prediction tokens / completion tokens | rejected prediction tokens |",
          "|---|---|---|---|---|---|---|"]

    def f(value, fmt=".2f"):
        return "-" if value is None else format(value, fmt)

    md += [f"| {r['variant']} | {r['speedup']:.2f}x | {f(r['vs_plain'])} | "
           f"{r['drafted_tokens']} | {f(r.get('acceptance'))} | "
           f"{f(r.get('accepted_prediction_share'))} | "
           f"{f(r.get('rejected_prediction_tokens'), 'd')} |" for r in rows]
    if unconstrained and any("vs_unconstrained" in r for r in rows):
        (c,) = [r for r in rows if "vs_unconstrained" in r]
        md += ["", f"json_schema's speedup over constrained target-only is "
               f"{c['vs_unconstrained']:.2f} of the unconstrained speedup on the same "
               f"JSON prompts; {c['forced_tokens']} of its {c['tokens']} tokens were "
               "forced by the grammar (committed without a pass)."]
    if ttft:
        md += ["", "| prefix cache hit | TTFT / miss's (median) |", "|---|---|"]
        md += [f"| {k.replace('_', ' ')} | {ttft[k]:.2f} |"
               for k in ("repeat", "all_but_last_line", "second_turn")]
    md += ["", harness.SPEEDUP_DEFINITION + ".", f"`{meta['command']}`"]
    (out / "params.md").write_text("\n".join(md) + "\n")
    (out / "params.json").write_text(json.dumps(dict(rows=rows, ttft=ttft, meta=meta),
                                                indent=1))
    _plot(rows, ttft, out / "params.png")
    print("\n".join(md))
    if inexact:
        print(f"FAILURE: greedy speculative output differs from target-only in: "
              f"{', '.join(inexact)}", file=sys.stderr)
        return 1
    return 0


def _plot(rows, ttft, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4), width_ratios=(2, 1))
    a.bar([r["variant"] for r in rows], [r["speedup"] for r in rows])
    a.axhline(1.0, color="grey", lw=0.8)
    a.set_ylabel("speedup over target-only")
    a.tick_params(axis="x", labelrotation=30, labelsize=8)
    keys = ("repeat", "all_but_last_line", "second_turn") if ttft else ()
    b.bar([k.replace("_", " ") for k in keys], [ttft[k] for k in keys])
    b.set_ylabel("TTFT, hit / miss")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def add_parser(sub) -> None:
    p = sub.add_parser(
        "bench-params", help="speedup with penalties, logprobs, a JSON schema and "
                             "predictions; prefix-cache TTFT",
        description="Target-only and speculative decoding side by side per sampling "
                    "variant (plain, penalties, logprobs, both, a strict JSON schema and "
                    "the same JSON prompts unconstrained), and with Predicted Outputs, "
                    "through the default pair "
                    "and the coordinator's defaults, and the prefix cache's time to first "
                    "token on hits over misses; writes params.json, params.md and "
                    "params.png. Greedy runs check every text against target-only (exit 1 "
                    "otherwise). " + harness.SPEEDUP_DEFINITION)
    p.add_argument("--prompts", type=int, default=8,
                   help="how many of the general chat prompts (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=96,
                   help="tokens per generation (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=2,
                   help="passes over the prompts (default: %(default)s)")
    p.add_argument("--ttft-repeats", type=int, default=5,
                   help="prefix-cache measurements, each with a fresh prefix; 0 skips "
                        "them (default: %(default)s)")
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), metavar="VARIANT",
                   help="which variants to run, of: " + ", ".join(VARIANTS) + " (default: "
                        "all; the prediction rows need plain)")
    p.add_argument("--model", default="smollm2-135m", help="model (default: %(default)s)")
    p.add_argument("--out", default="bench-results",
                   help="folder for the results (default: %(default)s)")
    p.set_defaults(func=run)
