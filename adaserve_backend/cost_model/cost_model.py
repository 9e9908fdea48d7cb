"""The profiled cost model: target verification and draft step rooflines, and the budget B."""

from __future__ import annotations

import json
from dataclasses import dataclass

from .roofline import Roofline


@dataclass(frozen=True)
class CostModel:
    target: Roofline  # verification forward latency vs tokens verified
    draft: Roofline  # one draft beam step vs tokens in it
    budget: int  # B: tokens per verification, at the target roofline's knee

    def iteration_ms(self, num_requests: int, depth: int, width: int, verify_tokens: int) -> float:
        """Predicted t_spec: speculation (d draft steps) plus verification."""
        if depth == 0:
            return self.target.predict(verify_tokens)
        draft = self.draft.predict(num_requests) + (depth - 1) * self.draft.predict(num_requests * width)
        return draft + self.target.predict(verify_tokens)

    def chunk_extra_ms(self, num_requests: int, verify_tokens: int, chunk: int) -> float:
        """What `chunk` prefill tokens add to an iteration of `num_requests` decoding requests: they
        join the verification forward, and the draft's first step reads as many."""
        target = self.target.predict(verify_tokens + chunk) - self.target.predict(verify_tokens)
        return target + self.draft.predict(num_requests + chunk) - self.draft.predict(num_requests)

    def save(self, path: str, extra: dict | None = None) -> None:
        data = {"target": self.target.to_dict(), "draft": self.draft.to_dict(), "budget": self.budget, **(extra or {})}
        with open(path, "w") as f:
            json.dump(data, f, indent=2)

    @classmethod
    def load(cls, path: str) -> "CostModel":
        with open(path) as f:
            data = json.load(f)
        return cls(Roofline(**data["target"]), Roofline(**data["draft"]), int(data["budget"]))
