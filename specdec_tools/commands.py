"""The tooling's `specdec` commands: benchmarks, the soak, scale-out, layer-skip tuning.
specdec.cli adds them when this package is installed (a checkout's `make setup`); the
service images carry only the library's commands."""

from __future__ import annotations

import argparse
import sys


def _rpc_bench(args: argparse.Namespace) -> int:
    from specdec_tools import rpcbench

    result = rpcbench.run(args.draft, args.target, args.generations, args.max_new_tokens,
                          args.k, args.temperature, args.top_n)
    print(rpcbench.to_json(result) if args.json else rpcbench.to_text(result))
    if result.exact is False:
        print("error: greedy speculative output differs from target-only output",
              file=sys.stderr)
        return 1
    return 0


def add_parsers(sub) -> None:
    """Every tooling command, as subcommands of `specdec`."""
    b = sub.add_parser(
        "rpc-bench",
        help="acceptance, bytes per round and Propose/Verify latency over gRPC",
        description="Run target-only and speculative generations side by side through the "
                    "draft and target services and report acceptance, wire bytes per round, "
                    "RPC latency and tokens/s (medians). Without --draft/--target, starts the "
                    "tiny models on loopback ports.",
    )
    b.add_argument("--draft", metavar="HOST:PORT",
                   help="draft service address (default: start tiny-random-draft here)")
    b.add_argument("--target", metavar="HOST:PORT",
                   help="target service address (default: start tiny-random here)")
    b.add_argument("--generations", type=int, default=20,
                   help="prompts, each generated target-only and speculatively "
                        "(default: %(default)s)")
    b.add_argument("--max-new-tokens", type=int, default=64,
                   help="tokens per generation (default: %(default)s)")
    b.add_argument("-k", "--k", type=int, default=4,
                   help="draft tokens per round (default: %(default)s)")
    b.add_argument("--temperature", type=float, default=0.0,
                   help="0 = greedy, which also checks exactness (default: %(default)s)")
    b.add_argument("--top-n", type=int, default=0,
                   help="sparse q size per drafted token; 0 = the draft's default "
                        "(default: %(default)s)")
    b.add_argument("--json", action="store_true", help="print the result as JSON")
    b.set_defaults(func=_rpc_bench)

    from specdec_tools.bench.batch_rpc import add_parser as add_bench_batch_rpc
    from specdec_tools.bench.cli import add_parser as add_bench
    from specdec_tools.bench.draft_head import add_parser as add_bench_draft_head
    from specdec_tools.bench.drafters import add_parser as add_bench_drafters
    from specdec_tools.bench.eval_cli import add_parser as add_eval
    from specdec_tools.bench.load import add_parser as add_load
    from specdec_tools.bench.params import add_parser as add_bench_params
    from specdec_tools.bench.pass_width import add_parser as add_bench_pass_width
    from specdec_tools.bench.predraft_replay_cli import add_parser as add_replay_predraft
    from specdec_tools.bench.tls_overhead import add_parser as add_bench_tls
    from specdec_tools.demo import add_parser as add_demo
    from specdec_tools.pairbench import add_parser as add_pairbench
    from specdec_tools.scale.cli import add_parser as add_bench_scale
    from specdec_tools.skip_tune.bench import add_parser as add_bench_skip
    from specdec_tools.skip_tune.cli import add_parser as add_tune_skip
    from specdec_tools.soak.cli import add_parser as add_soak

    for add in (add_demo, add_pairbench, add_bench, add_load, add_bench_tls, add_soak, add_eval,
                add_tune_skip, add_bench_skip, add_bench_drafters, add_bench_pass_width,
                add_bench_batch_rpc, add_bench_draft_head, add_bench_scale, add_bench_params,
                add_replay_predraft):
        add(sub)
