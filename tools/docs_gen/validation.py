"""The results tables of docs/validation/index.md and README.md, built from named keys of the
bench JSON in bench/results/, the page of every figure with the run that produced it, and the
figures quoted inline in the docs pages.

Inline, a figure is marked with its file, key path and format, and the generator rewrites the
text between the markers: `<!--fig closed_loop.json scenarios/itl-bound/table/queueing/any_over/mean
f1-->2.0<!--/fig-->` (the key path may hold spaces; the file is the first word, the format the
last).

A figure is a JSON file and a key path: `/` separates keys, `[k=v,...]` picks the list item
whose fields match, and a trailing `|min` or `|max` reduces a list. A row is a sentence with
figures in it; `readme` rows also go to the README's short table."""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.docs_gen.config_keys import HEADER

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
FORMATS = {
    "pct0": lambda v: f"{100 * v:.0f}",
    "pct1": lambda v: f"{100 * v:.1f}",
    "pct2": lambda v: f"{100 * v:.2f}",
    "f0": lambda v: f"{v:.0f}",
    "f1": lambda v: f"{v:.1f}",
    "f2": lambda v: f"{v:.2f}",
    "f3": lambda v: f"{v:.3f}",
    "e3": lambda v: f"{v:.3e}",
    "int": lambda v: f"{int(v)}",
}


@dataclass(frozen=True)
class Figure:
    """One number: where it is (file, key path) and how it is printed."""

    file: str
    path: str
    fmt: str

    def value(self) -> Any:
        node: Any = json.loads((RESULTS / self.file).read_text())
        path, _, reduce = self.path.partition("|")
        for part in path.split("/"):
            pick = re.fullmatch(r"\[(.*)\]", part)
            if pick:
                wanted = dict(kv.split("=") for kv in pick.group(1).split(","))
                node = next(
                    item for item in node if all(str(item[k]) == v for k, v in wanted.items())
                )
            else:
                node = node[part]
        if reduce:
            return min(node) if reduce == "min" else max(node)
        return node

    def text(self) -> str:
        return FORMATS[self.fmt](self.value())


@dataclass(frozen=True)
class Row:
    """A line of the results table: what was measured, the sentence, its page."""

    what: str
    sentence: str  # with {name} placeholders for `figures`
    figures: dict[str, Figure]
    page: str  # under docs/validation/ (or another docs page), where the figures are explained
    readme: bool = False

    def render(self) -> str:
        return self.sentence.format(**{k: f.text() for k, f in self.figures.items()})


def _cl(scenario: str, arm: str, key: str = "any_over") -> Figure:
    return Figure("closed_loop.json", f"scenarios/{scenario}/table/{arm}/{key}/mean", "f1")


def _policy(name: str, key: str, fmt: str = "f2") -> Figure:
    return Figure("replay_trace.json", f"report/policies/{name}/{key}", fmt)


