"""The frontend's tenants (`--api-keys-file`, docs/tenants.md): every request but the open paths'
needs a key of the keys file, and the key's tenant decides, whatever the request says, whose it is
(the `tenant` of the suffix index, never OpenAI's `user`), its default SLO class, the tightest targets
it may ask for, its limits (tenant_limits.py) and whether its prefix cache and suffix index are its
own (the engine's cache scope). Its counters are on /metrics (tenant_metrics.py).

Two steps, because what a request asks for is known only once its body is parsed: `guard` (the auth
middleware's body) finds the tenant, counts the outcome and, for a request that was admitted, frees
its place and charges its tokens when it ends, however it ends; `admit` (right after parsing) applies
the tenant to the generation and takes the place.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from ..config import SchedulerConfig
from ..slo import SLO
from .bodies import Tally
from .field_readers import OpenAIError
from .keys_file import load_keys_file
from .params import Generation
from .tenant_limits import TenantLimits
from .tenant_metrics import TenantMetrics, outcome_of
from .tenants import Keyring, Tenant, bearer

TENANT = web.RequestKey("tenant", Tenant)  # the authenticated tenant,
ADMITTED = web.RequestKey("admitted", Tally)  # and the usage tally of a request that holds one of its places
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Tenancy:
    def __init__(self, tenants: tuple[Tenant, ...], scheduler: SchedulerConfig,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.keyring, self.scheduler = Keyring(tenants), scheduler
        self.limits = TenantLimits(tenants, clock)
        self.metrics = TenantMetrics(t.name for t in tenants)

    async def guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """401 without a known key; else the handler, with the outcome counted for the key's tenant."""
        tenant = self.keyring.find(bearer(request.headers.get("Authorization", "")))
        if tenant is None:
            self.metrics.unauthenticated += 1
            raise OpenAIError(401, "a valid API key is required (Authorization: Bearer <key>)",
                              kind="authentication_error")
        request[TENANT] = tenant
        outcome = "error"
        try:
            response = await handler(request)
            outcome = outcome_of(response.status)
            return response
        except (OpenAIError, web.HTTPException) as e:
            outcome = outcome_of(e.status)
            raise
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            tally: Tally | None = request.get(ADMITTED)
            if tally is not None:
                self.limits.release(tenant, tally.prompt_tokens + tally.completion_tokens,
                                    len(tally.choices))
                self.metrics.add_tokens(tenant.name, tally.prompt_tokens, tally.completion_tokens)
            self.metrics.count(tenant.name, outcome)

    def admit(self, request: web.Request, gen: Generation, tally: Tally) -> Generation:
        """The generation as the request's tenant may have it: its name as the tenant, its default
        class where the request names none, its cache scope; 403 for a target tighter than it may ask
        for, 429 beyond its limits. `tally`: what the request's tokens are counted in (charged at its end)."""
        tenant: Tenant = request[TENANT]
        slo = gen.slo
        if slo.slo_class is None and tenant.default_slo_class is not None:
            slo = dataclasses.replace(slo, slo_class=tenant.default_slo_class)  # numbers given still win
        self._check_bounds(tenant, slo)
        self.limits.admit(tenant, gen.generations)
        request[ADMITTED] = tally
        return dataclasses.replace(gen, slo=slo, tenant=tenant.name, cache_scope=tenant.cache_scope)

    def _check_bounds(self, tenant: Tenant, slo: SLO) -> None:
        try:
            resolved = self.scheduler.resolve_slo(slo)
        except ValueError as e:  # an unknown class: the engine would refuse it the same way
            raise OpenAIError(400, str(e), "slo_class") from None
        tight = tenant.too_tight(resolved)
        if tight is None:
            return
        field, target, bound = tight
        asked = getattr(slo, field.replace("_slo_ms", "_ms")) is not None
        via = "" if asked else f" (slo_class {slo.slo_class!r})"
        raise OpenAIError(403, f"tenant {tenant.name!r} may not ask for {field} below {bound:g} ms; this request "
                          f"asks for {target:g} ms{via}", field if asked else "slo_class", kind="permission_error")

    def metrics_text(self) -> str:
        return self.metrics.text(self.limits.in_flight)


def load_tenancy(keys_file: str | None, api_key: str | None, scheduler: SchedulerConfig) -> Tenancy | None:
    """The tenants of `--api-keys-file`, None without one. With a keys file every key is a tenant's: a
    single `--api-key` besides would be a key without limits beside them, so both is an error."""
    if not keys_file:
        return None
    if api_key:
        raise SystemExit("--api-key (or $ADASERVE_API_KEY) and --api-keys-file exclude each other: with a keys "
                         "file every key is a tenant's (give the single key a tenant of its own there)")
    return Tenancy(load_keys_file(keys_file, scheduler), scheduler)


def repository_tenancy(keys_file: str | None, api_key: str | None, model_repository: str) -> Tenancy | None:
    """load_tenancy with the SLO classes the model repository's engine serves."""
    if not keys_file:
        return None
    import os

    from ..triton.repository import load_engine_config

    return load_tenancy(keys_file, api_key,
                        load_engine_config(os.path.join(model_repository, "preprocessing")).scheduler)
