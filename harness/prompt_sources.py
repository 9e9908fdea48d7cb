"""Where the benchmark's prompts come from: text that is installed (no downloads) and that the draft
never trains on (tools/draft/data.py reads other packages; a test compares the two by source file and
by 8-gram overlap).

- coding: signature + docstring summary of the documented public functions of installed packages the
  draft never reads (`networkx`, `mpmath`, `_pytest`, `jinja2`), to complete (HumanEval-style)
- chat: the questions of the Python FAQ (Debian's `python3.11-doc`, `faq/*.rst.txt`) and of the Perl
  FAQ (Debian's `perl-doc`, `perlfaq1-9`), as a user would ask them
- summary: prose passages of the Python HOWTOs and of the "What's New" notes (`python3.11-doc`)

Every family is large enough that a whole benchmark run deals each prompt at most once
(harness/workload.py's PromptDeck).
"""

from __future__ import annotations

import ast
import glob
import importlib.util
import itertools
import os
import re
import warnings
from collections.abc import Iterator
from functools import cache

DOC_GLOB = "/usr/share/doc/python3*/html/_sources"
PERLFAQ_GLOB = "/usr/share/perl/*/pod/perlfaq[1-9].pod"
# package folders that hold another project's copy (pip's _vendor, torch's _vendor/packaging): its text
# belongs to that project, whichever package ships it
VENDORED_DIRS = ("_vendor", "vendor", "_vendored", "vendored", "extern", "_extern", "third_party")
CODE_PACKAGES = {"networkx-functions": "networkx", "mpmath-functions": "mpmath", "pytest-functions": "_pytest",
                 "jinja2-functions": "jinja2"}


def normalize(text: str) -> str:
    """What counts as the same prompt: equal after collapsing whitespace."""
    return " ".join(text.split())


def _installed(glob_pattern: str, hint: str) -> list[str]:
    found = sorted(glob.glob(glob_pattern))
    if not found:
        raise FileNotFoundError(f"the benchmark's prompts read {glob_pattern}: {hint} (make setup installs it)")
    return found


def _doc_sources() -> str:
    return _installed(DOC_GLOB, "apt-get install python3.11-doc")[-1]


# ---- code: complete a function from its signature and docstring ---------------------------------
def vendored(path: str) -> bool:
    return any(part in VENDORED_DIRS for part in path.split(os.sep))


def package_root(name: str) -> str:
    """A package's folder, found without importing it (torch, sympy take seconds)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"package {name} is not installed")
    return spec.submodule_search_locations[0]


def python_sources(root: str) -> list[str]:
    """The package's own .py files: vendored copies of other projects left out."""
    return sorted(p for p in glob.glob(os.path.join(root, "**", "*.py"), recursive=True)
                  if not vendored(os.path.relpath(p, root)))


def parsed_files(paths: list[str]) -> Iterator[tuple[str, ast.Module]]:
    """(path, syntax tree) of each file that parses (installed packages ship a few that do not)."""
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f, warnings.catch_warnings():
                warnings.simplefilter("ignore")
                tree = ast.parse(f.read())
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        yield path, tree


def function_prompt(node: ast.FunctionDef) -> str | None:
    doc = ast.get_docstring(node)
    if node.name.startswith("_") or not doc:
        return None
    summary = doc.split("\n\n")[0].strip()
    if not 20 <= len(summary) <= 400 or "\n    " in summary:
        return None
    body = "\n    ".join(summary.splitlines())
    return f"def {node.name}({ast.unparse(node.args)}):\n    \"\"\"{body}\n    \"\"\"\n"


def without_tests(paths: list[str]) -> list[str]:
    return [p for p in paths if "/tests/" not in p and "/test/" not in p and "/testing/" not in p]


def source_function_prompts(paths: list[str]) -> tuple[str, ...]:
    """Completion prompts of the documented public top-level functions in these files (tests skipped);
    the draft's training families use the same builder on other packages."""
    out = []
    for _, tree in parsed_files(without_tests(paths)):
        out += [p for n in tree.body if isinstance(n, ast.FunctionDef) and (p := function_prompt(n))]
    return tuple(dict.fromkeys(out))


def code_family_sources(family: str) -> list[str]:
    """The files a coding family reads."""
    return without_tests(python_sources(package_root(CODE_PACKAGES[family])))


@cache
def code_family_prompts(family: str) -> tuple[str, ...]:
    return source_function_prompts(code_family_sources(family))


@cache
def networkx_function_sources(min_lines: int = 4, max_lines: int = 20) -> tuple[str, ...]:
    """Whole public top-level functions of networkx's algorithms, docstrings removed (code to edit)."""
    root = os.path.join(package_root("networkx"), "algorithms")
    out = []
    for _, tree in parsed_files(without_tests(python_sources(root))):
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                if ast.get_docstring(node):
                    node.body = node.body[1:] or [ast.Pass()]
                node.decorator_list = []
                code = ast.unparse(node)
                if min_lines <= code.count("\n") + 1 <= max_lines:
                    out.append(code)
    return tuple(dict.fromkeys(out))


# ---- chat: FAQ questions ------------------------------------------------------------------------------
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


POD_ESCAPES = {"lt": "<", "gt": ">", "verbar": "|", "sol": "/"}


def _pod_text(text: str) -> str:
    """POD markup (C<code>, I<italic>, L<link>, E<gt>, with any number of brackets) as plain text."""
    text = re.sub(r"E<(\w+)>", lambda m: POD_ESCAPES.get(m.group(1), ""), text)
    for _ in range(3):  # nested codes
        text = re.sub(r"[A-Z](<+)\s*(.*?)\s*\1*>+", lambda m: m.group(2).replace("<<", "<"), text)
    return text


@cache
def perl_faq_questions() -> tuple[str, ...]:
    out = []
    for path in _installed(PERLFAQ_GLOB, "apt-get install perl-doc"):
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("=head2 ") and line.rstrip().endswith("?"):
                    out.append(_pod_text(line[len("=head2 "):].strip()))
    return tuple(dict.fromkeys(out))


# ---- summary: prose passages of the Python documentation ---------------------------------------------
def _prose(paragraph: str) -> bool:
    """Running text: not an indented code block, a directive, a table, a list or a heading."""
    p = paragraph.strip("\n")
    return (len(p) > 80 and not p[:1].isspace() and "\n " not in p
            and not p.startswith(("..", "::", ">>>", "$", "|", "+", "=", "*", "-", "#")))


def doc_passages(folder: str, min_chars: int = 700, max_chars: int = 1600) -> tuple[str, ...]:
    """Consecutive prose paragraphs of one folder of the Python docs, joined to at least `min_chars`."""
    out = []
    for path in sorted(glob.glob(os.path.join(_doc_sources(), folder, "*.rst.txt"))):
        with open(path, encoding="utf-8") as f:
            paragraphs = [" ".join(p.split()) for p in f.read().split("\n\n") if _prose(p)]
        passage = ""
        for p in paragraphs:
            p = re.sub(r":[\w:]+:`~?([^`]+)`", r"\1", p).replace("``", "")
            passage = f"{passage}\n\n{p}" if passage else p
            if len(passage) >= min_chars:
                out.append(passage[:max_chars])
                passage = ""
    return tuple(dict.fromkeys(out))


@cache
def python_howto_passages() -> tuple[str, ...]:
    return doc_passages("howto")


@cache
def python_whatsnew_passages() -> tuple[str, ...]:
    return doc_passages("whatsnew")
