"""What a request reports: the tokens emitted with stop and length checks (stop strings held back
until settled), and the output record."""

from __future__ import annotations

from . import stop_strings
from .request import FinishReason, RequestOutput, RequestStats, TokenLogprob
from .sequence import Sequence


def append_tokens(seq: Sequence, tokens: list[int], tokenizer,
                  logprobs: list[TokenLogprob] | None = None) -> tuple[list[int], FinishReason | None]:
    """Append `tokens` to seq.output (their `logprobs`, if given, to seq.output_logprobs in step) up to a
    stop or the length limit; returns the tokens to report now (a possible stop string's beginning is
    held back) and the finish reason, if any."""
    req, reason = seq.request, None
    for i, tok in enumerate(tokens):
        seq.output.append(tok)
        if logprobs is not None:
            seq.output_logprobs.append(logprobs[i])
        if (tok in seq.eos_ids or tok in req.stop_token_ids) and len(seq.output) > req.min_tokens:
            reason = FinishReason.STOP
        elif len(seq.output) >= req.max_tokens:
            reason = FinishReason.LENGTH
        if reason:
            break
    if reason == FinishReason.STOP and seq.grammar is not None and seq.grammar.closed:
        reason = FinishReason.LENGTH  # max_tokens was near: the grammar closed the answer (grammar/state.py)
    send = len(seq.output)
    if req.stop_strings:
        may_stop = len(seq.output) > req.min_tokens
        send, matched = stop_strings.scan(tokenizer, seq.output, req.stop_strings, seq.stop_scan, may_stop)
        if matched:
            del seq.output[send:]
            del seq.output_logprobs[send:]
            reason = FinishReason.STOP
        elif reason:
            send = len(seq.output)  # finished anyway: nothing is held back
    new, seq.emitted = seq.output[seq.emitted : send], max(seq.emitted, send)
    return new, reason


def queue_wait_s(seq: Sequence, now: float, reason: FinishReason | None) -> float | None:
    """Arrival to first admission; a request that ends without one waited until now."""
    if seq.admitted_time is not None:
        return seq.admitted_time - seq.arrival
    return now - seq.arrival if reason is not None else None


def make_output(seq: Sequence, new: list[int], now: float, reason: FinishReason | None,
                error: str | None = None) -> RequestOutput:
    return RequestOutput(
        request_id=seq.request.request_id,
        new_token_ids=new,
        finished=reason is not None,
        finish_reason=reason,
        error=error,
        arrival_time=seq.arrival,
        first_token_time=seq.first_token_time,
        emit_time=now,
        num_prompt_tokens=len(seq.request.prompt_ids),
        num_cached_tokens=seq.cached_tokens,
        num_output_tokens=seq.emitted,
        slo=seq.slo,
        new_logprobs=(seq.output_logprobs[seq.emitted - len(new): seq.emitted]
                      if new and seq.request.logprobs is not None else None),
        prompt_logprobs=([None, *seq.prompt_logprobs] if new and seq.emitted == len(new)
                         and seq.request.prompt_logprobs is not None else None),
        stats=RequestStats(seq.verifications, seq.draft_tokens, seq.accepted_drafts, queue_wait_s(seq, now, reason),
                           seq.missed, None if seq.predicted_first_token is None
                           else seq.predicted_first_token - seq.arrival, seq.predicted_length,
                           seq.accepted_prediction, len(seq.request.prediction)),
    )
