"""The benchmark's prompt sets, built from the families of harness/prompt_sources.py, which the draft
never trains on (a test checks it prompt by prompt, by source file and by 8-gram overlap).

- `default`: functions to complete (coding), FAQ questions (chat), documentation passages to
  summarise (summary)
- `prompt-heavy`: the same families in shapes whose prompts are several times their outputs
- `repetitive`: shapes that repeat across requests by design (code to edit, a few questions asked
  again, a templated JSON answer); the only set a run deals with replacement (harness/workload.py)
"""

from __future__ import annotations

from .prompt_sources import (
    CODE_PACKAGES,
    code_family_prompts,
    networkx_function_sources,
    normalize,
    perl_faq_questions,
    python_faq_questions,
    python_howto_passages,
    python_whatsnew_passages,
)

__all__ = ["BENCHMARK_FAMILIES", "PROMPT_SETS", "REPEATING_SETS", "benchmark_prompts", "family_prompts", "normalize"]

SUMMARY_TASK = "Summarize the following text in three sentences.\n\n"
# category -> its families, each a source (harness/prompt_sources.py) in one task shape
BENCHMARK_FAMILIES = {"coding": tuple(CODE_PACKAGES), "chat": ("python-faq", "perl-faq"),
                      "summary": ("python-howto", "python-whatsnew")}


def family_prompts(family: str) -> list[tuple[str, bool]]:
    """One family's prompts as (text, wrap in the chat template): code is completed raw, as HumanEval is."""
    if family in CODE_PACKAGES:
        return [(p, False) for p in code_family_prompts(family)]
    if family.endswith("-faq"):
        return [(q, True) for q in {"python-faq": python_faq_questions, "perl-faq": perl_faq_questions}[family]()]
    passages = {"python-howto": python_howto_passages, "python-whatsnew": python_whatsnew_passages}[family]()
    return [(SUMMARY_TASK + p, True) for p in passages]


def _distinct(items: list[tuple[str, bool]]) -> list[tuple[str, bool]]:
    """Without prompts equal after normalising whitespace (a text two families share)."""
    return list({normalize(t): (t, chat) for t, chat in reversed(items)}.values())[::-1]


def benchmark_prompts() -> dict[str, list[tuple[str, bool]]]:
    """category -> [(prompt, wrap in the chat template)], every family of the category, distinct."""
    return {cat: _distinct([p for fam in fams for p in family_prompts(fam)])
            for cat, fams in BENCHMARK_FAMILIES.items()}


# ---- the prompt-heavy set: the same families, each prompt several times longer ------------------------
SHARED_CONTEXT_PASSAGES = 2  # the chat questions' shared context: this many HOWTO passages (~300-600 tokens)


def prompt_heavy_prompts() -> dict[str, list[tuple[str, bool]]]:
    """The same families as `benchmark_prompts`, in the shapes prompt-heavy traffic has (issue 40):
    code completed after the source that precedes it (two earlier functions of the same package as
    context), questions asked over one long shared context (a system prompt, as assistants and RAG
    send), and longer passages to summarise (two consecutive ones of one source)."""
    howto = python_howto_passages()
    context = "\n\n".join(howto[:SHARED_CONTEXT_PASSAGES])
    coding = []
    for fam in CODE_PACKAGES:
        code = code_family_prompts(fam)
        coding += [("\n".join(code[i - 2 : i + 1]), False) for i in range(2, len(code))]
    summary = []
    for passages in (howto[SHARED_CONTEXT_PASSAGES:], python_whatsnew_passages()):
        summary += [(SUMMARY_TASK + passages[i] + "\n\n" + passages[i + 1], True)
                    for i in range(0, len(passages) - 1, 2)]
    questions = python_faq_questions() + perl_faq_questions()
    return {
        "coding": coding,
        "chat": [(f"Answer using the documentation below.\n\n{context}\n\nQuestion: {q}", True) for q in questions],
        "summary": summary,
    }


# ---- the repetitive set: traffic that repeats itself across requests (issue 45) -----------------------
REPEATED_QUESTIONS = 8  # a support bot's pool: the same questions asked again and again
EDIT_TASK = "Add type hints to the following Python function. Reply with the whole function only.\n\n"
JSON_TASK = ('Describe the text below as a JSON object with the keys "topic", "audience", "difficulty" and '
             '"key_terms" (a list of strings). Reply with the JSON only.\n\n')


def repetitive_prompts() -> dict[str, list[tuple[str, bool]]]:
    """The benchmark's families in shapes that repeat across requests: code to edit, whose answer
    copies the code (coding); a small pool of questions asked again (chat); passages described as
    JSON with one fixed set of keys, a templated answer (summary)."""
    return {
        "coding": [(EDIT_TASK + code, True) for code in networkx_function_sources()],
        "chat": [(q, True) for q in python_faq_questions()[:REPEATED_QUESTIONS]],
        "summary": [(JSON_TASK + p, True) for p in python_howto_passages()],
    }


PROMPT_SETS = {"default": benchmark_prompts, "prompt-heavy": prompt_heavy_prompts, "repetitive": repetitive_prompts}
# sets whose prompts a run deals with replacement: repeats are what they measure
REPEATING_SETS = frozenset({"repetitive"})
