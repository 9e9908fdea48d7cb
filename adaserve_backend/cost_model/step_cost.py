"""What one whole engine step costs on a device, as `tools.profile` measures it: a linear fit over the
decoding requests, the context they read and the new tokens beyond one per request.

Why beside the rooflines: those are fitted to forwards of 8-token trees over 128-token contexts, which
is what selection and B need. Under load a CPU step is something else, mostly decode over long
contexts plus the engine's own per-request work (scheduling, sampling, bookkeeping), which the
rooflines do not see: they price a loaded step at a fraction of what it takes (evidence:
docs/scheduling.md#the-cost-model-and-its-calibration). The serving
simulator prices its CPU iterations with this fit; the engine itself keeps the rooflines and corrects
them with what it measures (scheduler/prefill_estimator.py).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass

PROFILE_KEY = "engine_step"


@dataclass(frozen=True)
class EngineStepCost:
    base_ms: float  # a step's fixed cost (the weights read once, the loop's own work)
    per_request_ms: float  # each decoding request
    per_1k_context_ms: float  # each 1000 cached tokens the decoding requests read
    per_extra_token_ms: float  # each new token beyond one per decoding request (prefill chunks, trees)
    # each request prefilling in the step, whatever its chunk: its own attention call per layer, the
    # gathers for it, its first token's sampling; priced per token alone, a small chunk looks far
    # cheaper than it is (evidence: docs/scheduling.md#the-cost-model-and-its-calibration)
    per_prefill_ms: float = 0.0
    # Speculating steps, beyond the draft's forwards (its roofline) and the tokens verified:
    spec_base_ms: float = 0.0  # a speculating step's own work
    spec_per_level_ms: float = 0.0  # each draft level (beam bookkeeping, the next level's inputs)
    tree_per_request_ms: float = 0.0  # verifying a request's tree rather than one token
    # Fitted from served iterations (from_iterations, draft_fitted): the draft's forwards priced here,
    # a step of t tokens at spec_per_level_ms + t * draft_per_token_ms, instead of by the draft's
    # roofline from a profile taken elsewhere: the draft's small forwards move apart from the target's
    # between machines (evidence: docs/simulator.md#what-it-validates-against).
    draft_per_token_ms: float = 0.0
    draft_fitted: bool = False

    def ms(self, num_decode: int, context_tokens: int, new_tokens: int, trees: int = 0, prefills: int = 0) -> float:
        """The step without its speculation; `trees`: decoding requests whose drafts are verified;
        `prefills`: requests with a prefill chunk in it."""
        return (self.base_ms + self.per_request_ms * num_decode + self.per_1k_context_ms * context_tokens / 1e3
                + self.per_extra_token_ms * max(new_tokens - num_decode, 0) + self.tree_per_request_ms * trees
                + self.per_prefill_ms * prefills)

    def speculation_ms(self, draft_forward_ms: float, depth: int, draft_tokens: int = 0) -> float:
        """A step's speculation: `draft_forward_ms` (the draft's forwards as its roofline prices them)
        or, where this fit prices the draft itself, its steps over `draft_tokens` (the tokens they
        read: the chains, then each later level's beams); plus a speculating step's own work."""
        if self.draft_fitted:
            steps = max(depth, 1 if draft_tokens else 0)
            draft_forward_ms = self.spec_per_level_ms * steps + self.draft_per_token_ms * draft_tokens
            return draft_forward_ms + (self.spec_base_ms if depth else 0.0)
        return draft_forward_ms + (self.spec_base_ms + self.spec_per_level_ms * depth if depth else 0.0)

    def draft_step_ms(self, tokens: int) -> float | None:
        """One draft step over `tokens`, where this fit prices the draft (else None: its roofline does)."""
        return self.spec_per_level_ms + self.draft_per_token_ms * tokens if self.draft_fitted else None

    @classmethod
    def fit(cls, points: list[dict]) -> EngineStepCost:
        """Least squares over non-speculative points {n, context, new_tokens, ms, prefills (default 0)}."""
        rows = [[1.0, p["n"], p["context"] / 1e3, max(p["new_tokens"] - p["n"], 0),
                 p.get("prefills", 0)] for p in points]
        return cls(*non_negative_least_squares(rows, [p["ms"] for p in points]))

    def with_speculation(self, points: list[dict]) -> EngineStepCost:
        """The speculative terms from points {n, depth, width, verified, prefill, context, spec_ms,
        verify_ms, draft_ms} (adaserve_backend.profiler.measure_speculative_steps, or a served run's iterations):
        what speculation took beyond `draft_ms` (its draft forwards as the draft's roofline prices them),
        and what verification took beyond this fit's price of the same tokens."""
        base, per_level = non_negative_least_squares([[1.0, p["depth"]] for p in points],
                                                     [p["spec_ms"] - p["draft_ms"] for p in points])
        return dataclasses.replace(self, spec_base_ms=base, spec_per_level_ms=per_level,
                                   tree_per_request_ms=self._tree_term(points))

    def _tree_term(self, points: list[dict]) -> float:
        """What verifying a request's tree took beyond this fit's price of the same tokens, per request,
        from speculating points {n, verified, prefill, context, verify_ms}."""
        def beyond(p: dict) -> float:
            prefills = p.get("prefills", int(p["prefill"] > 0))
            return p["verify_ms"] - self.ms(p["n"], p["context"], p["verified"] + p["prefill"], prefills=prefills)

        (tree,) = non_negative_least_squares([[p["n"]] for p in points], [beyond(p) for p in points])
        return tree

    @classmethod
    def from_iterations(cls, records: list[dict], fallback: EngineStepCost | None = None,
                        min_speculative: int = 20) -> EngineStepCost:
        """The fit from a served run's own iterations (`iteration_record`s, each step's time divided by the run's
        speed if known) instead of tools.profile's synthetic sweep: under a benchmark's load, steps take longer than
        the sweep's fit at the same machine speed (mixed contexts, churned pages, SLO bookkeeping), and on another
        machine the cost's shape moves, not only its scale, even where the speed probe matches the profile
        (evidence: docs/simulator.md#what-it-validates-against). The speculative terms come from the speculating
        steps when there are at least `min_speculative`, the draft's forwards included (draft_per_token_ms: a step
        per level, over the tokens the first step read, then over each later level's beams); else from `fallback`
        (the profile's, the draft then priced by its roofline)."""
        timed = [r for r in records if r["step_ms"] > 0]
        fit = cls.fit([{"n": r["n"], "context": r["context"], "new_tokens": r["verified"] + r["prefill"],
                        "prefills": r["prefills"], "ms": r["step_ms"]} for r in timed if not r["depth"]])
        speculative = [r for r in timed if r["depth"]]
        if len(speculative) >= min_speculative:
            base, per_level, per_token = non_negative_least_squares(
                [[1.0, r["depth"], drafted_tokens(r["chain"], r["depth"], r["n"] * r["width"])] for r in speculative],
                [r["spec_ms"] for r in speculative])
            # the step beyond the draft's part, so both fits price whole steps
            tree = fit._tree_term([{**r, "verify_ms": r["step_ms"] - r["spec_ms"]} for r in speculative])
            return dataclasses.replace(fit, spec_base_ms=base, spec_per_level_ms=per_level, tree_per_request_ms=tree,
                                       draft_per_token_ms=per_token, draft_fitted=True)
        keep = ("spec_base_ms", "spec_per_level_ms", "tree_per_request_ms")
        return dataclasses.replace(fit, **{k: getattr(fallback, k) for k in keep}) if fallback else fit

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> EngineStepCost:
        """The fit from to_dict's keys, ignoring others (the points stored beside it); a profile taken
        before the speculative terms leaves them at 0."""
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})

    @classmethod
    def from_profile(cls, path: str) -> EngineStepCost | None:
        """The fit stored in a profile JSON, or None for a profile taken without it."""
        with open(path) as f:
            data = json.load(f).get(PROFILE_KEY)
        return cls.from_dict(data) if data else None


def non_negative_least_squares(rows: list[list[float]], y: list[float]) -> list[float]:
    """Least squares with every coefficient >= 0: any the plain fit makes negative is dropped (set to
    0) and the rest refitted. Why: a negative cost is noise, and would price some step below nothing."""
    import numpy as np

    x, target = np.array(rows, dtype=float), np.array(y, dtype=float)
    free = list(range(x.shape[1]))
    while True:
        coef = np.zeros(x.shape[1])
        if free:
            coef[free] = np.linalg.lstsq(x[:, free], target, rcond=None)[0]
        negative = [i for i in free if coef[i] < 0]
        if not negative:
            return [float(c) for c in coef]
        free.remove(negative[0])


def drafted_tokens(chain: int, depth: int, beams: int) -> int:
    """The tokens an iteration's draft steps read: its `chain` tokens in the first, then each later
    level's `beams` (w per drafting request)."""
    return chain + max(depth - 1, 0) * beams


def iteration_record(stats) -> dict:
    """One served iteration (scheduler.plan.IterationStats) as from_iterations reads it, times in ms, with
    what it produced (tokens, bonus included; drafts accepted) for comparing the simulator's yield."""
    return {"n": stats.n, "depth": stats.depth, "width": stats.width, "verified": stats.verified_tokens,
            "prefill": stats.prefill_tokens, "prefills": stats.prefills, "context": stats.context_tokens,
            "chain": stats.draft_chain_tokens, "spec_ms": 1e3 * (stats.speculation + stats.selection),
            "step_ms": 1e3 * stats.step,
            "accepted": stats.accepted, "drafts": sum(stats.accepted_drafts)}
