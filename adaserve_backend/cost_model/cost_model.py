"""The profiled cost model: target verification and draft step latency, and the budget B."""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass

from .roofline import Roofline, through_points


@dataclass(frozen=True)
class CostModel:
    target: Roofline  # verification forward latency vs tokens verified; its knee gives B
    draft: Roofline  # one draft beam step vs tokens in it
    budget: int  # B: tokens per verification, at the target roofline's knee
    # The measured (tokens, ms) points the rooflines were fitted to. Predictions go through them: real
    # hardware is not flat below the knee (on a CPU one token takes a faster kernel than two to eight).
    verify_points: tuple[tuple[int, float], ...] = ()
    draft_points: tuple[tuple[int, float], ...] = ()

    def verify_ms(self, tokens: int) -> float:
        return through_points(self.verify_points, self.target, tokens)

    def draft_ms(self, num_requests: int, depth: int, width: int) -> float:
        """Speculation: d draft steps, the first over the roots, the others over w beams per request."""
        if depth == 0:
            return 0.0
        return self.draft_step_ms(num_requests) + (depth - 1) * self.draft_step_ms(num_requests * width)

    def draft_step_ms(self, tokens: int) -> float:
        return through_points(self.draft_points, self.draft, tokens)

    def iteration_ms(self, num_requests: int, depth: int, width: int, verify_tokens: int) -> float:
        """Predicted t_spec: speculation plus verification."""
        return self.draft_ms(num_requests, depth, width) + self.verify_ms(verify_tokens)

    def chunk_extra_ms(self, num_requests: int, verify_tokens: int, chunk: int) -> float:
        """What `chunk` prefill tokens add to an iteration of `num_requests` decoding requests: they
        join the verification forward, and the draft's first step reads as many."""
        target = self.verify_ms(verify_tokens + chunk) - self.verify_ms(verify_tokens)
        return target + self.draft_step_ms(num_requests + chunk) - self.draft_step_ms(num_requests)

    def relative_speed(self, probe_ms: dict) -> float:
        """How much slower than when profiled the machine ran a set of target forwards, timed as the
        profile times them ({tokens: ms}, adaserve_backend.profiler.probe_ms): the geometric mean of the ratios;
        1.0 for no probe. A shared machine's speed drifts between runs, so each run is priced at its own
        (evidence: docs/benchmarking.md#reading-a-result)."""
        ratios = [ms / self.verify_ms(int(n)) for n, ms in probe_ms.items()]
        return math.prod(ratios) ** (1 / len(ratios)) if ratios else 1.0

    def to_dict(self) -> dict:
        data = {"target": self.target.to_dict(), "draft": self.draft.to_dict(), "budget": self.budget}
        if self.verify_points:
            data["measured"] = {"tokens": [n for n, _ in self.verify_points],
                                "verify_ms": [ms for _, ms in self.verify_points],
                                "draft_ms": [ms for _, ms in self.draft_points]}
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "CostModel":
        measured = data.get("measured", {})
        tokens = measured.get("tokens", [])
        return cls(Roofline(**data["target"]), Roofline(**data["draft"]), int(data["budget"]),
                   tuple(zip(tokens, measured.get("verify_ms", []))), tuple(zip(tokens, measured.get("draft_ms", []))))

    def save(self, path: str, extra: dict | None = None) -> None:
        with open(path, "w") as f:
            json.dump({**self.to_dict(), **(extra or {})}, f, indent=2)

    @classmethod
    def load(cls, path: str) -> "CostModel":
        with open(path) as f:
            return cls.from_dict(json.load(f))


def load_cost_model(path: str | None) -> CostModel | None:
    """The profile at `path`; a path that is set but missing is an error, since running on without it
    would quietly change admission, selection and B. No path: say which defaults apply."""
    if not path:
        logging.getLogger("adaserve").info(
            "no speculation.profile_path: budget B from SpeculationConfig.budget, no SLO-aware admission or "
            "prefill pacing, throughput selection spends all of B (profile with python -m tools.profile)"
        )
        return None
    if not os.path.isfile(path):
        raise FileNotFoundError(f"speculation.profile_path {path!r} does not exist (write it with python -m "
                                f"tools.profile)")
    return CostModel.load(path)
