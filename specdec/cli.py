"""The `specdec` command."""

from __future__ import annotations

import argparse
import logging
import sys


def _rpc_bench(args: argparse.Namespace) -> int:
    from specdec import rpcbench

    result = rpcbench.run(args.draft, args.target, args.generations, args.max_new_tokens,
                          args.k, args.temperature, args.top_n)
    print(rpcbench.to_json(result) if args.json else rpcbench.to_text(result))
    if result.exact is False:
        print("error: greedy speculative output differs from target-only output",
              file=sys.stderr)
        return 1
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="specdec", description="distributed speculative decoding")
    sub = p.add_subparsers(dest="command", required=True)

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

    from specdec.prepare import add_prepare_parser

    add_prepare_parser(sub)
    from specdec.client_cli import add_parsers

    add_parsers(sub)
    from specdec.pairbench import add_parser as add_pairbench

    add_pairbench(sub)
    from specdec.bench.cli import add_parser as add_bench

    add_bench(sub)
    from specdec.bench.load import add_parser as add_load

    add_load(sub)
    from specdec.bench.tls_overhead import add_parser as add_bench_tls

    add_bench_tls(sub)
    from specdec.certs import add_parser as add_certs

    add_certs(sub)
    from specdec.soak import add_parser as add_soak

    add_soak(sub)
    from specdec.bench.eval_cli import add_parser as add_eval

    add_eval(sub)
    from specdec.skip_tune.cli import add_parser as add_tune_skip

    add_tune_skip(sub)
    from specdec.bench.skip import add_parser as add_bench_skip

    add_bench_skip(sub)
    from specdec.bench.drafters import add_parser as add_bench_drafters

    add_bench_drafters(sub)
    from specdec.bench.pass_width import add_parser as add_bench_pass_width

    add_bench_pass_width(sub)
    from specdec.bench.batch_rpc import add_parser as add_bench_batch_rpc

    add_bench_batch_rpc(sub)
    from specdec.bench.draft_head import add_parser as add_bench_draft_head

    add_bench_draft_head(sub)
    from specdec.scale.cli import add_parser as add_bench_scale

    add_bench_scale(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
