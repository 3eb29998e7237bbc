"""`specdec demo`, what `make demo` runs: prepare the model, start the three services on
loopback, generate one chat answer greedily with K and with K=0 side by side (the bench
harness), print both texts, the speedup and the acceptance."""

from __future__ import annotations

import argparse
from contextlib import ExitStack

DEMO_PROMPT = "Explain in a few sentences why the sky is blue."
# a coder pair answers a coding question
DEMO_PROMPTS = {"qwen2.5-coder": "Write a Python function that returns the n-th Fibonacci "
                                 "number iteratively, with a docstring."}
DEMO_K = 4  # the request's K unless --k says (the README's figures are at K=4)


def demo(args: argparse.Namespace) -> int:
    """Prepare, start everything, K vs K=0 on one chat prompt, print both and the speedup."""
    from specdec import stack
    from specdec.client_cli import stack_config
    from specdec.prepare import prepare_smollm2
    from specdec.runtime.openvino_export import export
    from specdec.tls import open_channel
    from specdec.v1 import generate_pb2_grpc
    from specdec_tools.bench import harness
    from specdec_tools.bench.system import BASELINE, GrpcScenario

    if args.pair == "smollm2":
        print("== preparing the SmolLM2-135M model and its OpenVINO IRs (cached after the "
              "first run)", flush=True)
        folder = prepare_smollm2()
        for weights in ("fp32", "int8"):
            export(folder, weights, say=lambda m: print(m, flush=True))
    else:
        from specdec.model_pairs import PAIRS, prepare_pair

        print(f"== preparing the {args.pair} pair (cached after the first run)", flush=True)
        prepare_pair(PAIRS[args.pair])
    prompt = args.prompt or DEMO_PROMPTS.get(args.pair, DEMO_PROMPT)
    cfg = stack_config(args)
    k = cfg.k if cfg.k is not None else DEMO_K
    with ExitStack() as es:
        print("== starting target, draft and coordinator on loopback", flush=True)
        s = stack.start(cfg, es)
        with open_channel(s.address, tls=s.client_tls) as channel:
            stub = generate_pb2_grpc.GeneratorStub(channel)
            spec_sc = GrpcScenario(stub, k)
            print(f"== warming up, then generating greedily, K={k} and K=0 back to back, "
                  f"{args.repeats} times", flush=True)
            samples = harness.run_side_by_side([spec_sc, GrpcScenario(stub, 0)], [prompt],
                                               args.max_new_tokens, args.repeats,
                                               warmup=True, desc="demo")
    spec = next(x for x in samples if x.scenario == spec_sc.name)
    base = next(x for x in samples if x.scenario == BASELINE)
    same = all(x.token_ids == base.token_ids for x in samples)
    print(f"\n--- speculative (K={k}) ---\n{spec.text}\n")
    print(f"--- target only (K=0) ---\n{base.text}\n")
    print(f"identical token ids: {'yes' if same else 'NO'} ({spec.tokens} tokens)")
    print(f"target-only: {harness.median_tps(samples, BASELINE):.1f} tokens/s   speculative: "
          f"{harness.median_tps(samples, spec_sc.name):.1f} tokens/s (medians of "
          f"{args.repeats})   speedup: "
          f"{harness.speedup(samples, spec_sc.name, BASELINE):.2f}x")
    print(f"  ({harness.SPEEDUP_DEFINITION})")
    print(f"acceptance: {spec.accepted / max(spec.drafted, 1):.2f} of drafted tokens "
          f"({spec.accepted}/{spec.drafted}), {spec.tokens / max(spec.rounds, 1):.2f} tokens "
          f"per target pass")
    return 0 if same else 1


def add_parser(sub) -> None:
    from specdec.client_cli import add_stack_flags

    d = sub.add_parser("demo", help="the README's demo: speculative vs target-only",
                       description="Prepare the model, start everything, generate one chat "
                                   "answer greedily with K and with K=0, print both texts, "
                                   "tokens/s, speedup and acceptance, then stop everything.")
    add_stack_flags(d)
    d.add_argument("--prompt", default="",
                   help=f"the chat prompt (default: {DEMO_PROMPT!r}; with --pair "
                        "qwen2.5-coder a coding question)")
    d.add_argument("--max-new-tokens", type=int, default=96,
                   help="tokens to generate (default: %(default)s)")
    d.add_argument("--repeats", type=int, default=3,
                   help="interleaved runs of each; medians are printed (default: %(default)s)")
    # the real pair, as `make demo` (its Makefile passes PAIR); --pair smollm2 for the toy
    d.set_defaults(func=demo, pair="qwen2.5-coder")
