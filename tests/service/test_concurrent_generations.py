"""Concurrent generations share forward passes (continuous batching) and stay exact.

Real draft and target services on loopback (tiny models; torch, and OpenVINO with the
paged KV layout on the exported tiny IR), the coordinator's GenerationService in front,
no mocks. The services run in this process, so the tests watch the target's scheduler
(its on_pass callback) to be sure the passes really held several sessions.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import grpc
import pytest

from coordinator.deploy.config import CoordinatorConfig
from coordinator.deploy.setup import build_service
from coordinator.loop import SpeculativeLoop
from coordinator.loop.policy import LoopPolicy
from draft_service.__main__ import create as create_draft
from draft_service.config import DraftConfig
from specdec import digest
from specdec.runtime.batching import Pass
from specdec.sampling import SamplingParams
from specdec.v1 import common_pb2, generate_pb2, target_pb2_grpc
from target_service.__main__ import create as create_target
from target_service.config import TargetConfig
from tests.service import test_sampled_distribution as sampled_distribution
from tests.service.conftest import verify_req

PROMPTS = [[1, 2, 3, 4, 5], [700, 12, 99], [42], [31, 415, 92, 65], [7] * 11,
           [300, 200, 100, 50, 25, 12, 6]]
NEW_TOKENS = 24
N = len(PROMPTS)  # concurrent generations


# -- services ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ov_services(tmp_path_factory):
    """OpenVINO draft and target (paged KV) in this process, on IRs exported from the
    tiny models into a private SPECDEC_HOME."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECDEC_HOME", str(tmp_path_factory.mktemp("specdec-home")))
        made = []
        for create, cfg in ((create_draft, DraftConfig(model="tiny-random-draft",
                                                        backend="openvino", port=0)),
                            (create_target, TargetConfig(model="tiny-random",
                                                         backend="openvino", port=0))):
            server, port, engine = create(cfg)
            server.start()
            made.append((server, f"127.0.0.1:{port}", engine))
        assert all(e.model.backend.kv_layout == "paged" for _, _, e in made)
        yield [(address, engine) for _, address, engine in made]
        for server, _, engine in made:
            server.stop(0)
            engine.model.close()


@pytest.fixture(scope="module", params=["torch", "openvino-paged"])
def services(request):
    """((draft address, engine), (target address, engine)) for one backend."""
    if request.param == "torch":
        return request.getfixturevalue("draft_server"), request.getfixturevalue("target_server")
    return tuple(request.getfixturevalue("ov_services"))


@pytest.fixture(scope="module")
def generation_service(services):
    """The coordinator's GenerationService with its defaults (pipelined, K = 4)."""
    (draft_address, _), (target_address, _) = services
    service = build_service(CoordinatorConfig(draft=draft_address, target=target_address))
    assert service.loop.policy.pipeline and service.limits.default_k == 4
    return service


@contextmanager
def watched(engine):
    """Every pass the engine's scheduler runs meanwhile, as Pass records."""
    sched = engine.model.scheduler
    passes: list[Pass] = []
    inner = sched.on_pass

    def on_pass(done: Pass) -> None:
        passes.append(done)
        inner(done)

    sched.on_pass = on_pass
    try:
        yield passes
    finally:
        sched.on_pass = inner


def run_concurrently(fn, jobs: list) -> list:
    """fn(job) for every job, all at once, one thread each; results in job order."""
    with ThreadPoolExecutor(len(jobs)) as pool:
        return list(pool.map(fn, jobs, timeout=120))


# -- greedy: concurrent equals alone equals target-only ------------------------------------


def generate(service, prompt: list[int], k: int | None) -> list[int]:
    """Greedy output of one GenerateRequest; k None leaves K to the coordinator."""
    req = generate_pb2.GenerateRequest(prompt_token_ids=prompt, max_new_tokens=NEW_TOKENS)
    if k is not None:
        req.num_draft_tokens = k
    resp = service.generate(req)
    assert len(resp.token_ids) == NEW_TOKENS or resp.finish_reason == "eos"
    if k:  # K pinned by the request: the rounds drafted
        assert resp.stats.drafted_tokens > 0
    if k == 0:
        assert resp.stats.drafted_tokens == 0
    pipelined[k] = pipelined.get(k, 0) + resp.stats.pipelined_rounds
    return list(resp.token_ids)


pipelined: dict[int | None, int] = {}  # pre-drafted rounds per K, over all generations
MODES = (4, None, 0)  # K = 4 pinned, K left to the coordinator, target-only


