"""The fit's prior: the physical derivation from architecture and accelerator (against the
paper's Table I), the MAP term, and the calibration confidence's anchors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from model import ArchitectureSpec, ServerConfig, ServiceParams, fit
from model.calibration.memory import CalibrationMemory
from model.calibration.prior import (
    ACCELERATORS,
    ESTIMATE_LOG_SIGMA,
    GENERIC_CENTRE,
    GENERIC_PRIOR,
    Accelerator,
    CentreSource,
    Prior,
    default_prior,
    physical_params,
    prior_around,
)
from model.calibration.trust import (
    HELD_OUT_MIN,
    ONE_POINT_SHARE,
    PARTIAL_SPREAD_SHARE,
    TRUSTED_CONFIDENCE,
    UNTESTED_CAP,
    changed,
    confidence,
    held_out_error,
    is_trusted,
    robust_bias,
    spread_loads,
    window_error,
)
from model.calibration.tuner import DEFAULT_LOWER_BOUNDS, DEFAULT_UPPER_BOUNDS
from model.queueing.variant import LLAMA_3_1_8B, QWEN_2_5_14B
from tests.model.calibration.synthetic import observations, relative_errors

TABLE_I = {
    "llama": ServiceParams(6.68, 2.01e-2, 5.52e-5),
    "qwen": ServiceParams(10.14, 3.68e-2, 8.48e-5),
}


def test_kv_bytes_per_token_follow_the_kv_heads_not_the_hidden_size() -> None:
    # Llama-3.1-8B: 2 x 32 layers x 8 KV heads x 128 x 2 bytes = 128 KiB (paper §VI); the
    # hidden size (32 query heads) would give four times that.
    assert LLAMA_3_1_8B.kv_bytes_per_token == 131_072
    fp8 = ArchitectureSpec(32, 4096, 8.03e9, num_kv_heads=8, head_dim=128, kv_cache_bytes=1)
    assert fp8.kv_bytes_per_token == 65_536
    assert ArchitectureSpec(32, 4096, 8.03e9).kv_bytes_per_token is None
    with pytest.raises(ValueError, match=r"`num_kv_heads` must be an integer >= 1, got 0"):
        ArchitectureSpec(32, 4096, 8e9, num_kv_heads=0, head_dim=128)
    with pytest.raises(ValueError, match=r"`kv_cache_bytes` must be a finite number > 0"):
        ArchitectureSpec(32, 4096, 8e9, kv_cache_bytes=0)


@pytest.mark.parametrize(
    ("arch", "name", "tolerance"),
    # alpha, beta, gamma: the 14B model's per-iteration overhead is below its weight stream.
    [(LLAMA_3_1_8B, "llama", (0.05, 0.05, 0.05)), (QWEN_2_5_14B, "qwen", (0.3, 0.05, 0.05))],
)
def test_physical_prior_of_the_h100_lands_on_table_i(
    arch: ArchitectureSpec, name: str, tolerance: tuple[float, float, float]
) -> None:
    params = physical_params(arch, ACCELERATORS[Accelerator.H100])
    assert np.all(relative_errors(params, TABLE_I[name]) < np.array(tolerance))
    # beta by hand: 2 x 8.03e9 FLOP / (0.8 x 989e12 FLOP/s) = 2.03e-5 s.
    if name == "llama":
        assert params.beta_ms == pytest.approx(2.0 * 8.03e9 / (0.8 * 989e12) * 1e3)
        assert params.gamma_ms == pytest.approx(131_072 / (0.7 * 3.35e12) * 1e3)


def test_default_prior_needs_the_kv_shape_and_an_accelerator() -> None:
    assert default_prior(LLAMA_3_1_8B, None) is GENERIC_PRIOR
    assert default_prior(ArchitectureSpec(32, 4096, 8.03e9), Accelerator.H100) is GENERIC_PRIOR
    h200 = default_prior(LLAMA_3_1_8B, Accelerator.H200)
    h100 = default_prior(LLAMA_3_1_8B, Accelerator.H100)
    # More bandwidth, same compute: alpha and gamma shrink by 3.35 / 4.8, beta stays.
    ratio = np.array(h200.centre.as_tuple()) / np.array(h100.centre.as_tuple())
    assert ratio == pytest.approx([3.35 / 4.8, 1.0, 3.35 / 4.8])
    assert h100.log_sigma == (math.log(3.0),) * 3
    with pytest.raises(ValueError, match=r"needs num_kv_heads and head_dim"):
        physical_params(ArchitectureSpec(32, 4096, 8e9), ACCELERATORS[Accelerator.A100])


def test_the_prior_holds_what_one_shape_cannot_identify() -> None:
    server = ServerConfig()
    truth = TABLE_I["llama"]
    one_shape = observations(truth, server, [(1024, 256, x) for x in (0.3, 0.4, 0.5, 0.6)])
    plain = fit(one_shape, server)
    assert not plain.all_identified
    centre = ServiceParams(7.0, 2.0e-2, 8.0e-5)
    held = fit(one_shape, server, prior=prior_around(centre, CentreSource.PHYSICAL))
    # Same quality on the shape served; the weakly informed gamma lands between what the
    # points suggest and the centre (a MAP compromise), never off towards a bound.
    assert held.ttft_error.mean_ratio < 0.02 and held.itl_error.mean_ratio < 0.02
    assert held.identified == plain.identified
    assert truth.gamma_ms * 0.95 < held.params.gamma_ms < centre.gamma_ms
    with pytest.raises(ValueError, match=r"`prior` must be a Prior or None"):
        fit(one_shape, server, prior=centre)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"`log_sigma\[1\]` must be a finite number > 0"):
        Prior(centre, (1.0, 0.0, 1.0))
    seeded = prior_around(centre, CentreSource.SEED)
    assert Prior.from_dict(seeded.to_dict()) == seeded


def test_confidence_anchors() -> None:
    tested = np.full(5, 0.05)  # five next windows predicted within 5 %
    base = {
        "all_identified": True, "loads_spread": False, "held_out": tested, "tested": 5,
        "held_updates": 0,
        "since_change": None, "settle": 5,
    }  # fmt: skip
    assert confidence(has_estimate=True, **base) == 1.0  # type: ignore[arg-type]
    assert confidence(has_estimate=False, **base) == 0.0  # type: ignore[arg-type]
    for change, expected in (
        ({"held_out": np.full(5, 0.10)}, 1.0),
        ({"held_out": np.full(5, 0.25)}, 0.5),
        ({"held_out": np.full(5, 0.30)}, 0.4),
        ({"held_out": np.full(5, math.inf)}, 0.0),
        # The median of the newest: two windows far off do not move it.
        ({"held_out": np.array([0.05, 0.9, 0.05, 0.9, 0.05])}, 1.0),
        # Untested: below the threshold until HELD_OUT_MIN next windows were predicted.
        ({"tested": 0}, UNTESTED_CAP),
        ({"tested": HELD_OUT_MIN - 1}, UNTESTED_CAP),
        ({"tested": HELD_OUT_MIN - 1, "held_out": np.full(5, 0.30)}, 0.4),
        # A change's own points left the record: the rest (none here) says nothing against it.
        ({"held_out": np.array([])}, 1.0),
        ({"held_updates": 1}, 1.0),
        ({"held_updates": 4}, 0.5),
        ({"held_updates": 5}, 1.0 / 3.0),
        # A partial fit: trusted where the loads spread, never at one operating point.
        ({"all_identified": False, "loads_spread": True}, PARTIAL_SPREAD_SHARE),
        ({"all_identified": False}, ONE_POINT_SHARE),
        ({"since_change": 0}, 0.5),
        ({"since_change": 5}, 1.0),
    ):
        got = confidence(has_estimate=True, **{**base, **change})  # type: ignore[arg-type]
        assert got == pytest.approx(expected), change
    assert not is_trusted(ONE_POINT_SHARE) and not is_trusted(UNTESTED_CAP)
    assert is_trusted(PARTIAL_SPREAD_SHARE) and is_trusted(TRUSTED_CONFIDENCE)


def test_one_operating_point_and_held_out_errors() -> None:
    rng = np.random.default_rng(3)
    # Arrival noise around one load (5 s windows at 11 req/s): one operating point.
    assert not spread_loads(11.0 * (1.0 + 0.13 * rng.standard_normal(20)))
    assert spread_loads(np.linspace(4.0, 9.0, 20))  # a load wandering over 0.3-0.7
    assert not spread_loads(np.array([5.0]))
    # The next window 10 % slower than predicted, after a window the estimate read 10 % fast.
    assert held_out_error(np.array([0.0, -0.01]), (0.1, 0.0)) == pytest.approx(1 - 1 / 1.1)
    assert held_out_error(np.array([np.inf, 0.0]), None) == math.inf


def test_robust_window_figures() -> None:
    rows = np.array([[0.02, -0.01]] * 8 + [[-0.9, 0.0], [-0.9, 0.0]])
    assert robust_bias(rows) == pytest.approx((0.02, -0.01))  # two spikes: the median holds
    assert window_error(rows, (0.02, -0.01)) == pytest.approx(0.0, abs=1e-12)
    assert robust_bias(np.full((3, 2), np.inf)) is None
    steady = np.random.default_rng(2).normal(0.0, 0.01, (10, 2))
    assert not changed(steady)
    moved = steady.copy()
    moved[-3:, 1] -= 0.10  # the engine decodes 10 % faster: ITL errors jump by +10 % of meas
    assert changed(moved)
    moved[-1, 1] = steady[-1, 1]  # two of three are not enough
    assert not changed(moved)


def test_after_a_detected_change_every_parameter_is_centred_on_the_estimate_before_it() -> None:
    # One shape identified alpha only; beta and gamma were held by the generic prior. After a
    # change their centre is the estimate the deployment had, not the generic one (which the
    # few new windows could trade against alpha).
    memory = CalibrationMemory()
    before = ServiceParams(6.5, 3e-4, 4.4e-5)
    memory.accept(before, (True, False, False))
    bounds = (DEFAULT_LOWER_BOUNDS, DEFAULT_UPPER_BOUNDS)
    assert memory.prior(GENERIC_PRIOR, None, bounds).centre.gamma_ms == pytest.approx(
        GENERIC_CENTRE.gamma_ms, rel=1e-12
    )
    memory.changed(before)
    prior = memory.prior(GENERIC_PRIOR, None, bounds)
    assert prior.centre.as_tuple() == pytest.approx(before.as_tuple(), rel=1e-12)
    assert prior.log_sigma == pytest.approx((ESTIMATE_LOG_SIGMA,) * 3)
    assert memory.since_change == 0


def test_while_recovering_from_a_change_what_was_not_identified_is_held_closer() -> None:
    # Before the fix the three new points of 128 / 2048 tokens could move gamma by a factor of
    # e per standard deviation and traded it against alpha (gamma 1/8 of the truth, the
    # published capacity 2.8x the new truth's); alpha, which the data had identified, stays
    # free to follow the change.
    memory = CalibrationMemory()
    memory.accept(ServiceParams(6.5, 3e-4, 4.4e-5), (True, False, False))
    memory.changed(ServiceParams(6.5, 3e-4, 4.4e-5))
    memory.accept(ServiceParams(9.0, 3e-4, 4.4e-5), (False, False, False))  # a 3-point fit
    bounds = (DEFAULT_LOWER_BOUNDS, DEFAULT_UPPER_BOUNDS)
    recovering = memory.prior(GENERIC_PRIOR, None, bounds, recovering=True)
    assert recovering.log_sigma == pytest.approx((ESTIMATE_LOG_SIGMA, 0.3, 0.3))
    assert memory.prior(GENERIC_PRIOR, None, bounds).log_sigma == pytest.approx(
        (ESTIMATE_LOG_SIGMA,) * 3
    )
    again = CalibrationMemory.from_dict(memory.to_dict(), None)
    assert again.open_at_change == (False, True, True)
    saved = memory.to_dict()
    del saved["open_at_change"]  # a state saved before the field existed
    assert CalibrationMemory.from_dict(saved, None).open_at_change == (False, False, False)


def test_after_a_full_estimate_one_load_since_the_change_moves_alpha_first() -> None:
    # 1024 / 512 tokens, alpha x1.5: the estimate before the change identified every
    # parameter, and the points since it sit at one load, which pins TTFT and ITL there but
    # not three parameters. Every parameter at ESTIMATE_LOG_SIGMA, the change was spread over
    # all three and the capacity took 10 windows to follow (bench/tuner_robustness); beta and
    # gamma held at CHANGE_LOG_SIGMA, 2.
    bounds = (DEFAULT_LOWER_BOUNDS, DEFAULT_UPPER_BOUNDS)
    full = CalibrationMemory()
    full.accept(ServiceParams(6.7, 1.2e-2, 6.8e-5), (True, True, True))
    full.changed(ServiceParams(6.7, 1.2e-2, 6.8e-5))
    one = full.prior(GENERIC_PRIOR, None, bounds, recovering=True, one_load=True)
    assert one.log_sigma == pytest.approx((ESTIMATE_LOG_SIGMA, 0.3, 0.3))
    # Loads spread since the change: the data separate the parameters; all free.
    spread = full.prior(GENERIC_PRIOR, None, bounds, recovering=True, one_load=False)
    assert spread.log_sigma == pytest.approx((ESTIMATE_LOG_SIGMA,) * 3)
    # After a partial estimate (gamma open, as at 128 / 2048 tokens) only what was open is
    # held: holding beta too slowed "every parameter / 1.1" there from 4 windows to 8.
    partial = CalibrationMemory()
    partial.accept(ServiceParams(5.4, 3.9e-4, 6.5e-5), (True, True, False))
    partial.changed(ServiceParams(5.4, 3.9e-4, 6.5e-5))
    held = partial.prior(GENERIC_PRIOR, None, bounds, recovering=True, one_load=True)
    assert held.log_sigma == pytest.approx((ESTIMATE_LOG_SIGMA, ESTIMATE_LOG_SIGMA, 0.3))
