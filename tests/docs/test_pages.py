"""The documentation's shape: sizes, links that resolve, and the newcomer's path from the README."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import REPO_ROOT

README = REPO_ROOT / "README.md"
DOCS = REPO_ROOT / "docs"
README_LIMIT = 10240
PAGE_LIMIT = 15 * 1024
LINK = re.compile(r"\]\(([^)\s]+)\)")
RECIPE = re.compile(r"<!-- laptop-recipe:begin -->\n(.*?)<!-- laptop-recipe:end -->", re.S)


def pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def test_readme_and_every_page_fit_their_size() -> None:
    assert len(README.read_bytes()) <= README_LIMIT
    big = {str(p.relative_to(REPO_ROOT)): len(p.read_bytes()) for p in pages()}
    assert {p: n for p, n in big.items() if n > PAGE_LIMIT} == {}


def _targets(page: Path) -> list[tuple[str, Path]]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    out = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        out.append((target, (page.parent / target.split("#")[0]).resolve()))
    return out


def test_every_relative_link_resolves() -> None:
    broken = [
        f"{page.relative_to(REPO_ROOT)}: {target}"
        for page in [README, *pages()]
        for target, path in _targets(page)
        if not path.exists()
    ]
    assert broken == []


def test_kubernetes_steps_and_troubleshooting_are_one_link_from_the_readme() -> None:
    linked = {path for _, path in _targets(README)}
    assert DOCS / "operate" / "kubernetes.md" in linked
    assert DOCS / "operate" / "troubleshooting.md" in linked


def test_the_laptop_page_has_the_readmes_recipe() -> None:
    (readme,) = RECIPE.findall(README.read_text())
    (page,) = RECIPE.findall((DOCS / "getting-started" / "laptop.md").read_text())
    assert page == readme


def test_the_readme_has_what_a_newcomer_needs_first() -> None:
    text = README.read_text()
    for needed in (
        "```mermaid",  # the cycle
        "make run",
        "make test",
        "Prerequisites:",
        "## Deploy in 5 steps",
        "<!-- results:begin -->",
        "## Documentation",
    ):
        assert needed in text, needed
    steps = re.findall(r"^\d\. \*\*", text[text.index("## Deploy in 5 steps") :], re.M)
    assert len(steps) == 5
