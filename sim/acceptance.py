"""Acceptance models: how likely the target is to take each draft token, by depth and category.

The model, per expanded tree node at depth d-1 (its children are at depth d):
  * the draft's conditional probabilities of its best children, q_1 >= q_2 >= ..., are q_1 ~
    Beta(mean `confidence`, concentration `concentration`) and q_k = (1 - q_1)(1 - tail) tail^(k-2):
    draft trees get scores (path products of q) shaped like the real draft's, varying from node to node;
  * the target's next token is the draft's k-th child with probability alpha_d * q_k (else a token
    outside the draft's candidates), alpha_d = rate_d / confidence, so the draft's top-1 token is
    accepted at rate_d on average. Scores therefore predict acceptance up to alpha_d, which is what the
    estimator's calibration learns in the engine.
A child is only reachable through its accepted parent (drafts.py walks the tree from the root), so
acceptance is correlated along a path as in real tree verification.

Presets:
  * `llama70b-1b`: Llama-3.2-1B drafting Llama-3.1-70B. Assumed top-1 acceptance 0.80 at depth 1
    decaying by 0.02 per level (0.70 at depth 6): a 4-token chain then yields 3.3 tokens per
    verification and a lone request's tree (its best n_max = 8 nodes of depth 6, width 4) 3.9
    (test_sim_acceptance.py), inside the 3-4.5 tokens per
    verification reported for 1B-class drafters and EAGLE-style trees on 70B chat targets (EAGLE-2,
    Li et al., EMNLP 2024: average acceptance length about 4-4.5 for LLaMA2-Chat 70B). An assumption
    in that range, not a fit to one measurement.
  * `qwen32b-05b`: Qwen2.5-0.5B drafting Qwen2.5-32B, assumed a little lower (0.75 decaying by 0.02).
  * `engine`: this project's own draft, from `acceptance_engine.json` (its source field says how it was
    derived from the recorded evaluation); `--acceptance PATH` loads any table of the same format.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field

ENGINE_TABLE = os.path.join(os.path.dirname(__file__), "acceptance_engine.json")


@dataclass(frozen=True)
class AcceptanceModel:
    name: str
    rates: tuple[float, ...]  # top-1 acceptance at depth 1, 2, ... given the parent accepted; the last repeats
    confidence: float = 0.8  # mean of the draft's top-1 conditional probability
    concentration: float = 4.0  # Beta a + b: how much q_1 varies from node to node
    tail: float = 0.5  # geometric decay of the draft's probabilities below its top-1
    by_category: dict[str, tuple[float, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for r in (self.rates, *self.by_category.values()):
            if not r or any(not 0 <= x <= 1 for x in r):
                raise ValueError(f"{self.name}: acceptance rates must be in [0, 1], got {r}")
        if not 0 < self.confidence < 1 or not 0 <= self.tail < 1 or self.concentration <= 0:
            raise ValueError(f"{self.name}: confidence in (0, 1), tail in [0, 1), concentration > 0")

    def alignment(self, depth: int, category: str | None = None) -> float:
        """alpha_d: the target's agreement with the draft per unit of draft probability at depth d (>= 1)."""
        rates = self.by_category.get(category or "", self.rates)
        rate = rates[min(depth, len(rates)) - 1]
        return min(1.0, rate / self.confidence)

    def scaled(self, factor: float) -> AcceptanceModel:
        """Every rate times `factor` (at most 1): the table's shape, another level (sim.calibration)."""
        scale = lambda rates: tuple(min(1.0, r * factor) for r in rates)  # noqa: E731
        return dataclasses.replace(self, name=f"{self.name} x{factor:.2f}", rates=scale(self.rates),
                                   by_category={c: scale(r) for c, r in self.by_category.items()})

    @property
    def beta(self) -> tuple[float, float]:
        return self.confidence * self.concentration, (1 - self.confidence) * self.concentration


def decaying(first: float, step: float, depths: int = 8) -> tuple[float, ...]:
    return tuple(max(0.0, first - step * i) for i in range(depths))


PRESETS = {
    "llama70b-1b": AcceptanceModel("llama70b-1b", decaying(0.80, 0.02)),
    "qwen32b-05b": AcceptanceModel("qwen32b-05b", decaying(0.75, 0.02)),
}
DEFAULT_FOR_MODEL = {"llama70b": "llama70b-1b", "qwen32b": "qwen32b-05b", "cpu": "engine"}


def load_table(path: str) -> AcceptanceModel:
    """A JSON table: {"name", "confidence"?, "rates"? [per depth], "categories"? {category: [per depth]}}."""
    with open(path) as f:
        data = json.load(f)
    cats = {c: tuple(r) for c, r in data.get("categories", {}).items()}
    rates = tuple(data.get("rates") or _mean_rates(list(cats.values())))
    return AcceptanceModel(data.get("name", os.path.basename(path)), rates, data.get("confidence", 0.8),
                           data.get("concentration", 4.0), data.get("tail", 0.5), cats)


def _mean_rates(tables: list[tuple[float, ...]]) -> list[float]:
    if not tables:
        raise ValueError("an acceptance table needs 'rates' or 'categories'")
    return [sum(t[min(i, len(t) - 1)] for t in tables) / len(tables) for i in range(max(map(len, tables)))]


def acceptance_model(name: str) -> AcceptanceModel:
    """A preset name, `engine`, or a path to a JSON table."""
    if name in PRESETS:
        return PRESETS[name]
    if name == "engine":
        return load_table(ENGINE_TABLE)
    if os.path.isfile(name):
        return load_table(name)
    raise ValueError(f"unknown acceptance model {name!r}: one of {', '.join([*PRESETS, 'engine'])} or a JSON path")
