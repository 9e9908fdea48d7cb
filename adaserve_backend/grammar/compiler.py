"""Grammars compiled for one model's vocabulary, with xgrammar (docs/structured-output.md says why it and
not llguidance). Compiling is done where requests come in (Engine.add_request, on the caller's thread),
never on the engine loop, and cached per grammar (the most recently used CACHED_GRAMMARS): the loop only
starts a parse state from the cache."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Iterable

import torch

from .spec import EBNF, JSON, JSON_SCHEMA, REGEX, GrammarSpec
from .state import Closing, GrammarState, pack

# RFC 8259's interoperable integers (what a double holds exactly): an integer the schema leaves unbounded
# is kept within them. Without a bound a small model given digits can write digits to max_tokens.
SAFE_INTEGER = 2**53 - 1
BRACKETS, COMMAS, QUOTE = set(b"]} \n"), set(b", "), ord('"')
CACHED_GRAMMARS = 256  # distinct grammars kept compiled: clients' schemas, without bound, would fill memory


class Grammars:
    def __init__(self, vocabulary, vocab_size: int, stop_ids: Iterable[int]) -> None:
        """`vocabulary`: a Hugging Face tokenizer, or each token's text as a list (a test's vocabulary);
        `stop_ids`: the tokens that end a generation, the only ones allowed once a grammar is complete.
        The vocabulary is read on first use (a tokenizer takes a fraction of a second)."""
        self._vocabulary, self.vocab_size, self.stop_ids = vocabulary, vocab_size, sorted(stop_ids)
        self._compiler, self._closing = None, None
        self._compiled: OrderedDict[GrammarSpec, object] = OrderedDict()  # guarded by _lock
        self._lock = threading.Lock()

    def _compiler_now(self):
        import xgrammar as xgr

        with self._lock:
            if self._compiler is None:
                v = self._vocabulary
                info = (xgr.TokenizerInfo(list(v), vocab_size=self.vocab_size, stop_token_ids=self.stop_ids)
                        if isinstance(v, (list, tuple)) else
                        xgr.TokenizerInfo.from_huggingface(v, vocab_size=self.vocab_size, stop_token_ids=self.stop_ids))
                # one thread: the host's cores are the engine's; the one cache is ours (compile)
                self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
                self._closing = closing_classes(info.decoded_vocab, self.vocab_size, self.stop_ids)
            return self._compiler

    def compile(self, spec: GrammarSpec):
        """The compiled grammar (from the cache once compiled); ValueError naming what is wrong with it."""
        compiler = self._compiler_now()
        with self._lock:
            if spec in self._compiled:
                self._compiled.move_to_end(spec)
                return self._compiled[spec]
        compiled = self._compile(compiler, spec)  # outside the lock: other requests' grammars compile meanwhile
        with self._lock:
            self._compiled[spec] = compiled
            while len(self._compiled) > CACHED_GRAMMARS:
                self._compiled.popitem(last=False)
        return compiled

    @staticmethod
    def _compile(compiler, spec: GrammarSpec):
        try:
            # JSON without free whitespace (json.dumps' separators): a small model given a choice of
            # whitespace between tokens can pad to max_tokens, and no client needs the padding
            if spec.kind == JSON:
                return compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
            if spec.kind == JSON_SCHEMA:
                return compiler.compile_json_schema(json.dumps(bounded_integers(json.loads(spec.guide))),
                                                    any_whitespace=False)
            if spec.kind == REGEX:
                return compiler.compile_regex(spec.guide)
            assert spec.kind == EBNF, spec.kind
            return compiler.compile_grammar(spec.guide)
        except (RuntimeError, ValueError) as e:
            raise ValueError(f"the {spec.kind} grammar cannot be compiled: {str(e).strip().splitlines()[0]}") from None

    def start(self, spec: GrammarSpec, max_tokens: int | None = None) -> GrammarState:
        """A new request's parse state, before its first output token; with `max_tokens`, its last
        tokens close the answer (state.Closing)."""
        compiled = self.compile(spec)
        return GrammarState(compiled, self.vocab_size, left=max_tokens, closing=self._closing)


def bounded_integers(schema):
    """The schema with every integer it leaves unbounded kept within SAFE_INTEGER."""
    if isinstance(schema, list):
        return [bounded_integers(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: bounded_integers(v) for k, v in schema.items()}
    kinds = out.get("type")
    if (kinds == "integer" or isinstance(kinds, list) and "integer" in kinds) and not (
            {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "enum", "const"} & set(out)):
        out |= {"minimum": -SAFE_INTEGER, "maximum": SAFE_INTEGER}
    return out


def closing_classes(decoded_vocab: list[bytes], vocab_size: int, stop_ids: list[int]) -> Closing:
    """The tokens that end an answer (state.Closing): the stop tokens; those made only of closing
    brackets and braces; a quote followed by nothing but those (closing a string, and what holds it);
    only commas (on to what the grammar still requires)."""
    brackets, quoted, commas = (torch.zeros(vocab_size, dtype=torch.bool) for _ in range(3))
    for i, text in enumerate(decoded_vocab[:vocab_size]):  # one pass: the set tests are C-speed
        if not text.strip() or len(text) > 8:
            continue
        chars = set(text)
        brackets[i] = chars <= BRACKETS
        quoted[i] = text[0] == QUOTE and set(text[1:]) <= BRACKETS
        commas[i] = chars <= COMMAS
    stops = torch.zeros(vocab_size, dtype=torch.bool)
    stops[list(stop_ids)] = True
    return Closing(*(pack(m) for m in (stops, brackets, quoted, commas)))
