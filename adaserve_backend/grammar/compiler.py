"""Grammars compiled for one model's vocabulary, with xgrammar (docs/structured-output.md says why it and
not llguidance). Compiling is done where requests come in (Engine.add_request, on the caller's thread),
never on the engine loop, and cached per grammar: the loop only starts a parse state from the cache."""

from __future__ import annotations

import threading
from collections.abc import Iterable

from .spec import EBNF, JSON, JSON_SCHEMA, REGEX, GrammarSpec
from .state import GrammarState


class Grammars:
    def __init__(self, vocabulary, vocab_size: int, stop_ids: Iterable[int]) -> None:
        """`vocabulary`: a Hugging Face tokenizer, or each token's text as a list (a test's vocabulary);
        `stop_ids`: the tokens that end a generation, the only ones allowed once a grammar is complete.
        The vocabulary is read on first use (a tokenizer takes a fraction of a second)."""
        self._vocabulary, self.vocab_size, self.stop_ids = vocabulary, vocab_size, sorted(stop_ids)
        self._compiler = None
        self._lock = threading.Lock()

    def _compiler_now(self):
        import xgrammar as xgr

        with self._lock:
            if self._compiler is None:
                v = self._vocabulary
                info = (xgr.TokenizerInfo(list(v), vocab_size=self.vocab_size, stop_token_ids=self.stop_ids)
                        if isinstance(v, (list, tuple)) else
                        xgr.TokenizerInfo.from_huggingface(v, vocab_size=self.vocab_size, stop_token_ids=self.stop_ids))
                # one thread: the host's cores are the engine's; the cache keeps every grammar compiled
                self._compiler = xgr.GrammarCompiler(info, max_threads=1)
            return self._compiler

    def compile(self, spec: GrammarSpec):
        """The compiled grammar (from the cache once compiled); ValueError naming what is wrong with it."""
        compiler = self._compiler_now()
        try:
            # JSON without free whitespace (json.dumps' separators): a small model given a choice of
            # whitespace between tokens can pad to max_tokens, and no client needs the padding
            if spec.kind == JSON:
                return compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
            if spec.kind == JSON_SCHEMA:
                return compiler.compile_json_schema(spec.guide, any_whitespace=False)
            if spec.kind == REGEX:
                return compiler.compile_regex(spec.guide)
            assert spec.kind == EBNF, spec.kind
            return compiler.compile_grammar(spec.guide)
        except (RuntimeError, ValueError) as e:
            raise ValueError(f"the {spec.kind} grammar cannot be compiled: {str(e).strip().splitlines()[0]}") from None

    def start(self, spec: GrammarSpec) -> GrammarState:
        """A new request's parse state, before its first output token."""
        return GrammarState(self.compile(spec), self.vocab_size)
