"""`specdec generate` and `specdec up` (`specdec demo` is the tooling's: specdec_tools.demo)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from contextlib import ExitStack
from pathlib import Path

log = logging.getLogger("specdec")

API_KEY_ENV = "SPECDEC_API_KEY"


def structured_output(args: argparse.Namespace) -> dict | None:
    """--json-schema (text, or @FILE), --json-object, --regex, --choice, --grammar."""
    schema = args.json_schema
    if schema is not None and schema.startswith("@"):
        schema = Path(schema[1:]).read_text()
    found = {k: v for k, v in (("json", schema), ("regex", args.regex),
                               ("choice", args.choice), ("grammar", args.grammar),
                               ("json_object", args.json_object or None)) if v is not None}
    return found or None


def request_options(args: argparse.Namespace) -> dict:
    """`specdec generate`'s flags as Client.generate/stream keyword options."""
    options = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                   top_k=args.top_k, top_p=args.top_p, seed=args.seed, stop=args.stop or (),
                   num_draft_tokens=args.k, decoding=args.decoding, alpha=args.alpha,
                   beta=args.beta, amateur_temperature=args.amateur_temperature,
                   formulation=args.formulation, presence_penalty=args.presence_penalty,
                   frequency_penalty=args.frequency_penalty,
                   repetition_penalty=args.repetition_penalty, min_p=args.min_p,
                   logprobs=args.logprobs, prediction=args.prediction,
                   structured_output=structured_output(args))
    if args.chat:
        options["messages"] = [("user", args.prompt)]
    else:
        options["prompt"] = args.prompt
    return options


def generate(args: argparse.Namespace) -> int:
    """One generation through specdec.client.Client: the text, or with --json the wire
    fields (one JSON object per chunk with --stream); a failed call prints its status."""
    from google.protobuf.json_format import MessageToDict

    from specdec.client import Client, SpecdecAPIError
    from specdec.client.convert import chunk_to_proto, completion_to_proto
    from specdec.tls import client_tls

    options = request_options(args)
    try:
        tls = client_tls(args.tls_ca, args.tls_cert, args.tls_key, args.tls_server_name)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    key = args.api_key or os.environ.get(API_KEY_ENV, "")
    metadata = [("authorization", f"Bearer {key}")] if key else []
    with Client(args.address, timeout=args.timeout, tls=tls, metadata=metadata) as client:
        try:
            if args.stream:
                for chunk in client.stream(**options):
                    if args.json:
                        print(json.dumps(MessageToDict(chunk_to_proto(chunk))), flush=True)
                    else:
                        print(chunk.text, end="", flush=True)
                if not args.json:
                    print()
                return 0
            completion = client.generate(**options)
        except SpecdecAPIError as e:
            print(f"error: {e.status_name}: {e.message}", file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps(MessageToDict(completion_to_proto(completion),
                                       always_print_fields_with_no_presence=True), indent=2))
    else:
        print(completion.text)
    return 0


def up(args: argparse.Namespace) -> int:
    from specdec import stack

    cfg = stack_config(args)
    with ExitStack() as es:
        s = stack.start(cfg, es, echo=args.verbose)
        print(f"specdec is up: coordinator {s.address}  target {s.target.address}"
              + (f"  draft {s.draft.address}" if s.draft else "  (no draft)"), flush=True)
        if s.http_url:
            print(f"HTTP: {s.http_url}/v1 (OpenAI-compatible), demo page {s.http_url}/demo",
                  flush=True)
        tls = ""
        if s.tls_paths is not None:
            ca = s.tls_paths["ca"][0]
            tls = f" --tls-ca {ca}"
            print(f"TLS on every hop (mutual to the draft and target); certificates in "
                  f"{cfg.tls_dir}. Clients trust {ca}: curl --cacert {ca} "
                  f"{s.http_url}/v1/models", flush=True)
        print(f'try: specdec generate --chat "Hello!"{tls}   (Ctrl-C stops everything)',
              flush=True)
        done = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: done.set())
        while not done.wait(1.0):
            for proc in [s.coordinator, s.target, *([s.draft] if s.draft else [])]:
                if proc.proc.poll() is not None:
                    print(f"error: {proc.name} exited:\n{proc.output[-2000:]}", file=sys.stderr)
                    return 1
        print("stopping ...", flush=True)
    return 0


