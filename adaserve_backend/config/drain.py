"""How a stopping server treats the requests it is serving (engine.json's `drain` section)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class DrainConfig:
    """grace_s: once the server is told to stop (SIGTERM, `docker stop`), the requests in flight keep
      generating for up to this long; what has not finished by then ends with "the server is shutting
      down" (UNAVAILABLE), and the process exits. New requests are refused from the first moment. 0
      ends every request at once. The default fits, with the exit that follows, inside the 10 s
      `docker stop` and Kubernetes give before they kill (docs/triton.md#shutdown): a larger grace
      needs their grace period raised to match.
    """

    grace_s: float = 5.0

    def __post_init__(self) -> None:
        if isinstance(self.grace_s, bool) or not isinstance(self.grace_s, (int, float)) \
                or not (math.isfinite(self.grace_s) and self.grace_s >= 0):
            raise ValueError(f"drain.grace_s must be a number of seconds >= 0, got {self.grace_s!r}")
