"""`specdec rpc-bench`: acceptance, bytes per round and RPC latency of the services.

Runs target-only (K=0) and speculative generations of random token-id prompts side by
side (specdec_tools.bench.harness: interleaved, same prompts) through the real gRPC services,
either started here on loopback with the tiny models or given by address, and reports
medians; speedup is harness.SPEEDUP_DEFINITION. Greedy runs also check exactness: every
speculative generation must equal its target-only twin.
"""

from __future__ import annotations

import json
import statistics
from contextlib import ExitStack
from dataclasses import asdict, dataclass

import torch

from coordinator.remote.clients import Call
from specdec_tools.bench import harness


@dataclass
class RpcBenchResult:
    draft: str
    target: str
    k: int
    generations: int
    max_new_tokens: int
    temperature: float
    top_n: int
    acceptance_rate: float  # accepted / drafted
    alpha: float  # per-token acceptance: accepted / (accepted + rejections)
    tokens_per_round: float
    bytes_per_round: float  # both RPCs, both directions, serialized protobuf
    propose_reply_bytes_median: float
    verify_reply_bytes_median: float
    verify_request_bytes_median: float
    propose_ms_median: float
    propose_ms_p90: float
    verify_ms_median: float
    verify_ms_p90: float
    target_only_tokens_per_s: float  # median over generations
    speculative_tokens_per_s: float  # median over generations
    speedup_median: float  # harness.SPEEDUP_DEFINITION
    exact: bool | None  # greedy only: every speculative output == target-only output
    speedup_definition: str = harness.SPEEDUP_DEFINITION


def _quantile_ms(calls: list[Call], q: float) -> float:
    values = sorted(c.seconds for c in calls)
    return 1000 * values[min(len(values) - 1, int(q * len(values)))]


def start_tiny_services(stack: ExitStack) -> tuple[str, str]:
    """Tiny draft and target servers on loopback, stopped when `stack` closes."""
    from draft_service.__main__ import create as create_draft
    from draft_service.config import DraftConfig
    from target_service.__main__ import create as create_target
    from target_service.config import TargetConfig

    addresses = []
    for create, cfg in ((create_draft, DraftConfig(model="tiny-random-draft", port=0)),
                        (create_target, TargetConfig(model="tiny-random", port=0))):
        server, port, _ = create(cfg)
        server.start()
        stack.callback(server.stop, 0)
        addresses.append(f"127.0.0.1:{port}")
    return addresses[0], addresses[1]


def run(draft_address: str | None = None, target_address: str | None = None,
        generations: int = 20, max_new_tokens: int = 64, k: int = 4,
        temperature: float = 0.0, top_n: int = 0, prompt_len: int = 16) -> RpcBenchResult:
    from coordinator.deploy.config import CoordinatorConfig
    from coordinator.deploy.setup import build_service
    from specdec_tools.bench.system import BASELINE, LoopScenario

    with ExitStack() as stack:
        if draft_address is None or target_address is None:
            draft_address, target_address = start_tiny_services(stack)
        # Separate services (so separate clients): the speculative clients log only
        # speculative calls. Sequential rounds, said explicitly.
        base_service = build_service(CoordinatorConfig(target=target_address, draft="",
                                                       pipeline=False))
        spec_service = build_service(CoordinatorConfig(target=target_address,
                                                       draft=draft_address, top_n=top_n,
                                                       pipeline=False, drafter="model"))
        draft = spec_service.loop.draft.replicas()[0].client
        target = spec_service.loop.target.replicas()[0].client
        d_info, t_info = draft.info(), target.info()
        g = torch.Generator().manual_seed(0)
        prompts = [torch.randint(0, t_info.vocab_size, (prompt_len,), generator=g).tolist()
                   for _ in range(generations)]
        base_sc, spec_sc = LoopScenario(base_service, 0), LoopScenario(spec_service, k)
        samples = harness.run_side_by_side([base_sc, spec_sc], prompts, max_new_tokens,
                                           temperatures=(temperature,),
                                           desc=f"rpc-bench K={k}",
                                           seed=lambda repeat, i: i)
        base = [s for s in samples if s.scenario == BASELINE]
        spec = [s for s in samples if s.scenario == spec_sc.name]
        rounds = sum(s.rounds for s in spec)
        drafted, accepted = sum(s.drafted for s in spec), sum(s.accepted for s in spec)
        rejections = sum(s.rejections for s in spec)
        exact = all(s.token_ids == b.token_ids for s, b in zip(spec, base, strict=True))
        proposes, verifies = list(draft.bytes.recent), list(target.bytes.recent)
        total_bytes = sum(c.request_bytes + c.reply_bytes for c in proposes + verifies)
        return RpcBenchResult(
            draft=d_info.model_id, target=t_info.model_id, k=k, generations=generations,
            max_new_tokens=max_new_tokens, temperature=temperature,
            top_n=top_n or d_info.default_top_n,
            acceptance_rate=accepted / max(drafted, 1),
            alpha=accepted / max(accepted + rejections, 1),
            tokens_per_round=generations * max_new_tokens / rounds,
            bytes_per_round=total_bytes / rounds,
            propose_reply_bytes_median=statistics.median(c.reply_bytes for c in proposes),
            verify_reply_bytes_median=statistics.median(c.reply_bytes for c in verifies),
            verify_request_bytes_median=statistics.median(c.request_bytes for c in verifies),
            propose_ms_median=_quantile_ms(proposes, 0.5),
            propose_ms_p90=_quantile_ms(proposes, 0.9),
            verify_ms_median=_quantile_ms(verifies, 0.5),
            verify_ms_p90=_quantile_ms(verifies, 0.9),
            target_only_tokens_per_s=harness.median_tps(samples, BASELINE),
            speculative_tokens_per_s=harness.median_tps(samples, spec_sc.name),
            speedup_median=harness.speedup(samples, spec_sc.name, BASELINE),
            exact=exact if temperature == 0 else None,
        )


def to_json(result: RpcBenchResult) -> str:
    return json.dumps(asdict(result), indent=2)


def to_text(r: RpcBenchResult) -> str:
    lines = [
        f"draft {r.draft} / target {r.target}, K={r.k}, temperature={r.temperature}, "
        f"top_n={r.top_n}, {r.generations} prompts x {r.max_new_tokens} tokens",
        f"  acceptance             {r.acceptance_rate:.3f} of drafts, per-token alpha "
        f"{r.alpha:.3f}, {r.tokens_per_round:.2f} tokens/round",
        f"  bytes per round        {r.bytes_per_round:.0f}  (Propose reply median "
        f"{r.propose_reply_bytes_median:.0f} B, Verify request "
        f"{r.verify_request_bytes_median:.0f} B, reply {r.verify_reply_bytes_median:.0f} B)",
        f"  Propose latency        median {r.propose_ms_median:.2f} ms, "
        f"p90 {r.propose_ms_p90:.2f} ms",
        f"  Verify latency         median {r.verify_ms_median:.2f} ms, "
        f"p90 {r.verify_ms_p90:.2f} ms",
        f"  tokens/s               target-only {r.target_only_tokens_per_s:.0f}, speculative "
        f"{r.speculative_tokens_per_s:.0f} (median speedup {r.speedup_median:.2f}x)",
    ]
    if r.exact is not None:
        lines.append(f"  greedy exactness       {'OK: identical ids' if r.exact else 'MISMATCH'}")
    return "\n".join(lines)
