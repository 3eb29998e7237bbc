"""The services started as documented, driven by a client built from the .proto files only."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap

import pytest
from grpc_tools import protoc

from tests.procs import ROOT, start_service

pytestmark = pytest.mark.slow

CLIENT = textwrap.dedent('''
    import hashlib, json, sys
    sys.path = [p for p in sys.path if p not in ("", {root!r})]
    sys.path.insert(0, {gen!r})
    import grpc
    from specdec.v1 import common_pb2, draft_pb2, draft_pb2_grpc, target_pb2, target_pb2_grpc
    assert draft_pb2.__file__.startswith({gen!r}), draft_pb2.__file__

    def digest(tokens):  # docs/design.md's rolling digest, from its text alone
        d = 0
        for t in tokens:
            data = d.to_bytes(8, "little") + t.to_bytes(4, "little")
            d = int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")
        return d

    draft = draft_pb2_grpc.DraftServiceStub(grpc.insecure_channel(sys.argv[1]))
    target = target_pb2_grpc.TargetServiceStub(grpc.insecure_channel(sys.argv[2]))
    d_info = draft.Info(common_pb2.InfoRequest(), timeout=10)
    t_info = target.Info(common_pb2.InfoRequest(), timeout=10)
    committed, out = [3, 14, 15, 92], []
    draft_view, target_view = [], []
    for _ in range(4):
        def plan(view):
            keep = 0
            while keep < min(len(view), len(committed) - 1) and view[keep] == committed[keep]:
                keep += 1
            return keep, digest(committed[:keep]), committed[keep:]
        keep, dig, new = plan(draft_view)
        p = draft.Propose(draft_pb2.ProposeRequest(session_id="s1", keep_len=keep,
            keep_digest=dig, new_tokens=new, num_tokens=4), timeout=10)
        draft_view = committed + list(p.tokens[:-1])
        keep, dig, new = plan(target_view)
        v = target.Verify(target_pb2.VerifyRequest(session_id="s1", keep_len=keep,
            keep_digest=dig, new_tokens=new + list(p.tokens), num_draft=4), timeout=10)
        target_view = committed + list(p.tokens)
        n = next((i for i, q in enumerate(v.target_probs) if q < 1.0), 4)
        emitted = list(p.tokens[:n]) + [v.recovered_tokens[n] if n < 4 else v.bonus_token]
        committed += emitted
        out += emitted
    print(json.dumps(dict(draft_vocab=d_info.vocab_size, target_vocab=t_info.vocab_size,
                          same_tokenizer=d_info.tokenizer_digest == t_info.tokenizer_digest,
                          backend=t_info.backend, tokens=out)))
''')


@pytest.fixture(scope="module")
def services():
    draft = start_service("draft_service", "--model", "tiny-random-draft")
    target = start_service("target_service", "--model", "tiny-random")
    yield draft, target
    draft.stop()
    target.stop()


def test_proto_only_client_drives_both_services(services, tmp_path):
    draft, target = services
    protos = sorted(str(p.relative_to(ROOT / "protos")) for p in (ROOT / "protos").rglob("*.proto"))
    rc = protoc.main(["protoc", f"-I{ROOT / 'protos'}", f"--python_out={tmp_path}",
                      f"--grpc_python_out={tmp_path}", *protos])
    assert rc == 0
    script = CLIENT.format(root=str(ROOT), gen=str(tmp_path))
    run = subprocess.run([sys.executable, "-c", script, draft.address, target.address],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["draft_vocab"] == result["target_vocab"] == 768
    assert result["same_tokenizer"] and result["backend"] == "torch"
    assert len(result["tokens"]) >= 4

    # The same greedy tokens as plain target-only decoding, computed in-process.
    from specdec.runtime.models import load
    from specdec.runtime.torch_backend import TorchBackend

    backend = TorchBackend(load("tiny-random"))
    cache, ids = backend.new_cache(), [3, 14, 15, 92]
    logits = backend.forward(cache, ids)[0]
    expected = []
    for _ in range(len(result["tokens"])):
        expected.append(int(logits.argmax()))
        logits = backend.forward(cache, expected[-1:])[0]
    assert result["tokens"] == expected


def test_start_up_log_and_graceful_sigterm():
    svc = start_service("target_service", "--model", "tiny-random", "--grace", "1")
    line = next(ln for ln in svc.log if "service ready" in ln)
    for part in ("model=tiny-random", "backend=torch", "device=cpu", "address=127.0.0.1:"):
        assert part in line
    assert svc.stop(signal.SIGTERM) == 0
    assert "NOT_SERVING" in svc.output


def test_bad_model_is_a_clear_start_up_error():
    run = subprocess.run([sys.executable, "-m", "draft_service", "--model", "/no/such/folder",
                          "--port", "0"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode != 0
    assert "cannot start the draft service" in run.stderr
    assert "neither a built-in name" in run.stderr
    assert "Traceback" not in run.stderr