def test_concurrent_greedy_generations_equal_alone_and_target_only(services,
                                                                   generation_service):
    (_, draft), (_, target) = services
    target_only = [generate(generation_service, p, 0) for p in PROMPTS]
    assert len({tuple(a) for a in target_only}) == N  # different prompts, different outputs
    for k in MODES[:2]:  # one generation at a time
        assert [generate(generation_service, p, k) for p in PROMPTS] == target_only, k

    for k in MODES:  # N at a time
        pipelined.clear()
        with watched(target) as target_passes, watched(draft) as draft_passes:
            got = run_concurrently(lambda p, k=k: generate(generation_service, p, k), PROMPTS)
        for prompt, out, want in zip(PROMPTS, got, target_only, strict=True):
            assert out == want, (k, prompt)
        widest = max(p.sessions for p in target_passes)
        print(f"K={k}: {len(target_passes)} target passes, widest {widest} sessions; "
              f"draft widest {max((p.sessions for p in draft_passes), default=0)}; "
              f"pre-drafted rounds {pipelined[k]}")
        assert widest >= 2, "the target never ran two generations' steps in one pass"
        if k:
            assert draft_passes and pipelined[k] > 0  # the pipelined loop ran
    assert len(target.model.store) == 0 and len(draft.model.store) == 0  # all released


# -- a bad request in a batch fails alone ----------------------------------------------------


ROUNDS = 12


def greedy_rounds(stub, session: str, prompt: list[int]) -> list[int]:
    """Target-only greedy decoding by raw Verify calls (K = 0): feed the prompt, then
    each round's bonus token; returns the tokens."""
    held, out = [], []
    new = list(prompt)
    for _ in range(ROUNDS):
        resp = stub.Verify(verify_req(session, new, keep_len=len(held), prefix=held),
                           timeout=30)
        held += new
        assert resp.cached_len == len(held)
        out.append(resp.bonus_token)
        new = [resp.bonus_token]
    stub.Release(common_pb2.ReleaseRequest(session_id=session), timeout=30)
    return out


