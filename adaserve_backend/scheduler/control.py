"""Per-iteration knobs: AdaServe's adaptive depth and width (from load), and SLO-aware admission and
prefill pacing (from how far each request is ahead of its SLO): formulas, then the same over a request."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .deadlines import running_first_token_at, urgent_chunk

if TYPE_CHECKING:  # config builds a default SchedulerConfig at import, which loads the policies, which use this
    from ..config import SchedulerConfig, SpeculationConfig
    from ..sequence import Sequence
    from .estimator import Estimator


def clip(x: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, x))


def adaptive_depth_width(n: int, budget: int, cfg: SpeculationConfig) -> tuple[int, int]:
    """d = clip(floor(B1/(n+c1)) - 1, D_min, D_max), w = clip(floor(B2/n) + c2, 1, W_max)."""
    n = max(n, 1)
    d = clip(budget // (n + cfg.c1) - 1, cfg.d_min, cfg.d_max)
    w = clip(cfg.draft_budget // n + cfg.c2, 1, cfg.w_max)
    return d, w


def slo_slack_s(elapsed_s: float, t_iter_s: float, tpot_slo_s: float, decoded: int) -> float:
    """Time a decoding request can lose in this iteration and still be on its SLO after it, counting
    only on the one token verification always yields (elapsed: since its first token; decoded: tokens
    since then). Negative: behind schedule."""
    return tpot_slo_s * (decoded + 1) - elapsed_s - t_iter_s


def ends_within_slo(slack_s: float, tpot_slo_s: float, remaining: int, tpot_s: float) -> bool:
    """Whether a request `slack_s` ahead of its SLO (after this iteration) still ends within it when its
    `remaining` tokens after that come at `tpot_s` each."""
    return slack_s + remaining * (tpot_slo_s - tpot_s) >= 0


def paced_chunk(allowance_ms: float, extra_ms: Callable[[int], float], cap: int) -> int:
    """The largest prefill chunk c <= cap whose extra iteration time `extra_ms(c)` (non-decreasing)
    fits the allowance: prefill rides along decode only as far as the decoding requests' slack goes."""
    if allowance_ms < 0:
        return 0
    lo, hi = 0, cap
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if extra_ms(mid) <= allowance_ms:
            lo = mid
        else:
            hi = mid - 1
    return lo


def seq_slack_s(seq: Sequence, now: float, t_iter: float) -> float:
    """How far a decoding `seq` is ahead of its SLO after an iteration of `t_iter` yielding one token."""
    return slo_slack_s(now - seq.first_token_time, t_iter, seq.planned_tpot_s, len(seq.output) - 1)


def seq_ends_within_slo(seq: Sequence, slack: float, tpot: float) -> bool:
    return ends_within_slo(slack, seq.planned_tpot_s, seq.remaining, tpot)


def on_track(seq: Sequence, now: float, tpot: float) -> bool:
    """Whether `seq` ends within its SLO if each of its remaining tokens takes `tpot`."""
    if seq.first_token_time is None:
        return tpot <= seq.planned_tpot_s
    return seq_ends_within_slo(seq, seq_slack_s(seq, now, tpot), tpot)


def keeps_slos(seq: Sequence, running: list[Sequence], est, config: SchedulerConfig, now: float) -> bool:
    """Whether, with `seq` running too (beside `running`), every running request that can still make its
    SLO (at the time per token of a lone request) is on track for it, and so is `seq` unless it cannot be (its
    TPOT target is below a lone request's, or its first-token deadline is already given up: holding
    it back would make it wait for nothing). One that fell behind blocks admissions until it has
    caught up: letting others in because it is behind anyway would make it, and those after it, miss.
    One too far behind to catch up still keeps its pace: no admission slows the batch below its
    target rate (without this, a few late requests let the batch grow until every TPOT collapsed;
    evidence: docs/experiments.md#admission-late). The time per token after admitting counts what
    arriving requests' prefill chunks add to decode iterations: under load most iterations carry
    one, and predicting decode alone lets the batch grow until the chunks push it to the tightest
    class's target (evidence: docs/experiments.md#vllm-lazy-draft).
    A request whose target even one companion breaks holds admissions for config.exclusive_hold_s at
    most: after that it no longer does (bounded starvation; its own target may then be missed)."""
    best = est.tpot_at(1)
    after = est.tpot_at(len(running) + 1) * est.ride_along * config.admission_headroom
    if not (on_track(seq, now, after) or seq.slo_missed or not on_track(seq, now, best)):
        return False
    pair = est.tpot_at(2) * est.ride_along * config.admission_headroom

    def held_too_long(s: Sequence) -> bool:
        return s.planned_tpot_s < pair and now - (s.admitted_time or now) >= config.exclusive_hold_s

    return all(on_track(s, now, after) or (not on_track(s, now, best) and (s.planned_tpot_s < best or after <= s.planned_tpot_s))
               for s in running if not held_too_long(s))


