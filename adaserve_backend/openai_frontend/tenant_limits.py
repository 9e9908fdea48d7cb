"""Each tenant's limits at the frontend: its generations in flight, and a token bucket.

The bucket is charged when a request ends, with the prompt and completion tokens its usage tally
counted, however it ended (a stream the client cancelled pays for what was generated up to then): a
request's cost is known only then, since `max_tokens` is a cap most outputs stop well short of, and
charging the cap up front would refuse a tenant for tokens it never used. A tenant is refused while its
bucket is in debt, until the refill pays the debt off; Retry-After says when. Requests admitted
together can overdraw the bucket by what they use together: the in-flight cap bounds that, and the
debt they leave makes the tenant wait it out, so over time it gets its rate and no more.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from .backends import RETRY_AFTER_S
from .field_readers import OpenAIError
from .tenants import Tenant


class RateLimited(OpenAIError):
    """429 in OpenAI's shape: `type` says which limit ("requests" or "tokens"), `code` is
    rate_limit_exceeded, and Retry-After says when to try again."""

    def __init__(self, message: str, limit: str, retry_after_s: int) -> None:
        super().__init__(429, message, kind=limit, retry_after_s=retry_after_s)

    def body(self) -> dict:
        body = super().body()
        body["error"]["code"] = "rate_limit_exceeded"
        return body


@dataclass
class TokenBucket:
    """Tokens a tenant may spend: refills at `rate_per_s` up to `capacity`; its level goes below zero
    when a request used more than was left (debt)."""

    rate_per_s: float
    capacity: float
    level: float
    updated: float

    @classmethod
    def full(cls, tokens_per_minute: int, capacity: int, now: float) -> TokenBucket:
        return cls(tokens_per_minute / 60.0, float(capacity), float(capacity), now)

    def _refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + max(now - self.updated, 0.0) * self.rate_per_s)
        self.updated = now

    def debt_s(self, now: float) -> float:
        """How long until the bucket is out of debt (0: it is not in debt)."""
        self._refill(now)
        return -self.level / self.rate_per_s if self.level < 0 else 0.0

    def charge(self, tokens: int, now: float) -> None:
        self._refill(now)
        self.level -= tokens


class TenantLimits:
    """Every tenant's in-flight count and token bucket (only for those with a token rate)."""

    def __init__(self, tenants: tuple[Tenant, ...], clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.in_flight = {t.name: 0 for t in tenants}
        now = clock()
        self.buckets = {t.name: TokenBucket.full(t.tokens_per_minute, t.burst_tokens or t.tokens_per_minute, now)
                        for t in tenants if t.tokens_per_minute is not None}

    def admit(self, tenant: Tenant, places: int = 1) -> None:
        """Take `places` of the tenant's in-flight places (a request's generations: n choices of each
        prompt), or RateLimited (429) if they would pass its cap or its bucket is in debt; more than the
        cap: 400."""
        n = self.in_flight[tenant.name]
        if tenant.max_in_flight is not None and places > tenant.max_in_flight:
            raise OpenAIError(400, f"this request's {places} generations (n choices of each prompt) are more than "
                              f"tenant {tenant.name!r} may run at once ({tenant.max_in_flight})", "n")
        if tenant.max_in_flight is not None and n + places > tenant.max_in_flight:
            more = f"; this request's {places} would pass its limit of {tenant.max_in_flight}" if places > 1 else \
                ", its limit"
            raise RateLimited(f"tenant {tenant.name!r} has {n} requests in flight{more}; retry when one ends",
                              "requests", RETRY_AFTER_S)
        bucket = self.buckets.get(tenant.name)
        if bucket is not None and (wait_s := bucket.debt_s(self.clock())) > 0:
            raise RateLimited(f"tenant {tenant.name!r} used {-bucket.level:.0f} tokens more than its rate of "
                              f"{tenant.tokens_per_minute} tokens per minute allows so far; retry in {wait_s:.1f} s",
                              "tokens", max(1, math.ceil(wait_s)))
        self.in_flight[tenant.name] = n + places

    def release(self, tenant: Tenant, tokens: int, places: int = 1) -> None:
        """An admitted request ended, having used `tokens` (prompt and completion)."""
        self.in_flight[tenant.name] -= places
        bucket = self.buckets.get(tenant.name)
        if bucket is not None:
            bucket.charge(tokens, self.clock())
