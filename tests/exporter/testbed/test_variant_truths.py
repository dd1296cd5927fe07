"""Variant truths: anchored at Table I, departing from the scaling rule as documented."""

from __future__ import annotations

import pytest

from exporter.testbed.variant_truths import (
    ANCHORS,
    HARDWARE,
    STARTUP_BASE_S,
    TENSOR_PARALLEL,
    ServedModel,
    every_truth,
    prior_error,
    scaling_rule,
    table_markdown,
    truth,
)
from model.calibration.prior import Accelerator
from model.queueing.variant import LLAMA_3_1_8B


@pytest.mark.parametrize("model", list(ServedModel))
def test_h100_at_tp1_is_the_papers_fit(model: ServedModel) -> None:
    t = truth(model, Accelerator.H100, 1)
    assert t.params.as_tuple() == pytest.approx(ANCHORS[model].as_tuple(), rel=1e-12)
    assert scaling_rule(model, Accelerator.H100, 1).as_tuple() == pytest.approx(
        t.params.as_tuple(), rel=1e-12)


def test_every_efficiency_is_within_30_percent_of_h100s() -> None:
    for hw in HARDWARE.values():
        assert 0.7 <= hw.compute_eff <= 1.3 and 0.7 <= hw.mem_eff <= 1.3, hw
    assert HARDWARE[Accelerator.H100].compute_eff == HARDWARE[Accelerator.H100].mem_eff == 1.0


def test_every_other_variant_departs_from_the_scaling_rule() -> None:
    # Else a prior that transfers by the rule would be exact by construction.
    for t in every_truth():
        if (t.accelerator, t.tensor_parallel) == (Accelerator.H100, 1):
            continue
        rule = scaling_rule(t.model, t.accelerator, t.tensor_parallel)
        worst = max(abs(r / p - 1.0) for r, p in zip(rule.as_tuple(), t.params.as_tuple(),
                                                      strict=True))
        assert worst > 0.05, t.name


def test_alpha_is_not_set_by_bandwidth_alone() -> None:
    h100 = truth(ServedModel.LLAMA_8B, Accelerator.H100)
    h200 = truth(ServedModel.LLAMA_8B, Accelerator.H200)
    mi300 = truth(ServedModel.LLAMA_8B, Accelerator.MI300X)
    bw = HARDWARE[Accelerator.H100].peak.memory_bandwidth_bytes_s
    for t, hw in ((h200, HARDWARE[Accelerator.H200]), (mi300, HARDWARE[Accelerator.MI300X])):
        by_bandwidth = h100.params.alpha_ms * bw / hw.peak.memory_bandwidth_bytes_s
        assert t.params.alpha_ms > 1.1 * by_bandwidth  # a fixed overhead and lower efficiency


def test_tensor_parallelism_pays_an_all_reduce_per_iteration() -> None:
    hw = HARDWARE[Accelerator.L40S]
    one = truth(ServedModel.LLAMA_8B, Accelerator.L40S, 1).params
    two = truth(ServedModel.LLAMA_8B, Accelerator.L40S, 2).params
    # Without the all-reduce, the bandwidth part of alpha would halve and beta would halve.
    all_reduce_ms = 2 * LLAMA_3_1_8B.num_layers * hw.link_latency_us * 1e-3
    assert two.alpha_ms == pytest.approx(
        hw.overhead_ms + (one.alpha_ms - hw.overhead_ms) / 2 + all_reduce_ms, rel=1e-12)
    assert two.beta_ms > 0.5 * one.beta_ms * 1.5  # PCIe: the ring costs more than half again
    assert two.gamma_ms == pytest.approx(one.gamma_ms / 2, rel=1e-12)


def test_kv_capacity_and_startup_follow_memory_and_weights() -> None:
    for model in ServedModel:
        caps = [truth(model, Accelerator.H100, k).kv_capacity_tokens for k in TENSOR_PARALLEL]
        assert caps == sorted(caps) and caps[0] > 0
    llama = truth(ServedModel.LLAMA_8B, Accelerator.H100)
    qwen = truth(ServedModel.QWEN_14B, Accelerator.H100)
    assert STARTUP_BASE_S < llama.startup_delay_s < qwen.startup_delay_s
    h200 = truth(ServedModel.LLAMA_8B, Accelerator.H200)
    assert h200.kv_capacity_tokens > llama.kv_capacity_tokens


def test_the_truths_are_fixed_not_drawn() -> None:
    assert truth(ServedModel.QWEN_14B, Accelerator.A100, 4) == truth(
        ServedModel.QWEN_14B, Accelerator.A100, 4)


def test_prior_error_is_relative_to_the_truth() -> None:
    t = truth(ServedModel.LLAMA_8B, Accelerator.A100)
    assert prior_error(t.params, t).alpha == 0.0
    e = prior_error(scaling_rule(t.model, t.accelerator), t)
    assert e.beta == pytest.approx(1.15 - 1.0, rel=1e-9)  # the rule misses A100's efficiency


def test_table_lists_each_variant_once() -> None:
    rows = table_markdown([truth(ServedModel.LLAMA_8B, Accelerator.H100, 1)]).splitlines()
    assert len(rows) == 3 and rows[2].startswith("| llama-3.1-8b/H100x1 | 6.68 |")


def test_bad_tensor_parallel_names_the_key() -> None:
    with pytest.raises(ValueError, match="tensor_parallel: must be one of"):
        truth(ServedModel.LLAMA_8B, Accelerator.H100, 3)
