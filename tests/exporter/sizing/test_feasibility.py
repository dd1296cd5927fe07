"""A target is said infeasible only when the model at replicas.max cannot meet it: in the
recommendation, the exported gauge, the log, the what-if answer and `plan`."""

from __future__ import annotations

import logging

import pytest

from exporter.cli.main import main
from exporter.config.values import SloConfig
from exporter.daemon.log_lines import InfeasibleTargets
from exporter.sizing.feasibility import (
    infeasible_at_max,
    prefill_step_ms,
    single_targets,
    target_names,
)
from exporter.sizing.recommender import Reason, Recommender
from exporter.sizing.what_if import what_if
from model import LatencyMetric, PercentileTarget, ServerConfig, replicas_for_slo
from tests.exporter.sizing.test_recommender import LLAMA, SHAPE, deployment, observation

TTFT_P95 = PercentileTarget(LatencyMetric.TTFT, 0.95, 300.0)
# 1024-token prompts: a step carrying one prefill lasts ~27 ms on Llama, above 20 ms, so this
# tail is met only at very light load per replica.
ITL_P99 = PercentileTarget(LatencyMetric.ITL_PER_TOKEN, 0.99, 20.0)
SLO = SloConfig(ttft_ms=50.0, percentiles=(TTFT_P95, ITL_P99))


def _alone(target: PercentileTarget, rate: float) -> int | None:
    return replicas_for_slo(rate, LLAMA, ServerConfig(), SHAPE, percentiles=(target,)).replicas


def test_targets_are_named_and_judged_alone() -> None:
    assert target_names(50.0, None, SLO.percentiles) == ("ttft_mean", "ttft_p95",
                                                         "itl_per_token_p99")  # fmt: skip
    assert [n for n, _ in single_targets(SLO)] == list(target_names(50.0, None, SLO.percentiles))


def test_only_the_targets_max_replicas_cannot_meet_are_infeasible() -> None:
    dep = deployment(slo=SLO, max_replicas=4)
    rate = 6.0
    assert (_alone(TTFT_P95, rate) or 99) <= 4 < (_alone(ITL_P99, rate) or 99)
    found = infeasible_at_max(dep, LLAMA, SHAPE, None, total_rps=rate, needed=None)
    assert found == ("itl_per_token_p99",)
    # The joint plan within replicas.max: nothing is infeasible, and nothing is evaluated.
    assert infeasible_at_max(dep, LLAMA, SHAPE, None, total_rps=rate, needed=4) == ()
    # At a load one replica carries, every target is met at 4 replicas.
    light = 0.01
    assert infeasible_at_max(dep, LLAMA, SHAPE, None, total_rps=light, needed=None) == ()


def test_the_recommendation_the_what_if_answer_and_the_log_say_which() -> None:
    dep = deployment(slo=SLO, max_replicas=4)
    decision = Recommender(dep).decide(0.0, observation(6.0, 2), LLAMA, SHAPE)
    assert decision.reason is Reason.MAX_REPLICAS and decision.desired_replicas == 4
    assert decision.infeasible_targets == ("itl_per_token_p99",)
    body = what_if(dep, LLAMA, SHAPE, None, 6.0, 2, ()).to_json()
    assert body["infeasible_targets"] == ["itl_per_token_p99"] and body["max_replicas"] == 4
    assert what_if(dep, LLAMA, SHAPE, None, 0.01, 1, ()).to_json()["infeasible_targets"] == []


def test_the_log_warns_once_per_change(caplog: pytest.LogCaptureFixture) -> None:
    watch = InfeasibleTargets(logging.getLogger("t"))
    with caplog.at_level(logging.INFO, logger="t"):
        for _ in range(3):
            watch.note("d", ("itl_per_token_p99",), 4, 6.0)
        watch.note("d", (), 4, 1.0)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "itl_per_token_p99" in warnings[0].getMessage()
    assert "replicas.max=4" in warnings[0].getMessage()
    assert caplog.records[-1].levelno == logging.INFO


def test_plan_says_which_target_max_replicas_cannot_meet_and_what_sets_the_tail(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["plan", "--slo", "itl.p99_ms=20", "--ttft-ms", "500", "--load", "6", "6",
            "--max-replicas", "4"]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "infeasible at 4 replicas: itl_per_token_p99" in out
    step = prefill_step_ms(LLAMA, ServerConfig(), SHAPE)
    assert step > 20.0 and f"lasts about {step:.3g} ms" in out
    assert "capacity is set by prefill interleaving" in out
    with pytest.raises(SystemExit) as exited:
        main(["plan", "--max-replicas", "0"])
    assert exited.value.code == 2
    assert "argument --max-replicas: must be an integer >= 1, got 0" in capsys.readouterr().err


def test_the_gauge_is_0_for_the_infeasible_target_and_1_for_the_others() -> None:
    from types import SimpleNamespace

    from exporter.daemon.exposition_slo import feasibility_family

    dep = deployment(slo=SLO, max_replicas=4)
    decision = Recommender(dep).decide(0.0, observation(6.0, 2), LLAMA, SHAPE)
    status = SimpleNamespace(
        deployment="d", model_name="m", decision=decision, slo_ttft_ms=SLO.ttft_ms,
        slo_itl_ms=None, slo_percentiles=SLO.percentiles,
    )  # fmt: skip
    family = feasibility_family([status])  # type: ignore[list-item]
    values = {s.labels["target"]: s.value for s in family.samples}
    assert values == {"ttft_mean": 1.0, "ttft_p95": 1.0, "itl_per_token_p99": 0.0}