def stack_config(args: argparse.Namespace):
    from specdec.pair import SERVED, Pair
    from specdec.stack import StackConfig

    base = SERVED[args.pair]
    if getattr(args, "contrastive", False):  # the pair's draft as the amateur
        base = base.with_amateur()

    def spec(default, model, flags):
        spec = default.with_(model=model or default.model, threads=args.threads)
        if flags:  # replace the default's backend/weights flags
            spec = spec.with_(backend=None, weights=None, extra=tuple(flags))
        return spec

    pair = Pair(base.name if not (args.draft_arg or args.target_arg) else "custom",
                spec(base.target, args.target_model, args.target_arg),
                spec(base.draft, args.draft_model, args.draft_arg))
    return StackConfig(pair=pair, k=args.k_default, port=args.port, http_port=args.http_port,
                       draft_port=args.draft_port, target_port=args.target_port,
                       pin=not args.no_pin, no_draft=args.no_draft,
                       drafter=args.drafter, lookup_cache=args.lookup_cache,
                       pipeline=False if args.no_pipeline else None, tls_dir=tls_dir(args))


def tls_dir(args: argparse.Namespace) -> str:
    """The folder for --tls's development certificates ("" without --tls)."""
    if not args.tls:
        return ""
    if args.tls_dir:
        return args.tls_dir
    from specdec.paths import default_home

    return str(default_home() / "certs" / "dev")


