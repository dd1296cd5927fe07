"""The rows of the results tables (docs/validation/index.md and, those marked `readme`, the
README): a sentence with figures in it and the page that explains them."""

from __future__ import annotations

from dataclasses import dataclass

from tools.docs_gen.figures import Figure


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
        "percentile closed loop per target, through vLLM's histograms on the replay engine",
        "judged windows missed, TTFT p95 100 ms {a} %, per-token ITL p99 40 ms {b} % (the "
        "simulator at replicas.max {c} / {d} %); ours {r} mean replicas",
        {
            "a": Figure("percentile_targets.json", "targets/ttft_p95/missed_pct", "f1"),
            "b": Figure("percentile_targets.json", "targets/itl_per_token_p99/missed_pct", "f1"),
            "c": Figure("percentile_targets.json", "targets/ttft_p95/at_max_missed_pct", "f1"),
            "d": Figure(
                "percentile_targets.json", "targets/itl_per_token_p99/at_max_missed_pct", "f1"
            ),
            "r": Figure("percentile_targets.json", "arms/ours/mean_replicas", "f2"),
        },
        "percentile-targets.md",
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
        "analyzer {t} / {tm}, reactive KEDA {r} / {rm}, fixed {f} / {fm}; {cpu} s CPU "
        "({wall} s wall at load {load}), {rss} MB peak RSS",
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
            "cpu": Figure("replay_trace.json", "cpu_s", "f0"),
            "wall": Figure("replay_trace.json", "wall_s", "f0"),
            "load": Figure("replay_trace.json", "load_average_before", "f0"),
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
