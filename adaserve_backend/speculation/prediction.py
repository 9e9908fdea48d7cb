"""Predicted Outputs (OpenAI's `prediction`): text the client expects most of the answer to repeat (a
file being edited, a document being revised) as a source of copied draft tokens.

Where the output's last n tokens occur in the prediction, the prediction's next tokens are proposed as
a chain below the root, like prompt lookup's copies (lookup.py) but from the client's text; at several
occurrences, the first at or after where the last match ended, so a copy walks through the prediction
in order. Each place in a copy is weighed by what verification measured of predictions so far
(copy_rates.py, keys PREDICTION + place), starting from prompt lookup's priors: a prediction that stops
matching stops being verified. Verification is exact whatever is proposed (acceptance.py), so a
prediction changes how many tokens an iteration yields, never which.
"""

from __future__ import annotations

from collections.abc import Sequence

from .lookup import HIT_RATE, MAX_NGRAM

PREDICTION = "prediction"  # the origin key of a predicted node (copy_rates.py): (PREDICTION, place)


def prediction_key(place: int) -> tuple[str, int]:
    return (PREDICTION, min(place, 3))


def is_predicted(origin) -> bool:
    return isinstance(origin, tuple) and len(origin) == 2 and origin[0] == PREDICTION


class PredictionIndex:
    """One request's prediction, its n-grams (n <= MAX_NGRAM) mapped to where each occurrence ends."""

    def __init__(self, prediction: Sequence[int]) -> None:
        self.prediction = list(prediction)
        self._ends: dict[tuple[int, ...], list[int]] = {}
        for end in range(1, len(self.prediction)):
            for n in range(1, min(MAX_NGRAM, end) + 1):
                self._ends.setdefault(tuple(self.prediction[end - n:end]), []).append(end)
        self.cursor = 0  # where the last proposal's match ended

    def propose(self, tokens: Sequence[int], k: int) -> tuple[int, list[int]]:
        """(n, up to k predicted tokens after the longest suffix of `tokens` found in the prediction),
        (0, []) if none; with n, HIT_RATE[n] gives each place's prior."""
        for n in range(min(MAX_NGRAM, len(tokens)), 0, -1):
            ends = self._ends.get(tuple(tokens[len(tokens) - n:]))
            if ends:
                end = next((e for e in ends if e >= self.cursor), ends[0])
                self.cursor = end
                return n, self.prediction[end:end + k]
        return 0, []


def prior(n: int, place: int) -> float:
    rates = HIT_RATE[n]
    return rates[min(place, len(rates) - 1)]
