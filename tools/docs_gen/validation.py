"""The results tables of docs/validation/index.md and README.md, the model-speed table of
docs/validation/speed.md, the page of every figure with the run that produced it, and the
figures quoted inline in the docs pages, all from bench/results/*.json."""

from __future__ import annotations

import json
import posixpath
from typing import Any

from tools.docs_gen import figures
from tools.docs_gen.config_keys import HEADER
from tools.docs_gen.figures import INLINE, ROOT, inline
from tools.docs_gen.results_rows import ROWS, Row

BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
SPEED_MARKERS = ("<!-- model-speed:begin -->", "<!-- model-speed:end -->")


def table(rows: tuple[Row, ...], link_prefix: str) -> str:
    lines = ["| what | result |", "|---|---|"]
    for row in rows:
        link = posixpath.normpath(link_prefix + row.page)
        lines.append(f"| [{row.what}]({link}) | {row.render()} |")
    return "\n".join(lines)


def _run(file: str) -> str:
    run = json.loads((figures.RESULTS / file).read_text()).get("run")
    if not isinstance(run, dict):
        return "not recorded (run before the envelope)"
    load = run["machine"]["load_average_start"][0], run["machine"]["load_average_end"][0]
    return (
        f"`{run['commit'][:10]}`{' (uncommitted changes)' if run['dirty'] else ''}, "
        f"{run['date']}, {run['machine']['cores']} cores, load {load[0]:g} -> {load[1]:g}, "
        f"`{run['command']}`"
    )


def figures_page() -> str:
    lines = [
        HEADER,
        "# Figures and their runs",
        "",
        "Every figure the results tables quote, with the JSON key it is read from and the run",
        "that wrote the file (commit, date, cores, 1-minute load average at start and end,",
        "command), from the file's `run` envelope.",
        "",
        "| figure | value | file and key |",
        "|---|---|---|",
    ]
    files: dict[str, None] = {}
    for row in ROWS:
        for name, fig in row.figures.items():
            files[fig.file] = None
            lines.append(f"| {row.what}: `{name}` | {fig.text()} | `{fig.file}`: `{fig.path}` |")
    for page in sorted((ROOT / "docs").rglob("*.md")):
        for match in INLINE.finditer(page.read_text()):
            files[match.group(1)] = None
    lines += ["", "## Runs", "", "Every file a table or a page quotes:", ""]
    lines += ["| file | run |", "|---|---|"]
    lines += [f"| `{file}` | {_run(file)} |" for file in files]
    return "\n".join(lines) + "\n"


def splice(text: str, block: str, begin: str = BEGIN, end: str = END) -> str:
    """`text` with the part between the markers replaced by `block`."""
    first, last = text.index(begin) + len(begin), text.index(end)
    return text[:first] + "\n" + block + "\n" + text[last:]


def _time(us: float) -> str:
    if us < 10:
        return f"{us:.1f} us"
    if us < 1000:
        return f"{us:.0f} us"
    return f"{us / 1000:.2f} ms" if us < 10_000 else f"{us / 1000:.1f} ms"


def _before(row: dict[str, Any]) -> str:
    """The kernel before issue 44 (runs from before it was timed: "-")."""
    us = row.get("before_issue44_us")
    return "-" if us is None else _time(float(us))


def speed_table() -> str:
    """bench/results/model_speed.json as a table: per case and B, the refined variant with the
    paper variant in parentheses."""
    rows = json.loads((figures.RESULTS / "model_speed.json").read_text())["results"]
    by_key = {(r["case"], r["max_num_seqs"], r["variant"]): r for r in rows}
    lines = [
        "| operation | B | before: refined (paper) | kernel before #44 | now | ratio | goal |",
        "|---|---|---|---|---|---|---|",
    ]
    seen: dict[tuple[str, int], None] = {}
    for r in rows:
        seen[(r["case"], r["max_num_seqs"])] = None
    for case, batch in sorted(seen, key=lambda k: (k[1], list(seen).index(k))):
        ref, pap = by_key[(case, batch, "refined")], by_key[(case, batch, "paper")]
        goal = " and ".join(
            ([f"{_time(ref['target_us'])}"] if ref["target_us"] else [])
            + ([f">= {ref['target_ratio']:g}x"] if ref["target_ratio"] else [])
        )
        verdict = f"{goal}: {'met' if ref['met'] else 'missed'}" if goal else ""
        lines.append(
            f"| {case} | {batch} | {_time(ref['baseline_us'])} ({_time(pap['baseline_us'])}) | "
            f"{_before(ref)} ({_before(pap)}) | "
            f"{_time(ref['today_us'])} ({_time(pap['today_us'])}) | "
            f"{ref['ratio']:.1f}x ({pap['ratio']:.1f}x) | {verdict} |"
        )
    return "\n".join(lines)


def pages() -> dict[str, str]:
    readme = (ROOT / "README.md").read_text()
    index = (ROOT / "docs" / "validation" / "index.md").read_text()
    out = {
        "README.md": splice(readme, table(tuple(r for r in ROWS if r.readme), "docs/validation/")),
        "docs/validation/index.md": inline(splice(index, table(ROWS, ""))),
        "docs/validation/figures.md": figures_page(),
    }
    speed = (ROOT / "docs" / "validation" / "speed.md").read_text()
    out["docs/validation/speed.md"] = inline(splice(speed, speed_table(), *SPEED_MARKERS))
    for page in sorted((ROOT / "docs").rglob("*.md")):
        rel = page.relative_to(ROOT).as_posix()
        text = page.read_text()
        if rel not in out and INLINE.search(text):
            out[rel] = inline(text)
    return out
