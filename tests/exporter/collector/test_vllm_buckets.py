"""Histogram buckets: read per pod (summed over engines per le), checked, and windowed like the
counters (restarts count from zero; changed bounds or falling buckets are a counted problem)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from exporter.collector.observations import observe_deployment
from exporter.collector.pod_observation import Problem, observe_pod
from exporter.collector.sources import SourceRead
from exporter.collector.vllm_metrics import HistogramName, PodSample, parse_exposition

PROMPT = "vllm:request_prompt_tokens"


def exposition(
    buckets: dict[str, list[tuple[str, float]]],
    *,
    success: float = 10.0,
    start_s: float = 1000.0,
    total: float | None = None,
) -> str:
    """A pod's exposition: request_success and one prompt-length histogram per engine, given
    as engine -> [(le, cumulative count)]."""
    lines = [
        "# TYPE process_start_time_seconds gauge",
        f"process_start_time_seconds {start_s}",
        "# TYPE vllm:request_success_total counter",
        f'vllm:request_success_total{{engine="0",model_name="m"}} {success}',
        f"# TYPE {PROMPT} histogram",
    ]
    for engine, rows in buckets.items():
        for le, count in rows:
            lines.append(f'{PROMPT}_bucket{{engine="{engine}",le="{le}",model_name="m"}} {count}')
        count = rows[-1][1]
        lines.append(f'{PROMPT}_count{{engine="{engine}",model_name="m"}} {count}')
        lines.append(f'{PROMPT}_sum{{engine="{engine}",model_name="m"}} {total or 100.0 * count}')
    return "\n".join(lines) + "\n"


def sample(text: str, time_s: float = 100.0) -> PodSample:
    return parse_exposition(text, pod="p", time_s=time_s, model_name="m")


GOOD = [("10.0", 1.0), ("100.0", 6.0), ("1000.0", 9.0), ("+Inf", 10.0)]


def test_engines_are_summed_per_le() -> None:
    s = sample(exposition({"0": GOOD, "1": GOOD}))
    got = s.buckets[HistogramName.PROMPT_LEN]
    assert got.bounds == (10.0, 100.0, 1000.0)
    assert got.cumulative == (2.0, 12.0, 18.0, 20.0)
    assert s.bad_buckets == ()


@pytest.mark.parametrize(
    "engines",
    [
        {"0": [("10.0", 5.0), ("100.0", 3.0), ("+Inf", 10.0)]},  # falls with le
        {"0": [("10.0", 1.0), ("100.0", 3.0)]},  # no +Inf bucket
        {"0": [("ten", 1.0), ("+Inf", 3.0)]},  # an le that is no number
        {"0": GOOD, "1": [("10.0", 1.0), ("200.0", 6.0), ("1000.0", 9.0), ("+Inf", 10.0)]},
    ],
    ids=["not-monotone", "no-inf", "bad-le", "engines-differ"],
)
def test_a_broken_bucket_set_is_flagged_and_the_means_stay(engines: dict) -> None:  # type: ignore[type-arg]
    s = sample(exposition(engines))
    assert HistogramName.PROMPT_LEN not in s.buckets
    assert s.bad_buckets == (HistogramName.PROMPT_LEN,)
    assert s.histograms[HistogramName.PROMPT_LEN].count > 0  # _sum/_count still read
    later = sample(exposition(engines, success=20.0), time_s=130.0)
    obs = observe_pod(s, later)
    assert Problem.BAD_BUCKETS in obs.problems
    assert HistogramName.PROMPT_LEN not in obs.windows


def test_the_window_holds_the_bucket_increase() -> None:
    start = sample(exposition({"0": GOOD}))
    later = [("10.0", 4.0), ("100.0", 16.0), ("1000.0", 29.0), ("+Inf", 30.0)]
    end = sample(exposition({"0": later}, success=30.0), time_s=130.0)
    obs = observe_pod(start, end)
    window = obs.windows[HistogramName.PROMPT_LEN]
    assert window.counts.tolist() == [3.0, 7.0, 10.0, 0.0]
    assert (window.count, window.sum) == (20.0, 2000.0)
    assert Problem.BAD_BUCKETS not in obs.problems


def test_a_restart_counts_the_buckets_from_zero() -> None:
    start = sample(
        exposition(
            {"0": [("10.0", 50.0), ("100.0", 60.0), ("1000.0", 90.0), ("+Inf", 100.0)]},
            success=100.0,
        )
    )
    end = sample(exposition({"0": GOOD}, success=10.0, start_s=1050.0), time_s=130.0)
    obs = observe_pod(start, end)
    assert obs.reset
    assert obs.windows[HistogramName.PROMPT_LEN].counts.tolist() == [1.0, 5.0, 3.0, 1.0]


def test_bounds_that_change_give_no_window_and_a_problem() -> None:
    start = sample(exposition({"0": GOOD}))
    other = [("10.0", 4.0), ("50.0", 16.0), ("1000.0", 29.0), ("+Inf", 30.0)]
    end = sample(exposition({"0": other}, success=30.0), time_s=130.0)
    obs = observe_pod(start, end)
    assert HistogramName.PROMPT_LEN not in obs.windows
    assert Problem.BAD_BUCKETS in obs.problems
    assert obs.avg_input_tokens == pytest.approx(100.0)  # the mean does not need buckets


def test_a_bucket_that_falls_without_a_restart_gives_no_window() -> None:
    start = sample(exposition({"0": GOOD}))
    fell = [("10.0", 0.0), ("100.0", 16.0), ("1000.0", 29.0), ("+Inf", 30.0)]
    end = sample(exposition({"0": fell}, success=30.0), time_s=130.0)
    obs = observe_pod(start, end)
    assert HistogramName.PROMPT_LEN not in obs.windows
    assert Problem.BAD_BUCKETS in obs.problems


def test_pods_add_up_and_a_pod_with_other_bounds_is_left_out() -> None:
    later = [("10.0", 4.0), ("100.0", 16.0), ("1000.0", 29.0), ("+Inf", 30.0)]
    a0 = replace(sample(exposition({"0": GOOD})), pod="a")
    a1 = replace(sample(exposition({"0": later}, success=30.0), time_s=130.0), pod="a")
    b0, b1 = replace(a0, pod="b"), replace(a1, pod="b")
    obs = observe_deployment(SourceRead(100.0, (a0, b0)), SourceRead(130.0, (a1, b1)))
    assert obs.windows[HistogramName.PROMPT_LEN].counts.tolist() == [6.0, 14.0, 20.0, 0.0]
    assert Problem.BAD_BUCKETS not in obs.problems
    other = [("10.0", 4.0), ("50.0", 16.0), ("1000.0", 29.0), ("+Inf", 30.0)]
    c0 = replace(sample(exposition({"0": other})), pod="c")
    c1 = replace(sample(exposition({"0": other}, success=30.0), time_s=130.0), pod="c")
    obs = observe_deployment(SourceRead(100.0, (a0, c0)), SourceRead(130.0, (a1, c1)))
    assert Problem.BAD_BUCKETS in obs.problems
    assert obs.windows[HistogramName.PROMPT_LEN].count == 20.0  # pod a only
