"""The benchmark's prompt families: offline, built from what is installed, and disjoint from every
family the draft model is trained on (a test checks it prompt by prompt).

- coding, `networkx-functions`: signature + docstring summary of public functions in the installed
  `networkx` package's `algorithms/` sources, to complete (HumanEval-style)
- chat, `python-faq`: the questions of the Python FAQ (Debian's `python3.11-doc`:
  `faq/*.rst.txt`), as a user would ask them
- summary, `python-howto`: prose passages of the Python HOWTOs (same package: `howto/*.rst.txt`),
  to summarise

The draft trains on other families (tools/draft/data.py: other packages' functions and docstrings,
HumanEval, templated instructions); tools that build training data must leave the families above out.
"""

from __future__ import annotations

import ast
import glob
import itertools
import os
import re
import warnings
from collections.abc import Iterator
from functools import cache

BENCHMARK_FAMILIES = {"coding": "networkx-functions", "chat": "python-faq", "summary": "python-howto"}
DOC_GLOB = "/usr/share/doc/python3*/html/_sources"
SUMMARY_TASK = "Summarize the following text in three sentences.\n\n"


def _doc_sources() -> str:
    found = sorted(glob.glob(DOC_GLOB))
    if not found:
        raise FileNotFoundError("the benchmark's chat and summary prompts come from the Python documentation: "
                                "apt-get install python3.11-doc (make setup installs it)")
    return found[-1]


def normalize(text: str) -> str:
    """What counts as the same prompt: equal after collapsing whitespace."""
    return " ".join(text.split())


# ---- coding: complete a function from its signature and docstring ---------------------------------
def function_prompt(node: ast.FunctionDef) -> str | None:
    doc = ast.get_docstring(node)
    if node.name.startswith("_") or not doc:
        return None
    summary = doc.split("\n\n")[0].strip()
    if not 20 <= len(summary) <= 400 or "\n    " in summary:
        return None
    body = "\n    ".join(summary.splitlines())
    return f"def {node.name}({ast.unparse(node.args)}):\n    \"\"\"{body}\n    \"\"\"\n"


def python_sources(root: str) -> list[str]:
    return sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True))


def parsed_sources(paths: list[str]) -> Iterator[ast.Module]:
    """The syntax trees of the files that parse (installed packages ship a few that do not)."""
    for _, tree in parsed_files(paths):
        yield tree


def parsed_files(paths: list[str]) -> Iterator[tuple[str, ast.Module]]:
    """(path, syntax tree) of each file that parses."""
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f, warnings.catch_warnings():
                warnings.simplefilter("ignore")
                tree = ast.parse(f.read())
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        yield path, tree


def source_function_prompts(paths: list[str]) -> tuple[str, ...]:
    """Completion prompts of the documented public top-level functions in these files (tests skipped);
    the draft's training families use the same builder on other packages."""
    out = []
    for tree in parsed_sources([p for p in paths if "/tests/" not in p and "/test/" not in p]):
        out += [p for n in tree.body if isinstance(n, ast.FunctionDef) and (p := function_prompt(n))]
    return tuple(dict.fromkeys(out))


@cache
def networkx_function_prompts() -> tuple[str, ...]:
    import networkx

    return source_function_prompts(python_sources(os.path.join(os.path.dirname(networkx.__file__), "algorithms")))


# ---- chat: the Python FAQ's questions --------------------------------------------------------------
@cache
def python_faq_questions() -> tuple[str, ...]:
    out = []
    for path in sorted(glob.glob(os.path.join(_doc_sources(), "faq", "*.rst.txt"))):
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
        for line, under in itertools.pairwise(lines):  # rst section titles: a line underlined with = - ~ or ^
            title = line.strip()
            if title.endswith("?") and re.fullmatch(r"[=\-~^]{3,}", under.strip()):
                out.append(re.sub(r"``?([^`]+)``?", r"\1", title))
    return tuple(dict.fromkeys(out))


