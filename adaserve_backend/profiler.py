"""Measure forward latency against the number of tokens in the batch, on the runner's device (on a GPU
every time waits for the device first: device.synchronize)."""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable

import torch
from tqdm import tqdm

from .cost_model.cost_model import CostModel
from .cost_model.roofline import fit_roofline, pick_budget
from .device import synchronize
from .model_runner import ModelRunner, SeqInput


def timed_ms(fn, repeats: int, device: torch.device | str = "cpu") -> float:
    """Median wall time of `fn` in ms, after one warm-up call, each waiting for the work `fn` queued on
    `device`."""
    fn()
    synchronize(device)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def tree_parents(n: int, rng: random.Random) -> list[int]:
    """A random branching token tree of n nodes (each node under one of the three before it)."""
    return [-1] + [rng.randrange(max(0, i - 3), i) for i in range(1, n)]


def measure_forward(
    runner: ModelRunner,
    sizes: list[int],
    per_seq: int,
    context: int = 128,
    repeats: int = 5,
    desc: str = "profiling",
) -> dict[int, float]:
    """Latency (ms) of one forward holding `n` new tokens for each n in `sizes`, spread over
    ceil(n / per_seq) sequences of `context` committed tokens: per_seq=1 is a decode batch, larger
    values are token trees of that size (verification, draft beam steps). Regions are rolled back after
    every forward, so each repetition sees the same cache."""
    rng = random.Random(0)
    vocab = runner.model.spec.vocab_size
    num_seqs = -(-max(sizes) // per_seq)
    base = 1 << 30  # sequence ids no engine uses

    def features(k: int) -> torch.Tensor | None:  # what a feature-conditioned draft reads; values do not matter
        return (torch.zeros(k, runner.model.spec.hidden_size, device=runner.device) if runner.model.takes_features
                else None)

    for s in range(num_seqs):
        # Its own blocks, taken as a scheduler would: an engine's runner writes only where they were reserved.
        runner.blocks.reserve(base + s, context + per_seq)
        runner.forward([SeqInput(base + s, [rng.randrange(vocab) for _ in range(context)], num_logits=0,
                                 features=features(context))])
        runner.commit_all(base + s)

    def batch(n: int) -> list[SeqInput]:
        sizes_ = [per_seq] * (n // per_seq) + ([n % per_seq] if n % per_seq else [])
        return [
            SeqInput(base + s, [rng.randrange(vocab) for _ in range(k)], tree_parents(k, rng), k, features(k))
            for s, k in enumerate(sizes_)
        ]

    def run(inputs: list[SeqInput]) -> None:
        runner.forward(inputs)
        for x in inputs:
            runner.commit(x.seq_id, [])

    out = {}
    for n in tqdm(sizes, desc=desc, leave=False):
        inputs = batch(n)
        out[n] = timed_ms(lambda: run(inputs), repeats, runner.device)
    for s in range(num_seqs):
        runner.free(base + s)
    return out


PROBE_TOKENS = (1, 16)


def probe_ms(runner: ModelRunner) -> dict[str, float]:
    """How fast the machine runs the target right now: the verification forwards the profile's
    roofline is made of (8-token trees over 128 cached tokens) at PROBE_TOKENS, in ms. About a second;
    CostModel.relative_speed compares it with the profile."""
    out = measure_forward(runner, list(PROBE_TOKENS), per_seq=8, repeats=7, desc="speed probe")
    return {str(n): ms for n, ms in out.items()}


CALIBRATION_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # up to a prefill chunk riding along a batch


def calibrate(target: ModelRunner, draft: ModelRunner | None, repeats: int = 3, max_slowdown: float = 1.3,
              pool: Callable[[dict, dict], tuple[dict, dict]] | None = None) -> CostModel:
    """This machine's cost model, measured now (what tools.profile writes, in fewer repeats: a few
    seconds): verification forwards (8-token trees over 128 cached tokens) and draft beam steps at
    CALIBRATION_TOKENS, their rooflines and the budget B at the target's knee. Every forward shape the
    first iterations take runs here once, so serving does not pay for first uses. `draft` None: the
    target drafts for itself. `pool`: the curves to fit, given this calibration's (calibration_pool.py:
    the medians over this machine's last few)."""
    def sizes(runner: ModelRunner, per_seq: int) -> list[int]:  # those the cache has room for
        room = runner.blocks.num_free_blocks // runner.blocks.blocks_for(128 + per_seq)
        return [n for n in CALIBRATION_TOKENS if -(-n // per_seq) <= room]

    draft = draft or target
    tv, td = sizes(target, 8), sizes(draft, 4)
    verify = measure_forward(target, tv, per_seq=8, repeats=repeats, desc="calibrating the target")
    steps = measure_forward(draft, td, per_seq=4, repeats=repeats, desc="calibrating the draft")
    if pool is not None:
        verify, steps = pool(verify, steps)
        tv, td = list(verify), list(steps)
    line, draft_line = fit_roofline(tv, [verify[n] for n in tv]), fit_roofline(td, [steps[n] for n in td])
    return CostModel(line, draft_line, pick_budget(line, max_slowdown), tuple(verify.items()), tuple(steps.items()))


class _Batch:
    """Requests of random prompts decoding in `engine`, kept alive for the measurement."""

    def __init__(self, engine, longest_context: int, seed: int) -> None:
        self.engine, self.rng, self.count = engine, random.Random(seed), 0
        self.vocab = engine.target.model.spec.vocab_size
        self.room = engine.max_model_len - longest_context  # output tokens no measurement outlives

    def add(self, tokens: int) -> str:
        """A request of `tokens` random prompt tokens that decodes as long as its context allows."""
        from .request import Request

        self.count += 1
        rid = f"profile-{self.count}"
        n = min(self.room, self.engine.max_model_len - tokens)
        self.engine.add_request(Request(rid, [self.rng.randrange(100, self.vocab) for _ in range(tokens)], max_tokens=n,
                                        min_tokens=n, ignore_eos=True))
        return rid

    def fill(self, n: int, context: int) -> None:
        """`n` requests of `context` tokens, all decoding."""
        for _ in range(n):
            self.add(context)
        sched = self.engine.scheduler
        while len(sched.running) < n or not all(s.decoding for s in sched.running):
            self.engine.step()

    def keep(self, n: int) -> None:
        for seq in self.engine.scheduler.running[n:]:
            self.engine.abort(seq.request.request_id)
        self.engine.step()

    def context(self) -> int:
        return sum(len(s.tokens) for s in self.engine.scheduler.running)

    def clear(self) -> None:
        self.keep(0)
        while self.engine.has_work():
            self.engine.step()


def measure_engine_steps(engine, batches: list[int], contexts: list[int], steps: int = 6,
                         prefills: tuple[int, ...] = (16, 128), seed: int = 0) -> list[dict]:
    """Whole engine steps (scheduling, forward, sampling, bookkeeping), timed as a served loop sees
    them: for each context length, max(batches) requests decode together, then fewer (the others
    aborted); at each batch size, `steps` decode steps (median) and, for each size in `prefills`, the
    step that prefills a new prompt of that many tokens beside the decodes (two sizes: what a prefilling
    request costs apart from its tokens). `engine` runs a non-speculative policy that prefills beside
    decodes, with room for max(batches) + 1 requests. Each point: decoding requests `n`, their cached
    `context` tokens summed, `new_tokens` in the forward, `prefills` (requests prefilling), `ms`."""
    batch, points = _Batch(engine, max(contexts), seed), []
    bar = tqdm(total=len(contexts) * len(batches), desc="engine steps", leave=False)
    for ctx in contexts:
        batch.fill(max(batches), ctx)
        for n in sorted(batches, reverse=True):
            batch.keep(n)
            context = batch.context()
            points.append({"n": n, "context": context, "new_tokens": n, "prefills": 0,
                           "ms": timed_ms(engine.step, steps, engine.device)})
            for prefill in prefills:
                times = []
                for _ in range(3):
                    rid = batch.add(prefill)
                    t = time.perf_counter()
                    engine.step()
                    times.append(time.perf_counter() - t)
                    engine.abort(rid)
                    engine.step()
                points.append({"n": n, "context": context, "new_tokens": n + prefill, "prefills": 1,
                               "ms": statistics.median(times) * 1e3})
            bar.update(1)
        batch.clear()
    bar.close()
    return points


def measure_speculative_steps(engine, batches: list[int], context: int, steps: int = 6, seed: int = 0) -> list[dict]:
    """Speculative engine steps as the engine itself splits them (IterationStats): `engine` runs a
    speculative policy (a fixed chain, `spec:N`); for each batch size, `steps` steps of requests of
    `context` tokens. Each point: n, depth, width, verified and prefill tokens, cached `context`,
    speculation and verification ms."""
    batch, points = _Batch(engine, context, seed), []
    for n in tqdm(sorted(batches, reverse=True), desc=f"speculative steps ({engine.policy.name})", leave=False):
        batch.fill(n, context)
        engine.step()  # the draft catches up with the prompt here
        engine.iteration_stats.clear()
        ctx = batch.context()
        for _ in range(steps):
            engine.step()
        points += [{"n": it.n, "depth": it.depth, "width": it.width, "verified": it.verified_tokens,
                    "prefill": it.prefill_tokens,
                    "context": ctx, "spec_ms": it.speculation * 1e3, "verify_ms": it.verification * 1e3}
                   for it in engine.iteration_stats if it.depth]
        batch.clear()
    return points

