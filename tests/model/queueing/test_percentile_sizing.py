"""Sizing on percentile targets beside mean ones: the returned rate meets every target, a target
is missed just above it (or it is MaxRate), loosening a target never lowers it, and the result
names the binding target."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from model import (
    FirstToken,
    LatencyMetric,
    ModelOptions,
    PercentileTarget,
    ServerConfig,
    ServiceParams,
    SizingStatus,
    Workload,
    analyze,
    chunk_table,
    latency_quantiles,
    max_rate_for_slo,
    replicas_for_slo,
)
from model.queueing.variant import UNIFORM_HALF_WIDTH_CV

LLAMA = ServiceParams(6.68, 2.01e-2, 5.52e-5)
SERVER = ServerConfig(max_batch_size=256, max_num_batched_tokens=8192)
SHAPE = Workload(1024, 512)
FIELD = {
    LatencyMetric.TTFT: "ttft_ms",
    LatencyMetric.ITL_PER_TOKEN: "itl_per_token_ms",
    LatencyMetric.ITL_PER_REQUEST: "itl_per_request_ms",
}
NEAR = 1.0 + 1e-4


def meets(rate: float, server: ServerConfig, workload: Workload, options: ModelOptions,
          targets: list[PercentileTarget], ttft: float | None, itl: float | None,
          first_token: FirstToken) -> bool:
    """Every target met at `rate` (the quantile within each percentile target)."""
    mean = analyze(LLAMA, server, workload, rate, options=options)
    after = first_token is FirstToken.AFTER_DECODE_ITERATION
    if ttft is not None and (mean.ttft_ms if after else mean.ttft_with_last_chunk_ms) > ttft:
        return False
    if itl is not None and mean.itl_ms > itl:
        return False
    for t in targets:
        q = latency_quantiles(LLAMA, server, workload, rate, [t.quantile], options=options,
                              first_token=first_token)
        if getattr(q, FIELD[t.metric])[0] > t.target_ms:
            return False
    return True


@st.composite
def problems(draw: st.DrawFn):
    workload = Workload(draw(st.floats(32.0, 4096.0)), draw(st.floats(8.0, 2048.0)))
    server = ServerConfig(max_batch_size=draw(st.sampled_from([16, 64, 256])),
                          max_num_batched_tokens=16384)
    assume(np.ptp(chunk_table(server, workload)) == 0)  # no chunk step: metrics monotone
    options = ModelOptions(
        arrival_cv=1.0,
        input_length_cv=draw(st.sampled_from([0.0, UNIFORM_HALF_WIDTH_CV])),
        output_length_cv=draw(st.sampled_from([0.0, UNIFORM_HALF_WIDTH_CV])),
    )
    sat = float(analyze(LLAMA, server, workload, 0.0, options=options).saturation_rate_rps)
    # Targets around the values at a random load, so that some bind and some do not.
    load = draw(st.floats(0.1, 0.95))
    metrics = draw(st.lists(st.sampled_from(list(LatencyMetric)), min_size=1, max_size=3))
    quants = [draw(st.sampled_from([0.5, 0.9, 0.95, 0.99])) for _ in metrics]
    first = draw(st.sampled_from(list(FirstToken)))
    at = latency_quantiles(LLAMA, server, workload, load * sat, quants, options=options,
                           first_token=first)
    targets = [
        PercentileTarget(metric, q, float(getattr(at, FIELD[metric])[k])
                         * draw(st.floats(0.8, 1.5)))
        for k, (metric, q) in enumerate(zip(metrics, quants, strict=True))
    ]
    mean = analyze(LLAMA, server, workload, load * sat, options=options)
    ttft = draw(st.one_of(st.none(), st.just(float(mean.ttft_ms) * draw(st.floats(0.9, 1.5)))))
    itl = draw(st.one_of(st.none(), st.just(float(mean.itl_ms) * draw(st.floats(0.9, 1.5)))))
    return server, workload, options, targets, ttft, itl, first


@settings(max_examples=25, deadline=None)
@given(problems(), st.floats(1.1, 2.0))
def test_sizing_properties(problem, loosen) -> None:
    server, workload, options, targets, ttft, itl, first = problem
    cap = max_rate_for_slo(LLAMA, server, workload, ttft, itl, options=options,
                           percentiles=targets, first_token=first)
    if not cap.feasible:
        # Infeasible only when some target is missed at the lowest rate searched.
        assert not meets(cap.min_rate_rps, server, workload, options, targets, ttft, itl, first)
        return
    r = cap.rate_rps
    assert meets(r, server, workload, options, targets, ttft, itl, first)
    if r < cap.max_rate_rps:
        assert not meets(r * NEAR, server, workload, options, targets, ttft, itl, first)
        assert cap.binding_name in {t.name for t in targets} | {"ttft_mean", "itl_mean"}
    else:
        assert cap.binding_name == "max_rate"
    assert len(cap.attainment) == len(targets)
    for t, share in zip(targets, cap.attainment, strict=True):
        assert share >= t.quantile
    # Loosening any one target never lowers the rate.
    for k in range(len(targets)):
        looser = list(targets)
        looser[k] = PercentileTarget(targets[k].metric, targets[k].quantile,
                                     targets[k].target_ms * loosen)
        again = max_rate_for_slo(LLAMA, server, workload, ttft, itl, options=options,
                                 percentiles=looser, first_token=first)
        assert again.rate_rps >= r
    if ttft is not None:
        again = max_rate_for_slo(LLAMA, server, workload, ttft * loosen, itl, options=options,
                                 percentiles=targets, first_token=first)
        assert again.rate_rps >= r


def test_binding_target_is_named() -> None:
    p95 = PercentileTarget(LatencyMetric.TTFT, 0.95, 100.0)
    p99 = PercentileTarget(LatencyMetric.ITL_PER_TOKEN, 0.99, 40.0)
    cap = max_rate_for_slo(LLAMA, SERVER, SHAPE, percentiles=[p95, p99])
    assert cap.feasible and cap.binding_target in (p95, p99)
    assert cap.binding_name == cap.binding_target.name
    assert p95.name == "ttft_p95" and p99.name == "itl_per_token_p99"
    assert PercentileTarget(LatencyMetric.TTFT, 0.999, 1.0).name == "ttft_p99.9"
    mean_only = max_rate_for_slo(LLAMA, SERVER, SHAPE, ttft_ms=50.0, itl_ms=25.0)
    assert mean_only.binding_name == "ttft_mean" and mean_only.binding_target is None
    assert max_rate_for_slo(LLAMA, SERVER, SHAPE).binding_name == "max_rate"


def test_a_mean_target_can_bind_beside_percentiles() -> None:
    loose = PercentileTarget(LatencyMetric.TTFT, 0.5, 10_000.0)
    cap = max_rate_for_slo(LLAMA, SERVER, SHAPE, ttft_ms=50.0, percentiles=[loose])
    alone = max_rate_for_slo(LLAMA, SERVER, SHAPE, ttft_ms=50.0)
    assert cap.rate_rps == alone.rate_rps and cap.binding_name == "ttft_mean"
    assert cap.attainment[0] >= 0.5


def test_unreachable_percentile_is_infeasible() -> None:
    tight = PercentileTarget(LatencyMetric.ITL_PER_REQUEST, 0.99, 1.0)
    cap = max_rate_for_slo(LLAMA, SERVER, SHAPE, percentiles=[tight])
    assert not cap.feasible and cap.status is SizingStatus.ITL_INFEASIBLE
    assert cap.rate_rps == 0.0 and cap.binding_target == tight
    plan = replicas_for_slo(10.0, LLAMA, SERVER, SHAPE, percentiles=[tight])
    assert plan.replicas is None and not plan.feasible


def test_replicas_follow_the_percentile_capacity() -> None:
    p95 = PercentileTarget(LatencyMetric.TTFT, 0.95, 80.0)
    cap = max_rate_for_slo(LLAMA, SERVER, SHAPE, percentiles=[p95])
    plan = replicas_for_slo(20.0, LLAMA, SERVER, SHAPE, percentiles=[p95])
    assert plan.replicas == math.ceil(20.0 / cap.rate_rps - 1e-9)
    assert plan.capacity.rate_rps == cap.rate_rps


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"metric": "tpot", "quantile": 0.9, "target_ms": 1.0}, "metric"),
        ({"metric": "ttft", "quantile": 0.9999, "target_ms": 1.0}, "quantile"),
        ({"metric": "ttft", "quantile": 0.0, "target_ms": 1.0}, "quantile"),
        ({"metric": "ttft", "quantile": 0.9, "target_ms": -5.0}, "target_ms"),
        ({"metric": "ttft", "quantile": 0.9, "target_ms": math.inf}, "target_ms"),
    ],
)
def test_bad_targets_are_refused(kwargs, word) -> None:
    with pytest.raises(ValueError, match=word):
        PercentileTarget(**kwargs)


def test_percentiles_must_be_targets() -> None:
    with pytest.raises(ValueError, match="percentiles"):
        max_rate_for_slo(LLAMA, SERVER, SHAPE, percentiles=[("ttft", 0.95, 50.0)])  # type: ignore[list-item]


def test_exported_attainment_is_the_sizing_attainment() -> None:
    """The attainment the exporter reports at a rate is the one sizing compared with the
    percentile: one computation, bit for bit, for each kind of target."""
    from model.queueing.chain import state_table
    from model.queueing.percentile_sizing import attainment_at, target_percentiles

    targets = [
        PercentileTarget(LatencyMetric.TTFT, 0.95, 80.0),
        PercentileTarget(LatencyMetric.ITL_PER_TOKEN, 0.99, 30.0),
        PercentileTarget(LatencyMetric.ITL_PER_REQUEST, 0.9, 20.0),
    ]
    table = state_table(LLAMA, SERVER, np.array([1024.0]), np.array([512.0]))
    seen: list[float] = []
    for rate in (2.0, 8.0, 12.0):
        sizing = attainment_at(LLAMA, SERVER, SHAPE, table, targets,
                               FirstToken.WITH_LAST_CHUNK, rate)
        exported = target_percentiles(LLAMA, SERVER, SHAPE, table, targets,
                                      FirstToken.WITH_LAST_CHUNK, rate)
        assert [a for _, a in exported] == list(sizing)
        seen.extend(sizing)
    assert any(0.0 < a < 1.0 for a in seen)  # partial shares compared, not only 0 and 1


@settings(max_examples=20, deadline=None)
@given(problems(), st.floats(0.05, 1.2), st.floats(0.05, 1.0), st.integers(1, 9))
def test_the_first_miss_is_that_of_every_target_at_every_rate(problem, start, width, count):
    # The search evaluates the later metrics only up to the lead metric's first miss: the first
    # miss and the attainment up to it must be those of evaluating every target at every rate.
    from model.queueing.chain import workload_table
    from model.queueing.percentile_sizing import _Probe

    server, workload, options, targets, _, _, first = problem
    table = workload_table(LLAMA, server, workload, options=options)
    probe = _Probe(LLAMA, server, workload, table, tuple(targets), first)
    sat = float(analyze(LLAMA, server, workload, 0.0, options=options).saturation_rate_rps)
    rates = np.linspace(start, start + width, count) * sat
    full = probe.attainment(rates)
    missed = ~probe.met(full)
    want = int(np.argmax(missed)) if missed.any() else count
    for lead in dict.fromkeys(t.metric for t in targets):
        k, att = probe.first_miss(rates, lead)
        assert k == want
        rows = min(k + 1, count)
        np.testing.assert_array_equal(att[:rows], full[:rows])
