"""How far a decoding request is ahead of its TPOT target: the slack an iteration may spend, and
whether the request still ends within its target at a given time per token. Admission
(admission.py), prefill pacing (prefill_pacing.py) and the SLO-customized selection all ask this."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..sequence import Sequence


def slo_slack_s(elapsed_s: float, t_iter_s: float, tpot_slo_s: float, decoded: int) -> float:
    """Time a decoding request can lose in this iteration and still be on its SLO after it, counting
    only on the one token verification always yields (elapsed: since its first token; decoded: tokens
    since then). Negative: behind schedule."""
    return tpot_slo_s * (decoded + 1) - elapsed_s - t_iter_s


def ends_within_slo(slack_s: float, tpot_slo_s: float, remaining: int, tpot_s: float) -> bool:
    """Whether a request `slack_s` ahead of its SLO (after this iteration) still ends within it when its
    `remaining` tokens after that come at `tpot_s` each."""
    return slack_s + remaining * (tpot_slo_s - tpot_s) >= 0


def seq_slack_s(seq: Sequence, now: float, t_iter: float) -> float:
    """How far a decoding `seq` is ahead of its SLO after an iteration of `t_iter` yielding one token."""
    return slo_slack_s(now - seq.first_token_time, t_iter, seq.planned_tpot_s, len(seq.output) - 1)


def planned_remaining(seq: Sequence, tpot: float) -> int:
    """The remaining tokens to plan `seq` with at `tpot` per token: the pessimistic end of its predicted
    range (output_lengths.py), the long end when each token loses time against its target, the short
    end when each wins some back; its cap without a prediction."""
    if seq.remaining_range is None:
        return seq.remaining
    short, long = seq.remaining_range
    return long if tpot > seq.planned_tpot_s else short


def seq_ends_within_slo(seq: Sequence, slack: float, tpot: float) -> bool:
    return ends_within_slo(slack, seq.planned_tpot_s, planned_remaining(seq, tpot), tpot)


def on_track(seq: Sequence, now: float, tpot: float) -> bool:
    """Whether `seq` ends within its SLO if each of its remaining tokens takes `tpot`."""
    if seq.first_token_time is None:
        return tpot <= seq.planned_tpot_s
    return seq_ends_within_slo(seq, seq_slack_s(seq, now, tpot), tpot)