# ---- summary: prose passages of the HOWTOs -----------------------------------------------------------
def _prose(paragraph: str) -> bool:
    """Running text: not an indented code block, a directive, a table, a list or a heading."""
    p = paragraph.strip("\n")
    return (len(p) > 80 and not p[:1].isspace() and "\n " not in p
            and not p.startswith(("..", "::", ">>>", "$", "|", "+", "=", "*", "-", "#")))


@cache
def python_howto_passages(min_chars: int = 700, max_chars: int = 1600) -> tuple[str, ...]:
    out = []
    for path in sorted(glob.glob(os.path.join(_doc_sources(), "howto", "*.rst.txt"))):
        with open(path, encoding="utf-8") as f:
            paragraphs = [" ".join(p.split()) for p in f.read().split("\n\n") if _prose(p)]
        passage = ""
        for p in paragraphs:
            p = re.sub(r":\w+:`~?([^`]+)`", r"\1", p).replace("``", "")
            passage = f"{passage}\n\n{p}" if passage else p
            if len(passage) >= min_chars:
                out.append(passage[:max_chars])
                passage = ""
    return tuple(dict.fromkeys(out))


def benchmark_prompts() -> dict[str, list[tuple[str, bool]]]:
    """category -> [(prompt, wrap in the chat template)]: code is completed raw, as HumanEval is."""
    return {
        "coding": [(p, False) for p in networkx_function_prompts()],
        "chat": [(p, True) for p in python_faq_questions()],
        "summary": [(SUMMARY_TASK + p, True) for p in python_howto_passages()],
    }


# ---- the prompt-heavy set: the same families, each prompt several times longer ------------------------
SHARED_CONTEXT_PASSAGES = 2  # the chat questions' shared context: this many HOWTO passages (~300-600 tokens)


def prompt_heavy_prompts() -> dict[str, list[tuple[str, bool]]]:
    """The same families as `benchmark_prompts`, in the shapes prompt-heavy traffic has (issue 40):
    code completed after the source that precedes it (two earlier functions as context), questions
    asked over one long shared context (a system prompt, as assistants and RAG send), and longer
    passages to summarise (two consecutive ones). Prompts are several times their outputs."""
    code, faq, howto = networkx_function_prompts(), python_faq_questions(), python_howto_passages()
    context = "\n\n".join(howto[:SHARED_CONTEXT_PASSAGES])
    passages = howto[SHARED_CONTEXT_PASSAGES:]
    return {
        "coding": [("\n".join(code[i - 2 : i + 1]), False) for i in range(2, len(code))],
        "chat": [(f"Answer using the documentation below.\n\n{context}\n\nQuestion: {q}", True) for q in faq],
        "summary": [(SUMMARY_TASK + passages[i] + "\n\n" + passages[i + 1], True)
                    for i in range(0, len(passages) - 1, 2)],
    }


# ---- the repetitive set: traffic that repeats itself across requests (issue 45) -----------------------
REPEATED_QUESTIONS = 8  # a support bot's pool: the same questions asked again and again
EDIT_TASK = "Add type hints to the following Python function. Reply with the whole function only.\n\n"
JSON_TASK = ('Describe the text below as a JSON object with the keys "topic", "audience", "difficulty" and '
             '"key_terms" (a list of strings). Reply with the JSON only.\n\n')


@cache
def networkx_function_sources(min_lines: int = 4, max_lines: int = 20) -> tuple[str, ...]:
    """Whole public top-level functions of networkx's algorithms, docstrings removed (code to edit)."""
    import networkx

    root = os.path.join(os.path.dirname(networkx.__file__), "algorithms")
    out = []
    for tree in parsed_sources([p for p in python_sources(root) if "/tests/" not in p]):
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                if ast.get_docstring(node):
                    node.body = node.body[1:] or [ast.Pass()]
                node.decorator_list = []
                code = ast.unparse(node)
                if min_lines <= code.count("\n") + 1 <= max_lines:
                    out.append(code)
    return tuple(dict.fromkeys(out))


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