def best_effort_victim(seq: Sequence, running: list[Sequence]) -> Sequence | None:
    """The running best-effort request (no targets) that `seq`, which has targets, displaces when it
    does not fit: the newest, which has the least work to redo. None if there is none to displace."""
    victims = [s for s in running if s.slo.best_effort]
    return max(victims, key=lambda s: s.arrival) if victims and not seq.slo.best_effort else None


def split_chunks(prefill: list[Sequence], cap: int) -> dict[Sequence, int]:
    """Up to `cap` prefill tokens, to the requests in order, each as far as its prompt goes."""
    chunks: dict[Sequence, int] = {}
    for seq in prefill:
        n = min(seq.prefill_goal - seq.prefilled, cap)
        if n <= 0:
            break
        chunks[seq] = n
        cap -= n
    return chunks


def prefill_budget(prefill: list[Sequence], decode: list[Sequence], depth: int, width: int, now: float,
                   est: Estimator, full: int, spare_decodes: bool = False) -> int:
    """SLO-aware prefill's tokens this iteration: the chunk paced by the decoding requests' slack
    (paced_prefill) but never below what the first-token deadlines need (urgent_chunk); with
    `spare_decodes`, that floor only as far as no decoding request is pushed past its target
    (spared_prefill). With none decoding, `full`. First tokens take it in deadline order (edf_key)."""
    if not decode:
        return full
    t_iter = est.prefill_iteration_s(len(decode), full)
    urgent = min(urgent_chunk(prefill, now, t_iter), full)
    if spare_decodes:
        urgent = min(urgent, spared_prefill(decode, depth, width, now, est, full))
    return max(paced_prefill(decode, depth, width, now, est, full), urgent)


def predict_first_tokens(started: list[Sequence], n_decode: int, prefilling: list[Sequence], now: float,
                         est: Estimator, chunk: int) -> None:
    """Each starting request's first token as expected now (Sequence.predicted_first_token), those
    admitted after it in the same step sharing its last chunk, every iteration carrying `chunk` prefill
    tokens: the step's budget, not the cap, since beside decodes pacing gives a prompt fewer and pricing
    them at the cap put long prompts' first tokens early (docs/experiments.md#ttft-prediction)."""
    for seq in [s for s in started if s.first_token_time is None]:
        seq.predicted_first_token = running_first_token_at(est, seq, now, n_decode, prefilling, chunk)


def paced_prefill(decode: list[Sequence], depth: int, width: int, now: float, est: Estimator, cap: int,
                  catch_up: bool = False) -> int:
    """The chunk the least slack among decoding requests that can still make their SLOs pays for.
    With `catch_up` (spared_prefill), each request's slack plus what its remaining tokens win back at
    this load's time per token."""
    n = len(decode)
    t_iter, best, tpot = est.iteration_s(n, depth, width), est.tpot_at(1), est.tpot_at(n) if catch_up else 0.0
    allowances = []
    for s in decode:
        slack = seq_slack_s(s, now, t_iter)
        if seq_ends_within_slo(s, slack, best):
            allowances.append(slack + (max(s.remaining, 0) * (s.planned_tpot_s - tpot) if catch_up else 0.0))
    if not allowances:
        return cap
    return paced_chunk(min(allowances) * 1e3, lambda chunk: est.chunk_extra_ms(n, depth, chunk), cap)


def spared_prefill(decode: list[Sequence], depth: int, width: int, now: float, est: Estimator, cap: int) -> int:
    """The largest chunk after which every decoding request that can still make its SLO still ends
    within it at this load's time per token: a first token may take a decoding request's slack and
    what its remaining tokens win back, not more. Otherwise a burst's prompts stall a request with few
    tokens left for a few hundred ms, and it ends far over its target (one late first token is
    traded for several missed TPOTs)."""
    return paced_prefill(decode, depth, width, now, est, cap, catch_up=True)
