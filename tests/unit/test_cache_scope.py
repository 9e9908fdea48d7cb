"""A request's cache scope (an isolated tenant's, docs/tenants.md): its prefix-cache blocks and suffix
index are shared only with requests of the same scope, and requests without one behave as before.
Tiny checkpoints; greedy outputs stay the oracle's whatever is shared."""

from __future__ import annotations

from adaserve_backend.kv_cache import BlockManager
from adaserve_backend.kv_cache.block_pool import ROOT_KEY, scope_root
from adaserve_backend.request import Request
from adaserve_backend.slo import SLO
from tests.engines import assert_all_blocks_free, make_engine, reference
from tests.model_fixtures import tiny_checkpoint
from tests.unit.test_engine_suffix import served_one_by_one

PROMPT = [5, 17, 33, 48, 61, 72, 90, 104, 11, 23, 37, 41]  # three 4-token blocks: two can be reused


def cached(blocks: BlockManager, seq_id: int, tokens: list[int], root: bytes) -> None:
    blocks.append(seq_id, list(range(-1, len(tokens) - 1)))
    blocks.commit_all(seq_id)
    blocks.publish(seq_id, tokens, root=root)


def test_blocks_published_in_one_scope_are_found_only_in_it():
    a, b = scope_root("team-a"), scope_root("team-b")
    assert scope_root(None) == ROOT_KEY and len({ROOT_KEY, a, b}) == 3
    blocks = BlockManager(16, 4, prefix_caching=True)
    cached(blocks, 1, PROMPT, a)
    assert len(blocks.match(PROMPT, 11, root=a)[0]) == 2
    assert blocks.match(PROMPT, 11, root=b)[0] == [] and blocks.match(PROMPT, 11)[0] == []
    cached(blocks, 2, PROMPT, ROOT_KEY)  # the unscoped prefix: its own blocks, found as before
    unscoped, _ = blocks.match(PROMPT, 11)
    assert len(unscoped) == 2 and set(unscoped).isdisjoint(blocks.match(PROMPT, 11, root=a)[0])


def ask(request_id: str, scope: str | None = None, tenant: str | None = None) -> Request:
    return Request(request_id, PROMPT, max_tokens=24, min_tokens=24, slo=SLO(tpot_ms=20.0), tenant=tenant,
                   cache_scope=scope)


def served_with_hits(engine, reqs: list[Request]) -> dict[str, tuple[list[int], int, int]]:
    """Each request alone, in turn: its output, the drafts it accepted, the prompt tokens the prefix cache had."""
    out = {}
    for r in reqs:
        before = engine.scheduler.prefix_stats.hit
        (tokens, accepted), = served_one_by_one(engine, [r]).values()
        out[r.request_id] = (tokens, accepted, engine.scheduler.prefix_stats.hit - before)
    return out


def test_isolated_scopes_share_neither_prefix_blocks_nor_suffix_matches():
    target = tiny_checkpoint("llama")
    engine = make_engine(target, tiny_checkpoint("llama", seed=1), "adaserve", lookup_ngram=0, suffix_scope="shared")
    reqs = [ask("a first", "team-a"), ask("b", "team-b"), ask("unscoped", None), ask("a again", "team-a"),
            ask("unscoped again", None)]
    got = served_with_hits(engine, reqs)
    want = reference(target, reqs[0])
    assert all(tokens == want for tokens, _, _ in got.values())
    accepted = {name: a for name, (_, a, _) in got.items()}
    hits = {name: h for name, (_, _, h) in got.items()}
    # the other scope and the unscoped request find nothing of team-a's: no cached block, no suffix match
    assert hits["b"] == 0 and hits["unscoped"] == 0, hits
    assert accepted["b"] < len(want) // 2 and accepted["unscoped"] < len(want) // 2, accepted
    # within a scope, and among unscoped requests, both are reused as before
    assert hits["a again"] == 8 and hits["unscoped again"] == 8, hits
    assert accepted["a again"] >= len(want) // 2 and accepted["unscoped again"] >= len(want) // 2, accepted
    assert_all_blocks_free(engine)


def test_a_scope_is_its_own_whatever_the_tenant_names_say():
    """suffix_scope "tenant": an isolated request matches its scope's, never a tenant that shares its name."""
    target = tiny_checkpoint("llama")
    engine = make_engine(target, tiny_checkpoint("llama", seed=1), "adaserve", lookup_ngram=0, suffix_scope="tenant")
    reqs = [ask("plain tenant", None, tenant="team-a"), ask("isolated", "team-a", tenant="team-a")]
    got = served_with_hits(engine, reqs)
    _, accepted, hits = got["isolated"]
    assert hits == 0 and accepted < len(got["plain tenant"][0]) // 2, got
