"""Workload generators: rate profiles, arrival streams, length laws, traces."""

from __future__ import annotations

import numpy as np
import pytest

from model.simulation.workloads import (
    ArrivalStream,
    LengthDist,
    LengthKind,
    RateProfile,
    RateSegment,
    RequestTrace,
    draw_trace,
    poisson_trace,
)

RAMP = RateProfile(
    (RateSegment(10.0, 2.0, 2.0), RateSegment(10.0, 2.0, 6.0), RateSegment(5.0, 0, 0))
)


def test_paper_profile_is_44_minutes_of_holds_and_ramps() -> None:
    profile = RateProfile.paper(5.0)
    assert profile.duration_s == 44 * 60
    rates = profile.rate_at(np.array([0.0, 6.5 * 60, 12 * 60, 20 * 60, 43 * 60, 50 * 60]))
    np.testing.assert_allclose(rates, [5.0, 8.75, 12.5, 20.0, 5.0, 5.0])


def test_cumulative_and_its_inverse_round_trip() -> None:
    t = np.linspace(0.01, 19.99, 50)
    np.testing.assert_allclose(RAMP.inverse_cumulative(RAMP.cumulative(t)), t, rtol=1e-9)
    assert RAMP.cumulative(20.0) == pytest.approx(20.0 + 40.0)
    assert RAMP.cumulative(30.0) == pytest.approx(60.0)  # zero rate after the ramp
    assert np.isinf(RAMP.inverse_cumulative(np.array([60.5])))[0]


def test_poisson_profile_follows_the_rate(rng: np.random.Generator) -> None:
    profile = RateProfile((RateSegment(500.0, 10.0, 10.0), RateSegment(500.0, 10.0, 30.0)))
    times = ArrivalStream(profile, rng).draw_until(1000.0)
    assert np.all(np.diff(times) >= 0)
    hold, ramp = np.count_nonzero(times <= 500), np.count_nonzero(times > 500)
    assert hold == pytest.approx(5000, rel=0.05)
    assert ramp == pytest.approx(10000, rel=0.05)
    gaps = np.diff(times[times <= 500])
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)


@pytest.mark.parametrize("cv", [0.0, 0.5, 2.0])
def test_interarrival_cv(cv: float, rng: np.random.Generator) -> None:
    times = ArrivalStream(RateProfile.constant(20.0), rng, cv=cv).draw_until(1000.0)
    gaps = np.diff(times)
    assert times.size == pytest.approx(20000, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, abs=0.08)


def test_incremental_draws_equal_one_draw() -> None:
    one = ArrivalStream(RAMP, np.random.default_rng(5)).draw_until(25.0)
    stream = ArrivalStream(RAMP, np.random.default_rng(5))
    parts = np.concatenate([stream.draw_until(t) for t in (3.0, 3.0, 11.5, 19.0, 25.0)])
    np.testing.assert_allclose(parts, one, rtol=1e-12)


def test_set_profile_changes_the_rate_from_then_on(rng: np.random.Generator) -> None:
    stream = ArrivalStream(RateProfile.constant(5.0), rng)
    before = stream.draw_until(200.0)
    stream.set_profile(RateProfile.constant(50.0), 200.0)
    after = stream.draw_until(400.0)
    assert before.size == pytest.approx(1000, rel=0.1)
    assert after.size == pytest.approx(10000, rel=0.05)
    assert after.min() > 200.0
    with pytest.raises(ValueError, match=r"`at_s`.*got 100"):
        stream.set_profile(RateProfile.constant(1.0), 100.0)


def test_length_laws(rng: np.random.Generator) -> None:
    uniform = LengthDist(LengthKind.UNIFORM, 64).sample(50_000, rng)
    assert (uniform.min(), uniform.max()) == (32, 96)
    assert uniform.mean() == pytest.approx(64, rel=0.01)
    assert set(LengthDist(LengthKind.FIXED, 100).sample(10, rng)) == {100}
    logn = LengthDist(LengthKind.LOGNORMAL, 200, cv=1.0).sample(200_000, rng)
    assert logn.mean() == pytest.approx(200, rel=0.02)
    assert logn.std() / logn.mean() == pytest.approx(1.0, rel=0.1)
    emp = LengthDist(LengthKind.EMPIRICAL, values=np.array([3, 7]))
    assert emp.mean_tokens == 5.0
    assert set(emp.sample(100, rng)) == {3, 7}


def test_seeded_traces_reproduce() -> None:
    a = poisson_trace(3.0, 100.0, LengthDist("uniform", 256), LengthDist("fixed", 8),
                      np.random.default_rng(11))
    b = poisson_trace(3.0, 100.0, LengthDist("uniform", 256), LengthDist("fixed", 8),
                      np.random.default_rng(11))
    np.testing.assert_array_equal(a.arrival_s, b.arrival_s)
    np.testing.assert_array_equal(a.input_tokens, b.input_tokens)
    c = draw_trace(RAMP, LengthDist("fixed", 4), LengthDist("fixed", 4), np.random.default_rng(12))
    assert c.arrival_s.max() <= RAMP.duration_s
    assert not a.arrival_s.flags.writeable


@pytest.mark.parametrize(
    ("build", "pattern"),
    [
        (lambda: RateSegment(0.0, 1.0, 1.0), r"`duration_s`.*got 0"),
        (lambda: RateSegment(1.0, -1.0, 1.0), r"`start_rps`.*got -1"),
        (lambda: RateProfile(()), r"`segments`"),
        (lambda: LengthDist(LengthKind.UNIFORM, 0.5), r"`mean_tokens`.*got 0.5"),
        (lambda: LengthDist(LengthKind.EMPIRICAL, values=np.array([0])), r"`values`"),
        (lambda: RequestTrace(np.array([1.0, 0.5]), np.array([1, 1]), np.array([1, 1])),
         r"`arrival_s`.*non-decreasing"),
        (lambda: RequestTrace(np.array([0.0]), np.array([0]), np.array([1])), r"`input_tokens`"),
        (lambda: RequestTrace(np.array([0.0]), np.array([1, 2]), np.array([1])), r"same length"),
    ],
)
def test_bad_inputs_name_the_field(build, pattern: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=pattern):
        build()
