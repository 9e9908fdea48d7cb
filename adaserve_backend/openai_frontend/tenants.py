"""Tenants and their API keys: who a key belongs to and what that tenant may ask for, the lookup of a
request's key, and the command that makes a key's entry for the keys file (keys_file.py reads it;
docs/tenants.md has the format).

    python -m adaserve_backend.openai_frontend.tenants new          # a fresh key and its entry
    python -m adaserve_backend.openai_frontend.tenants hash < KEY   # the entry of a key you have

Keys are kept as SHA-256 digests, never as themselves: whoever reads the file cannot call the server.
An unsalted fast hash is enough for keys drawn at random (`new` draws 256 bits), which is why `hash`
refuses short keys: a guessable key would be as weak here as anywhere.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import re
import secrets
import sys
from dataclasses import dataclass

from ..slo import BEST_EFFORT, SLO

DIGEST_PREFIX = "sha256:"
MIN_KEY_CHARS = 20
KEY_CHARS = re.compile(r"^[\x21-\x7e]+$")  # printable ASCII without spaces: what a Bearer header carries


@dataclass(frozen=True)
class Tenant:
    """Who a key belongs to, and what it may do. `default_slo_class`: for its requests that name no
    class. `min_tpot_slo_ms` / `min_ttft_slo_ms`: the tightest targets its requests may ask for;
    `max_in_flight`: its generations at once; `tokens_per_minute` (and `burst_tokens`, the bucket's
    size): the rate its requests' prompt and completion tokens are charged against. None: no such
    limit. `isolate`: its prefix cache and suffix index are its own."""

    name: str
    key_digests: tuple[bytes, ...]
    default_slo_class: str | None = None
    min_tpot_slo_ms: float | None = None
    min_ttft_slo_ms: float | None = None
    max_in_flight: int | None = None
    tokens_per_minute: int | None = None
    burst_tokens: int | None = None
    isolate: bool = False

    @property
    def cache_scope(self) -> str | None:
        """What the engine keys its prefix cache and suffix index by for this tenant (None: shared)."""
        return self.name if self.isolate else None

    def too_tight(self, resolved: SLO) -> tuple[str, float, float] | None:
        """The first of a request's targets (as the scheduler resolves them) that is tighter than this
        tenant may ask for: (its field, the target, the bound); None if it may. Best effort and a
        target left open are the loosest there is."""
        if resolved.slo_class == BEST_EFFORT:
            return None
        for field, target, bound in (("tpot_slo_ms", resolved.tpot_ms, self.min_tpot_slo_ms),
                                     ("ttft_slo_ms", resolved.ttft_ms, self.min_ttft_slo_ms)):
            if bound is not None and target is not None and target < bound:
                return field, target, bound
        return None


def key_digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


def key_entry(key: str) -> str:
    """A key's entry in the keys file."""
    return DIGEST_PREFIX + key_digest(key).hex()


class Keyring:
    """Every key's digest and its tenant. A lookup compares the presented key's digest with each of
    them in constant time and with all of them, so its time says nothing of which one matched."""

    def __init__(self, tenants: tuple[Tenant, ...]) -> None:
        self.entries = [(digest, t) for t in tenants for digest in t.key_digests]

    def find(self, key: str | None) -> Tenant | None:
        if not key:
            return None
        digest, found = key_digest(key), None
        for candidate, tenant in self.entries:
            if hmac.compare_digest(digest, candidate):
                found = tenant
        return found


def bearer(authorization: str) -> str | None:
    """The key of an `Authorization: Bearer <key>` header (the scheme is case-insensitive, RFC 9110)."""
    scheme, _, key = authorization.strip().partition(" ")
    return (key.strip() or None) if scheme.lower() == "bearer" else None


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("new", help="print a fresh random key, then its keys-file entry")
    sub.add_parser("hash", help="read a key from stdin, print its keys-file entry")
    args = ap.parse_args(argv)
    if args.command == "new":
        key = "sk-" + secrets.token_urlsafe(32)
        print(key)
        print(key_entry(key))
        return
    key = sys.stdin.read().strip()
    if not KEY_CHARS.match(key) or len(key) < MIN_KEY_CHARS:
        raise SystemExit(f"a key is one line of at least {MIN_KEY_CHARS} printable ASCII characters without spaces "
                         "(`new` draws one)")
    print(key_entry(key))


if __name__ == "__main__":
    main()