def rpc_code(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code()


def test_bad_requests_among_concurrent_good_ones_fail_alone(target_server, target_channel):
    """While eight good greedy generations run their Verify rounds together, another
    thread keeps sending bad ones: token ids outside the vocabulary, no token before
    the drafts (both refused before they reach the scheduler), a keep_digest that does
    not match and a keep_len beyond what the session holds (refused at check-out), a
    call cancelled at once and one past its deadline (these reach the server and, when
    they do, share passes with the good ones). Each bad one gets its own status, every
    good generation is exact, and the session the bad ones aimed at is unharmed."""
    _, engine = target_server
    vocab = engine.model.vocab_size
    stub = target_pb2_grpc.TargetServiceStub(target_channel)
    good_prompts = PROMPTS[:4]
    expected = [greedy_rounds(stub, f"alone-{i}", p) for i, p in enumerate(good_prompts)]

    # A session the bad requests aim at: it holds [5, 6, 7].
    victim = f"victim-{uuid.uuid4().hex}"
    base = stub.Verify(verify_req(victim, [5, 6, 7]), timeout=30)
    late = f"late-{uuid.uuid4().hex}"  # one session, so none pile up if one does run
    stop = threading.Event()
    codes: Counter = Counter()
    failures: list[BaseException] = []

    def bad_requests():
        try:
            send_bad_requests()
        except BaseException as exc:  # noqa: BLE001 - re-raised by the test below
            failures.append(exc)

    def send_bad_requests():
        bad = [
            (verify_req(f"oov-{uuid.uuid4().hex}", [1, vocab + 3]),
             grpc.StatusCode.INVALID_ARGUMENT),
            (verify_req(victim, [8], keep_len=3, keep_digest=digest.digest([9, 9, 9])),
             grpc.StatusCode.FAILED_PRECONDITION),
            (verify_req(victim, [8], keep_len=40, prefix=list(range(40))),
             grpc.StatusCode.FAILED_PRECONDITION),  # beyond what it holds
            (verify_req(f"k-{uuid.uuid4().hex}", [1, 2], num_draft=2),
             grpc.StatusCode.INVALID_ARGUMENT),  # no token before the drafts
        ]
        while not stop.is_set():
            for req, want in bad:
                got = rpc_code(lambda r=req: stub.Verify(r, timeout=30))
                assert got == want, (req, got)
                codes[want] += 1
            # Called off at once: CANCELLED on the client, whatever the server had done.
            future = stub.Verify.future(verify_req(victim, [8, 9], keep_len=3,
                                                   prefix=[5, 6, 7]), timeout=30)
            future.cancel()
            assert future.cancelled() or future.exception() is None
            codes["cancelled"] += future.cancelled()
            # Out of time before it could run (almost always; a reply is fine too), or
            # ABORTED: the last one still holds the session on the server.
            try:
                stub.Verify(verify_req(late, list(range(1, 40))), timeout=0.0005)
            except grpc.RpcError as e:
                assert e.code() in (grpc.StatusCode.DEADLINE_EXCEEDED,
                                    grpc.StatusCode.ABORTED), e
                codes[e.code()] += 1

    with watched(engine) as passes:
        bad_thread = threading.Thread(target=bad_requests, daemon=True)
        bad_thread.start()
        try:
            got = run_concurrently(
                lambda job: greedy_rounds(stub, f"good-{job[0]}-{uuid.uuid4().hex}", job[1]),
                list(enumerate(good_prompts)) * 2)
        finally:
            stop.set()
            bad_thread.join(30)
    assert not bad_thread.is_alive()
    if failures:
        raise failures[0]
    assert got == expected * 2  # every good generation is exact
    assert codes[grpc.StatusCode.INVALID_ARGUMENT] >= 2
    assert codes[grpc.StatusCode.FAILED_PRECONDITION] >= 2
    assert codes["cancelled"] >= 1
    print(f"bad requests: {dict(codes)}; widest pass {max(p.sessions for p in passes)}")
    assert max(p.sessions for p in passes) >= 2

    # The victim session survived every bad and called-off request: it still holds its
    # first three tokens, and the service answers as before.
    again = stub.Verify(verify_req(victim, [8], keep_len=3, prefix=[5, 6, 7]), timeout=30)
    fresh_session = f"fresh-{uuid.uuid4().hex}"
    fresh = stub.Verify(verify_req(fresh_session, [5, 6, 7, 8]), timeout=30)
    assert again.cached_len == 4
    assert again.bonus_token == fresh.bonus_token
    assert base.cached_len == 3
    for session in (victim, late, fresh_session):
        stub.Release(common_pb2.ReleaseRequest(session_id=session), timeout=30)
    assert greedy_rounds(stub, "after", good_prompts[0]) == expected[0]


# -- sampled output under concurrency follows the target's distribution ---------------------


SAMPLED_PROMPTS = [[31, 415, 92, 65], [700, 12, 99]]
THREADS_PER_PROMPT = 3
TRIALS = 750  # per prompt
PARAMS = SamplingParams(temperature=1.0, top_k=6)


def joint(backend, prompt: list[int], params: SamplingParams) -> dict:
    """Exact P(t1, t2 | prompt) under `backend` (test_sampled_distribution's target_joint)."""
    return sampled_distribution.target_joint(backend, params, prompt=prompt)


def p_value_against(counts: Counter, law: dict) -> float:
    """Goodness of fit of `counts` to `law`, also when the counts hold pairs the law
    gives probability 0 (they then weigh as if all but impossible)."""
    padded = {**{cell: 1e-12 for cell in counts}, **law}
    return sampled_distribution.chi_square_p_value(counts, padded, sum(counts.values()))


@pytest.mark.slow
def test_sampled_output_of_concurrent_generations_follows_the_target(
        draft_client, target_client, draft_server, target_server):
    """Six generations at a time (two prompts, three threads each, every generation its
    own seed), pipelined, K = 2: the first two tokens of each prompt follow the target's
    exact joint law given that prompt. The check has power on these very samples: each
    prompt's counts are far from the other prompt's law (what rows swapped between the
    sessions of a pass would give) and from the draft's law."""
    loop = SpeculativeLoop(draft_client, target_client, LoopPolicy())
    jobs = [(i, t) for i in range(len(SAMPLED_PROMPTS)) for t in range(THREADS_PER_PROMPT)]
    per_thread = TRIALS // THREADS_PER_PROMPT

    def worker(job):
        i, t = job
        counts: Counter = Counter()
        accepted = drafted = 0
        for n in range(per_thread):
            seed = 1_000_003 * i + per_thread * t + n
            trial = SamplingParams(PARAMS.temperature, PARAMS.top_k, PARAMS.top_p, seed)
            result = loop.generate(SAMPLED_PROMPTS[i], 4, trial, num_draft_tokens=2)
            counts[tuple(result.token_ids[:2])] += 1
            accepted += result.stats.accepted_tokens
            drafted += result.stats.drafted_tokens
        return i, counts, accepted, drafted

    with watched(target_server[1]) as passes:
        results = run_concurrently(worker, jobs)
    assert max(p.sessions for p in passes) >= 2
    laws = [joint(target_server[1].model.backend, p, PARAMS) for p in SAMPLED_PROMPTS]
    for i, prompt in enumerate(SAMPLED_PROMPTS):
        counts = sum((c for j, c, _, _ in results if j == i), Counter())
        accepted = sum(a for j, _, a, _ in results if j == i)
        drafted = sum(d for j, _, _, d in results if j == i)
        assert sum(counts.values()) == TRIALS
        assert 0 < accepted < drafted  # both accept and reject paths ran
        p_value = sampled_distribution.chi_square_p_value(counts, laws[i], TRIALS)
        other = p_value_against(counts, laws[1 - i])
        draft = p_value_against(counts, joint(draft_server[1].model.backend, prompt, PARAMS))
        print(f"prompt {i}: p = {p_value:.3f} (against the other prompt's law {other:.1e}, "
              f"the draft's {draft:.1e}), acceptance = {accepted / drafted:.2f}")
        assert p_value > 1e-3, (p_value, counts.most_common(8))
        assert other < 1e-6 and draft < 1e-6, (other, draft)
