"""Product code cites the docs page that explains a choice (which links on to its evidence in the
dated notebook), never the notebook itself, and every `docs/<page>.md#<section>` it cites exists."""

from __future__ import annotations

import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]
PRODUCT = ("adaserve_backend", "model_repository", "client")
CITE = re.compile(r"docs/([\w-]+\.md)#([\w-]+)")


def product_files() -> list[pathlib.Path]:
    out = subprocess.run(["git", "ls-files", *PRODUCT], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / f for f in out.stdout.split() if f.endswith((".py", ".pbtxt", ".cpp", ".h", ".json"))]


def slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: pathlib.Path) -> set[str]:
    lines = page.read_text().splitlines()
    return {slug(line.lstrip("#")) for line in lines if line.startswith("#")} | set(
        re.findall(r'<a id="([\w-]+)">', page.read_text()))


def test_product_code_cites_docs_pages_not_the_experiments_notebook():
    into_notebook = [f"{p.relative_to(ROOT)}" for p in product_files() if "experiments.md" in p.read_text()]
    assert not into_notebook, f"cite the docs page that explains the choice instead: {into_notebook}"


def test_every_docs_section_the_code_cites_exists():
    pages: dict[str, set[str]] = {}
    broken = []
    for p in product_files():
        for page, section in CITE.findall(p.read_text()):
            if page not in pages:
                path = ROOT / "docs" / page
                pages[page] = anchors(path) if path.exists() else set()
            if section not in pages[page]:
                broken.append(f"{p.relative_to(ROOT)}: docs/{page}#{section}")
    assert not broken, broken