_T1 = "results/Llama-3.1-8B/paper"
_CLOSED = (
    "cycles over a target: ours {q} ({qo} outside pod loading), ours + look-ahead {la}, "
    "throughput analyzer {th}"
)
_PCT = "closed_loop_percentiles.json"
ROWS = (
    Row(
        "paper Table I, refitted (Llama-3.1-8B, H100)",
        "alpha {a} ms, beta {b} ms, gamma {g} ms; ITL / TTFT error {itl} / {ttft} % "
        "(paper 4.6 / 13.6 %)",
        {
            "a": Figure("paper_table1.json", f"{_T1}/params/alpha_ms", "f3"),
            "b": Figure("paper_table1.json", f"{_T1}/params/beta_ms", "e3"),
            "g": Figure("paper_table1.json", f"{_T1}/params/gamma_ms", "e3"),
            "itl": Figure("paper_table1.json", f"{_T1}/in_sample/itl/error", "pct2"),
            "ttft": Figure("paper_table1.json", f"{_T1}/in_sample/ttft/error", "pct2"),
        },
        "model.md",
        readme=True,
    ),
    Row(
        "model vs request-level simulation",
        "mean relative error TTFT {t} %, ITL {i} % (paper variant)",
        {
            "t": Figure("model_vs_sim.json", "overall/model_ttft_error", "pct1"),
            "i": Figure("model_vs_sim.json", "overall/model_itl_error", "pct1"),
        },
        "model.md",
        readme=True,
    ),
    *(
        Row(
            f"closed loop, {label}, 88 cycles",
            _CLOSED,
            {
                "q": _cl(scenario, "queueing"),
                "qo": _cl(scenario, "queueing", "any_over_outside_loading"),
                "la": _cl(scenario, "look-ahead"),
                "th": _cl(scenario, "throughput"),
            },
            "closed-loop.md",
            readme=scenario != "ttft-bound-lognormal",
        )
        for scenario, label in (
            ("ttft-bound", "TTFT-bound"),
            ("itl-bound", "ITL-bound"),
            ("ttft-bound-lognormal", "TTFT-bound, lognormal CV 1 lengths"),
        )
    ),
    Row(
        "closed loop, TTFT p95 100 ms + per-token ITL p99 40 ms",
        "cycles over p95 TTFT / p99 ITL: percentile arm {a} / {b} %, cost-matched mean arm "
        "{c} / {d} %, throughput analyzer {e} / {f} %",
        {
            "a": Figure(_PCT, "table/percentile/ttft_p95_over_pct", "f1"),
            "b": Figure(_PCT, "table/percentile/itl_p99_over_pct", "f1"),
            "c": Figure(_PCT, "table/mean-matched/ttft_p95_over_pct", "f1"),
            "d": Figure(_PCT, "table/mean-matched/itl_p99_over_pct", "f1"),
            "e": Figure(_PCT, "table/throughput/ttft_p95_over_pct", "f1"),
            "f": Figure(_PCT, "table/throughput/itl_p99_over_pct", "f1"),
        },
        "closed-loop.md",
    ),
    Row(
        "percentiles vs request-level simulation (Poisson arrivals)",
        "median error of TTFT p50-p99 {lo}-{hi} %, per-token ITL {ilo}-{ihi} %",
        {
            "lo": Figure("percentiles.json", "summary/poisson/errors/ttft/median_abs|min", "pct1"),
            "hi": Figure("percentiles.json", "summary/poisson/errors/ttft/median_abs|max", "pct1"),
            "ilo": Figure(
                "percentiles.json", "summary/poisson/errors/itl_per_token/median_abs|min", "pct1"
            ),
            "ihi": Figure(
                "percentiles.json", "summary/poisson/errors/itl_per_token/median_abs|max", "pct1"
            ),
        },
        "percentiles.md",
    ),
    Row(
        "`vllm-sizer replay`, 1 h, 50k requests, 4 policies",
        "replica-hours / windows meeting every target (of {n}): ours {o} / {om}, throughput "
        "analyzer {t} / {tm}, reactive KEDA {r} / {rm}, fixed {f} / {fm}; {wall} s wall, "
        "{rss} MB peak RSS",
        {
            "n": Figure("replay_trace.json", "report/windows", "int"),
            "o": _policy("ours", "replica_hours"),
            "om": _policy("ours", "all_targets/met", "int"),
            "t": _policy("throughput", "replica_hours"),
            "tm": _policy("throughput", "all_targets/met", "int"),
            "r": _policy("reactive", "replica_hours"),
            "rm": _policy("reactive", "all_targets/met", "int"),
            "f": _policy("fixed", "replica_hours"),
            "fm": _policy("fixed", "all_targets/met", "int"),
            "wall": Figure("replay_trace.json", "wall_s", "f0"),
            "rss": Figure("replay_trace.json", "peak_rss_mb", "f0"),
        },
        "../getting-started/replay.md",
        readme=True,
    ),
    Row(
        "daemon cycle, 1000 deployments",
        "{cpu} s CPU at B = 256 ({cpu4} s at B = 4096), {rss} MB peak RSS",
        {
            "cpu": Figure(
                "daemon_scale.json", "results/[deployments=1000,max_num_seqs=256]/cycle_cpu_s",
                "f2",
            ),
            "cpu4": Figure(
                "daemon_scale.json", "results/[deployments=1000,max_num_seqs=4096]/cycle_cpu_s",
                "f2",
            ),
            "rss": Figure(
                "daemon_scale.json", "results/[deployments=1000,max_num_seqs=256]/peak_rss_mb",
                "f0",
            ),
        },
        "speed.md",
        readme=True,
    ),
    Row(
        "model speed, B = 256 (compiled kernel)",
        "`analyze` one rate {a} us ({ar}x the numpy model), tuner refit {r} us ({rr}x)",
        {
            "a": Figure(
                "model_speed.json",
                "results/[case=analyze one rate,max_num_seqs=256,variant=refined]/today_us",
                "f1",
            ),
            "ar": Figure(
                "model_speed.json",
                "results/[case=analyze one rate,max_num_seqs=256,variant=refined]/ratio",
                "f1",
            ),
            "r": Figure(
                "model_speed.json",
                "results/[case=refit 10-point window,max_num_seqs=256,variant=refined]/today_us",
                "f0",
            ),
            "rr": Figure(
                "model_speed.json",
                "results/[case=refit 10-point window,max_num_seqs=256,variant=refined]/ratio",
                "f1",
            ),
        },
        "speed.md",
    ),
    Row(
        "soak (10 min, 20 deployments, API flood)",
        "{late} of {cycles} cycles over the period, faulty deployments at most {fmax} replica, "
        "RSS +{rss} MB after warm-up, {failed} API failures",
        {
            "late": Figure("soak.json", "cycles_over_period", "int"),
            "cycles": Figure("soak.json", "cycles", "int"),
            "fmax": Figure("soak.json", "faulty_max_desired_after_warmup", "int"),
            "rss": Figure("soak.json", "rss_growth_mb_after_warmup", "f1"),
            "failed": Figure("soak.json", "api_requests/failed", "int"),
        },
        "soak.md",
        readme=True,
    ),
    Row(
        "real vLLM (CPU build)",
        "sweep in-sample error TTFT {t} %, ITL {i} %; live steady cycles median error TTFT "
        "{lt} %, ITL {li} %",
        {
            "t": Figure("real_vllm_fit.json", "errors/in_sample/ttft/mean_abs_rel", "pct1"),
            "i": Figure("real_vllm_fit.json", "errors/in_sample/itl/mean_abs_rel", "pct1"),
            "lt": Figure("real_vllm_live.json", "summary/ttft_steady/median", "pct1"),
            "li": Figure("real_vllm_live.json", "summary/itl_steady/median", "pct1"),
        },
        "real-vllm.md",
        readme=True,
    ),
)
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
SPEED_MARKERS = ("<!-- model-speed:begin -->", "<!-- model-speed:end -->")
INLINE = re.compile(r"<!--fig (\S+) ([^>]+?) ([a-z0-9]+)-->(.*?)<!--/fig-->", re.S)


