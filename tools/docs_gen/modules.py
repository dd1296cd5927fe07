"""docs/development/modules/: every module of model/, exporter/, bench/ and tools/ with the first
line of its docstring, one page per top-level folder."""

from __future__ import annotations

import ast
from pathlib import Path

from tools.docs_gen.config_keys import HEADER

ROOT = Path(__file__).resolve().parents[2]
TOPS = {
    "model": "pure math: the queueing model, calibration, the simulator (no I/O, clock or logging)",
    "exporter": "everything with I/O, by layer: base < config < collector < sizing < daemon < "
    "replay < cli, and testbed < replay (sizing and replay on their own pages)",
    "exporter/sizing": "the pure sizing layer: a deployment's cycle, the recommender, the evidence "
    "and the fleet plan",
    "exporter/replay": "the replay layer: traces, the simulated fleets, policies and scoring",
    "bench": "benchmarks (entry points at the top) and their helpers",
    "tools": "maintenance tools, such as this page's generator",
}
FOLDER = "docs/development/modules"
SKIPPED: tuple[str, ...] = ()


def summary(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    first = " ".join(doc.split("\n\n")[0].split())
    # The first sentence: a map line per module keeps each page within the docs' size limit.
    sentence = first.split(". ")[0].rstrip(".") + "." if first else ""
    return sentence.replace("|", "\\|") or "(no docstring)"


def pages() -> dict[str, str]:
    out: dict[str, str] = {}
    index = [
        HEADER,
        "# Module map",
        "",
        "Every module with the first paragraph of its docstring, read from the code.",
        "`tests/` mirrors `model/` and `exporter/`.",
        "",
    ]
    for top, about in TOPS.items():
        lines = [HEADER, f"# `{top}/`", "", about[:1].upper() + about[1:] + ".", ""]
        lines += ["| module | what it is |", "|---|---|"]
        # A folder with its own page is left out of its parent's (a page stays within its size).
        own = tuple(f"{t}/" for t in TOPS if t.startswith(f"{top}/"))
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(SKIPPED) or "__pycache__" in rel or (own and rel.startswith(own)):
                continue
            lines.append(f"| `{rel}` | {summary(path)} |")
        page = top.replace("/", "-")
        out[f"{FOLDER}/{page}.md"] = "\n".join(lines) + "\n"
        index.append(f"- [`{top}/`]({page}.md): {about}")
    out[f"{FOLDER}/index.md"] = "\n".join(index) + "\n"
    return out
