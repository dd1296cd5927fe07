"""The candidate-plan formulation (off by default, measured by bench/fleet_formulations.py):
each model's candidates are exactly its minimal fully served count vectors, and the joint
program choosing among them ranks as the exhaustive search best."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator

import pytest

from exporter.sizing.fleet import milp
from exporter.sizing.fleet.candidates import fully_served
from exporter.sizing.fleet.evaluate import no_worse, rank, unserved_rps, within_limits
from exporter.sizing.fleet.milp import solve_joint
from exporter.sizing.fleet.single import only
from exporter.sizing.fleet.values import FleetInput
from tests.exporter.sizing.fleet.instances import exhaustive, random_instance


def _minimal_fully_served(inp: FleetInput, model: str) -> set[tuple[int, ...]]:
    """By brute force: the vectors serving all demand that no single replica less does."""
    own = inp.own(model)
    alone = only(inp, model)
    out = set()
    for counts in itertools.product(*(range(v.min_replicas, v.max_replicas + 1) for v in own)):
        replicas = {v.name: n for v, n in zip(own, counts, strict=True)}
        if unserved_rps(alone, model, replicas) > 0:
            continue
        spare = any(
            counts[i] > v.min_replicas
            and unserved_rps(alone, model, {**replicas, v.name: counts[i] - 1}) <= 0
            for i, v in enumerate(own)
        )
        if not spare:
            out.add(tuple(counts))
    return out


def test_candidates_are_the_minimal_fully_served_vectors() -> None:
    rng = random.Random(11)
    checked = 0
    for _ in range(300):
        inp = random_instance(rng, limited=False)
        for m in inp.models:
            plans = fully_served(inp, m.name)
            expected = _minimal_fully_served(inp, m.name)
            if plans is None:
                assert not expected, (inp, m.name)  # none only when none serve all
                continue
            found = {tuple(int(n) for n in row) for row in plans}
            # Even routing may keep a vector with a replica to spare (leaving a variant raises
            # the smallest capacity in use): a superset, every minimal one present.
            assert expected <= found, (inp, m.name, expected - found)
            for counts in found:
                replicas = {v.name: n for v, n in zip(inp.own(m.name), counts, strict=True)}
                assert unserved_rps(only(inp, m.name), m.name, replicas) <= 0
            checked += len(expected)
    assert checked >= 300


@pytest.fixture
def candidates_on() -> Iterator[None]:
    milp.CANDIDATES = True
    yield
    milp.CANDIDATES = False


@pytest.mark.usefixtures("candidates_on")
def test_the_program_with_candidates_ranks_as_the_exhaustive_search_best() -> None:
    rng = random.Random(42)
    for k in range(300):
        inp = random_instance(rng, limited=k % 3 != 0)
        plan, best = solve_joint(inp), exhaustive(inp)
        assert plan.optimal
        assert within_limits(inp, plan.replicas), (k, inp, plan)
        assert no_worse(inp, plan, best) and no_worse(inp, best, plan), (
            k, rank(inp, plan), rank(inp, best), inp,
        )  # fmt: skip
