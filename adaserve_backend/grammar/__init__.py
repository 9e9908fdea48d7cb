"""Grammar-constrained decoding (structured output): what a request's grammar is (spec.py), its
compilation for the model's vocabulary, cached per grammar (compiler.py), and one request's parse state
and the token masks it gives (state.py). Speculation under a grammar: speculation/constrained.py."""