def inline(text: str) -> str:
    """`text` with every inline figure rewritten from its JSON."""

    def value(match: re.Match[str]) -> str:
        file, path, fmt = match.group(1), match.group(2), match.group(3)
        shown = Figure(file, path, fmt).text()
        return f"<!--fig {file} {path} {fmt}-->{shown}<!--/fig-->"

    return INLINE.sub(value, text)


def table(rows: tuple[Row, ...], link_prefix: str) -> str:
    lines = ["| what | result |", "|---|---|"]
    for row in rows:
        link = posixpath.normpath(link_prefix + row.page)
        lines.append(f"| [{row.what}]({link}) | {row.render()} |")
    return "\n".join(lines)


def _run(file: str) -> str:
    run = json.loads((RESULTS / file).read_text()).get("run")
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
    lines += ["", "## Runs", "", "| file | run |", "|---|---|"]
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


def speed_table() -> str:
    """bench/results/model_speed.json as a table: per case and B, the refined variant with the
    paper variant in parentheses."""
    rows = json.loads((RESULTS / "model_speed.json").read_text())["results"]
    by_key = {(r["case"], r["max_num_seqs"], r["variant"]): r for r in rows}
    lines = [
        "| operation | B | before: refined (paper) | now | ratio | goal |",
        "|---|---|---|---|---|---|",
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