def add_stack_flags(p: argparse.ArgumentParser) -> None:
    from specdec.pair import DEFAULT_PAIR, SERVED
    from specdec.stack import StackConfig

    d = StackConfig()
    p.add_argument("--pair", choices=sorted(SERVED), default="smollm2",
                   help="the models and the weights each is served at: smollm2 = "
                        "SmolLM2-135M drafting for itself (`specdec prepare --openvino`); "
                        "qwen2.5-coder = Qwen2.5-Coder-0.5B drafting for -1.5B (`specdec "
                        "prepare --pair qwen2.5-coder`) (default: %(default)s)")
    p.add_argument("--target-model", default=None, metavar="NAME|FOLDER",
                   help="target model: a prepared name (smollm2-135m, qwen2.5-coder-1.5b, "
                        "qwen2.5-coder-0.5b) or a folder on disk: a Hugging Face folder (its "
                        "IR is exported beside it on first use) or an OpenVINO IR folder; "
                        "the coordinator takes the tokenizer from it (default: the --pair's)")
    p.add_argument("--draft-model", default=None, metavar="NAME|FOLDER",
                   help="draft model, as --target-model (default: the --pair's)")
    p.add_argument("--draft-arg", action="append", metavar="FLAG",
                   help="flag for the draft service, repeatable; replaces the default "
                        f"{' '.join(DEFAULT_PAIR.draft.model_flags())} "
                        "(e.g. --draft-arg=--backend=torch)")
    p.add_argument("--target-arg", action="append", metavar="FLAG",
                   help="flag for the target service, repeatable; replaces the default "
                        f"{' '.join(DEFAULT_PAIR.target.model_flags())}")
    p.add_argument("--contrastive", action="store_true",
                   help="start the draft so that it can serve contrastive decoding as the "
                        "amateur: OpenVINO's dynamic quantization off ("
                        "--dynamic-quantization off), which makes its logits depend on the "
                        "prefix alone and its passes slower (docs/design.md section 17); "
                        "without it, contrastive requests get FAILED_PRECONDITION")
    p.add_argument("--no-pipeline", action="store_true",
                   help="sequential rounds instead of pipelined drafting")
    p.add_argument("--no-pin", action="store_true",
                   help="do not pin the draft and the target to separate CPUs (pinned: the "
                        "draft on the first CPU this process may use, the target on the "
                        "second, when there are two)")
    p.add_argument("--no-draft", action="store_true",
                   help="start no draft service: the coordinator then drafts by look-up "
                        "alone (model-free), or decodes target-only with --drafter model")
    # The coordinator's options default to the coordinator's defaults (its --help): a
    # flag not given here is not passed on.
    p.add_argument("--drafter", default=None, metavar="WHO",
                   help="who drafts each round: the draft service (model), a model-free "
                        "look-up in the prompt and the text so far (lookup), or per round "
                        "whichever is expected to give more tokens/s (hybrid); the "
                        "coordinator checks the name (default: the coordinator's)")
    p.add_argument("--lookup-cache", type=int, default=None, metavar="N",
                   help="the look-up also drafts from each tenant's N most recent outputs; "
                        "0 = off (default: the coordinator's)")
    p.add_argument("--k", dest="k_default", type=int, default=None,
                   help="draft tokens per round when a request does not say (default: the "
                        "coordinator's)")
    p.add_argument("--port", type=int, default=d.port,
                   help="coordinator gRPC port (default: %(default)s)")
    p.add_argument("--http-port", type=int, default=d.http_port,
                   help="coordinator HTTP port: the OpenAI-compatible API and the browser "
                        "demo at /demo; 0 = not exposed (default: %(default)s)")
    p.add_argument("--draft-port", type=int, default=d.draft_port,
                   help="draft service port (default: %(default)s)")
    p.add_argument("--target-port", type=int, default=d.target_port,
                   help="target service port (default: %(default)s)")
    p.add_argument("--tls", action="store_true",
                   help="TLS on every hop with development certificates made on the fly "
                        "(specdec certs): mutual TLS from the coordinator to the draft and "
                        "target, TLS on the client API (gRPC and HTTPS)")
    p.add_argument("--tls-dir", default="", metavar="DIR",
                   help="with --tls: where the certificates go (a CA already there is "
                        "kept) (default: $SPECDEC_HOME/certs/dev)")
    p.add_argument("--threads", type=int, default=DEFAULT_PAIR.target.threads,
                   help="threads per model service; 0 = the runtime's default "
                        "(default: %(default)s)")


