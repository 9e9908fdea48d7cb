"""Per-tenant metrics on the frontend's /metrics (Prometheus text): requests by tenant and outcome,
generations in flight, tokens used. Every tenant's series exist from the start, at zero, so a rate
over them is defined before its first request. Tenant names are checked when the keys file is loaded
(keys_file.NAME) and need no escaping as label values."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

REQUESTS = "adaserve_frontend_tenant_requests_total"
IN_FLIGHT = "adaserve_frontend_tenant_requests_in_flight"
TOKENS = "adaserve_frontend_tenant_tokens_total"
UNAUTHENTICATED = "adaserve_frontend_unauthenticated_requests_total"
# ok: 2xx; 429: a tenant limit (rate_limit_exceeded); 4xx: any other refusal of the request (403 for a
# target tighter than the tenant may ask for among them); error: 5xx, the server's failure or overload;
# cancelled: the client went away before its answer was complete.
OUTCOMES = ("ok", "429", "4xx", "error", "cancelled")
TOKEN_KINDS = ("prompt", "completion")


def outcome_of(status: int) -> str:
    if status < 400:
        return "ok"
    if status == 429:
        return "429"
    return "4xx" if status < 500 else "error"


class TenantMetrics:
    def __init__(self, names: Iterable[str]) -> None:
        names = list(names)
        self.requests = {(n, o): 0 for n in names for o in OUTCOMES}
        self.tokens = {(n, k): 0 for n in names for k in TOKEN_KINDS}
        self.unauthenticated = 0

    def count(self, name: str, outcome: str) -> None:
        self.requests[name, outcome] += 1

    def add_tokens(self, name: str, prompt: int, completion: int) -> None:
        self.tokens[name, "prompt"] += prompt
        self.tokens[name, "completion"] += completion

    def text(self, in_flight: Mapping[str, int]) -> str:
        lines = [f"# HELP {REQUESTS} Requests a tenant's key authenticated, by how they ended.",
                 f"# TYPE {REQUESTS} counter"]
        lines += [f'{REQUESTS}{{tenant="{n}",outcome="{o}"}} {v}' for (n, o), v in self.requests.items()]
        lines += [f"# HELP {IN_FLIGHT} A tenant's generations in flight (its max_in_flight counts these).",
                  f"# TYPE {IN_FLIGHT} gauge"]
        lines += [f'{IN_FLIGHT}{{tenant="{n}"}} {v}' for n, v in in_flight.items()]
        lines += [f"# HELP {TOKENS} Prompt and completion tokens of a tenant's requests (what its bucket is charged).",
                  f"# TYPE {TOKENS} counter"]
        lines += [f'{TOKENS}{{tenant="{n}",kind="{k}"}} {v}' for (n, k), v in self.tokens.items()]
        lines += [f"# HELP {UNAUTHENTICATED} Requests refused for want of a valid API key (401).",
                  f"# TYPE {UNAUTHENTICATED} counter", f"{UNAUTHENTICATED} {self.unauthenticated}"]
        return "\n".join(lines) + "\n"
