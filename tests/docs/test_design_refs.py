"""Every "§" citation in the code names a heading of a design page in docs/design/: a docstring
that cites "Tuner spec §7.3" fails here once the tuner pages lose their 7.3 heading.

A citation names its document ("Tuner spec §3", "collector-spec §5", "percentiles.md §2",
"paper §IX"); a bare "spec §N" is the model specification in model/queueing and
model/simulation and the tuner specification in model/calibration; "§3, §4" and "§1-2" carry the
name of the first to the rest."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

DESIGN = REPO_ROOT / "docs" / "design"
# Document -> its pages (a folder, or one page).
DOCUMENTS: dict[str, Path] = {
    "model": DESIGN / "model",
    "tuner": DESIGN / "tuner",
    "collector": DESIGN / "collector",
    "percentiles": DESIGN / "percentiles",
    "refinements": DESIGN / "refinements",
    "style": DESIGN / "style",
    "ecosystem": DESIGN / "ecosystem",
    "paper": DESIGN / "paper.md",
    "wva": DESIGN / "wva-throughput-analyzer.md",
}
# How the code names each document, matched case-insensitively just before a "§".
NAMES = (
    ("tuner spec", "tuner"),
    ("collector-spec", "collector"),
    ("refinements", "refinements"),
    ("percentiles", "percentiles"),
    ("ecosystem", "ecosystem"),
    ("paper", "paper"),
    ("wva-anchor", "wva"),
    ("style", "style"),
    ("spec", ""),  # the package's own specification
)
SECTION = r"(?:[0-9]+(?:\.[0-9]+)*|[IVX]+(?:-[A-Z])?)"
CITATION = re.compile(rf"§\s*({SECTION})(?:\s*-\s*§?\s*({SECTION}))?")
SEPARATOR = re.compile(r"^[\s,;]*(?:and\s*)?$")


def default_document(path: Path) -> str:
    if "calibration" in path.parts:
        return "tuner"
    return "collector" if "collector" in path.parts else "model"


def citations(path: Path, text: str) -> list[tuple[str, str, int]]:
    """(document, section, line) of every section a "§" in `text` cites."""
    found: list[tuple[str, str, int]] = []
    previous_end, previous_doc = -1, ""
    for match in CITATION.finditer(text):
        before = text[max(0, match.start() - 40) : match.start()]
        between = text[previous_end : match.start()] if previous_end >= 0 else None
        if between is not None and SEPARATOR.match(between) and previous_doc:
            doc = previous_doc
        else:
            # The name ending nearest the "§" wins; "collector-spec" over the "spec" in it.
            lowered, doc, best = before.lower(), "", (-1, 0)
            for name, target in NAMES:
                at = lowered.rfind(name)
                rank = (at + len(name), len(name)) if at >= 0 else (-1, 0)
                if rank > best:
                    best, doc = rank, target or default_document(path)
            if not doc:
                doc = default_document(path)
        line = text.count("\n", 0, match.start()) + 1
        found += [(doc, section, line) for section in match.groups() if section]
        previous_end, previous_doc = match.end(), doc
    return found


def headings(doc: str) -> dict[str, str]:
    """Section number of each of the document's headings -> its text up to the next heading:
    "## 7. Stability" -> "7", "### 7.3 Every later cycle" -> "7.3", "## IX ..." -> "IX"."""
    where = DOCUMENTS[doc]
    pages = sorted(where.glob("*.md")) if where.is_dir() else [where]
    out: dict[str, str] = {}
    for page in pages:
        parts = re.split(r"\n(?=#{1,4} )", "\n" + page.read_text())
        for part in parts:
            head = re.match(rf"#{{2,4}} ({SECTION})\.?\s", part)
            if head:
                out[head.group(1)] = part
    return out


def resolves(section: str, known: dict[str, str]) -> bool:
    """A heading, or item k of a numbered list under heading N for "N.k" ("§5.5": item 5 of §5)."""
    if section in known:
        return True
    parent, _, item = section.rpartition(".")
    return parent in known and re.search(rf"^{item}\. ", known[parent], re.M) is not None


def code_citations() -> list[tuple[str, str, str]]:
    out = []
    for top in ("model", "exporter"):
        for path in sorted((REPO_ROOT / top).rglob("*.py")):
            rel = str(path.relative_to(REPO_ROOT))
            cited = citations(path, path.read_text())
            out += [(f"{rel}:{line}", doc, sec) for doc, sec, line in cited]
    return out


def test_every_section_the_code_cites_is_a_heading_in_docs_design() -> None:
    cited = code_citations()
    assert len(cited) >= 100
    known = {doc: headings(doc) for doc in DOCUMENTS}
    missing = [
        f"{where}: {doc} §{sec}" for where, doc, sec in cited if not resolves(sec, known[doc])
    ]
    assert not missing, "citations without a heading in docs/design/:\n" + "\n".join(missing)


@pytest.mark.parametrize(
    ("text", "path", "expected"),
    [
        ("Tuner spec §3, §4, §10.", "model/calibration/f.py", ["tuner 3", "tuner 4", "tuner 10"]),
        ("Spec §2-4, refinements §6.", "model/q/x.py", ["model 2", "model 4", "refinements 6"]),
        ("(paper §IX) and spec §7.3", "model/calibration/t.py", ["paper IX", "tuner 7.3"]),
        ("collector-spec §5, ecosystem §1.6.", "exporter/c.py", ["collector 5", "ecosystem 1.6"]),
    ],
)
def test_citations_are_read_with_their_document(text: str, path: str, expected: list[str]) -> None:
    assert [f"{d} {s}" for d, s, _ in citations(Path(path), text)] == expected


def test_a_removed_heading_is_noticed(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("## 7. Sliding window\n\n1. first\n2. second\n\n### 7.4 Publication\n")
    DOCUMENTS["scratch"] = page
    try:
        known = headings("scratch")
        assert set(known) == {"7", "7.4"}
        assert resolves("7.4", known) and resolves("7.2", known)
        assert not resolves("7.3", known) and not resolves("8", known)
    finally:
        del DOCUMENTS["scratch"]