def add_parsers(sub) -> None:
    g = sub.add_parser("generate", help="generate text through a running coordinator",
                       description="Send one Generate (or GenerateStream) request to the "
                                   "coordinator and print the text.")
    g.add_argument("prompt", help="the prompt text (a user message with --chat)")
    g.add_argument("--chat", action="store_true",
                   help="send the prompt as a user chat message (the model's chat template)")
    g.add_argument("--max-new-tokens", type=int, default=128,
                   help="most tokens to generate (default: %(default)s)")
    g.add_argument("--temperature", type=float, default=0.0,
                   help="0 = greedy (default: %(default)s)")
    g.add_argument("--top-k", type=int, default=0, help="0 = off (default: %(default)s)")
    g.add_argument("--top-p", type=float, default=0.0, help="0 or 1 = off (default: %(default)s)")
    g.add_argument("--seed", type=int, default=0,
                   help="seed of every random draw; same seed, same text (default: %(default)s)")
    g.add_argument("--presence-penalty", type=float, default=0.0,
                   help="OpenAI's presence penalty over the generated tokens, [-2, 2]; "
                        "speculation stays on (default: %(default)s)")
    g.add_argument("--frequency-penalty", type=float, default=0.0,
                   help="OpenAI's frequency penalty, [-2, 2] (default: %(default)s)")
    g.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="HF's repetition penalty over prompt and output, (0, 2]; 1 = off "
                        "(default: %(default)s)")
    g.add_argument("--min-p", type=float, default=0.0,
                   help="keep tokens with probability >= min_p * the largest; 0 = off "
                        "(default: %(default)s)")
    g.add_argument("--logprobs", type=int, default=None, metavar="N",
                   help="each token's raw log-probability and its N most likely "
                        "alternatives (0-20), shown with --json (default: none)")
    g.add_argument("--prediction", default="", metavar="TEXT",
                   help="text the answer is expected to resemble (Predicted Outputs: "
                        "drafted from, realigned after edits; the output stays the "
                        "target's) (default: none)")
    so = g.add_mutually_exclusive_group()
    so.add_argument("--json-schema", metavar="SCHEMA",
                    help="structured output: the text is JSON matching this schema (JSON "
                         "text, or @FILE); speculation stays on (default: free text)")
    so.add_argument("--json-object", action="store_true",
                    help="structured output: the text is a JSON object")
    so.add_argument("--regex", help="structured output: the text matches this regex")
    so.add_argument("--choice", nargs="+", metavar="TEXT",
                    help="structured output: the text is one of these")
    so.add_argument("--grammar", metavar="LARK",
                    help="structured output: the text matches this Lark (or GBNF) grammar")
    g.add_argument("--k", type=int, default=None,
                   help="draft tokens per round; 0 = target only (default: the "
                        "coordinator's)")
    g.add_argument("--decoding", choices=("speculative", "contrastive"), default="speculative",
                   help="speculative: the target's own distribution; contrastive: the "
                        "target (expert) against the draft (amateur), --k 0 for its plain "
                        "form (default: %(default)s)")
    g.add_argument("--alpha", type=float, default=None,
                   help="contrastive: keep tokens with p >= alpha * max p, in (0, 1] "
                        "(default: the server's, 0.1)")
    g.add_argument("--beta", type=float, default=None,
                   help="contrastive (obrien): the amateur's weight, >= 0 (default: 0.5)")
    g.add_argument("--amateur-temperature", type=float, default=None,
                   help="contrastive (li): the amateur's temperature, > 0 (default: 1)")
    g.add_argument("--formulation", choices=("obrien", "li"), default=None,
                   help="contrastive score: obrien = (1+beta) logit_exp - beta logit_ama "
                        "(O'Brien & Lewis 2023), li = log p_exp - log p_ama (Li et al. "
                        "2022) (default: obrien)")
    g.add_argument("--stop", action="append", help="stop string, repeatable")
    g.add_argument("--stream", action="store_true", help="print text as it is generated")
    g.add_argument("--json", action="store_true",
                   help="print the response fields (ids, kinds, finish_reason, stats) as JSON")
    g.add_argument("--address", default="127.0.0.1:50050",
                   help="coordinator address (default: %(default)s)")
    g.add_argument("--timeout", type=float, default=600.0,
                   help="deadline in seconds (default: %(default)s)")
    g.add_argument("--api-key", default="",
                   help=f"send this API key ('authorization: Bearer <key>'); default: "
                        f"${API_KEY_ENV} if set, else none")
    g.add_argument("--tls-ca", default="", metavar="PEM",
                   help="talk TLS to the coordinator and trust this CA bundle (e.g. the "
                        "ca.crt of specdec certs or specdec up --tls); default: plaintext")
    g.add_argument("--tls-cert", default="", metavar="PEM",
                   help="a client certificate, for a coordinator started with "
                        "--api-tls-client-ca (with --tls-key)")
    g.add_argument("--tls-key", default="", metavar="PEM",
                   help="the private key of --tls-cert")
    g.add_argument("--tls-server-name", default="",
                   help="the name the coordinator's certificate must carry, when it is not "
                        "the host in --address")
    g.set_defaults(func=generate)

    u = sub.add_parser("up", help="start draft, target and coordinator on loopback",
                       description="Start the target and draft services and the coordinator "
                                   "(Ray Serve) on loopback, print their addresses, and stop "
                                   "all three on Ctrl-C.")
    add_stack_flags(u)
    u.add_argument("--verbose", action="store_true", help="show the services' logs")
    u.set_defaults(func=up)
