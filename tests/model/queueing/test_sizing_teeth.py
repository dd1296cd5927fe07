"""An ITL excursion over the target in a sliver just below a chunk-count step, narrower than
the dense grid's spacing: sizing stops before it (it returned MaxRate before the steps were
checked one by one; found by the reference-scan property test)."""

from __future__ import annotations

import numpy as np

from model import ServerConfig, ServiceParams, Workload, analyze, max_rate, max_rate_for_slo

PARAMS = ServiceParams(alpha_ms=1.0, beta_ms=0.125, gamma_ms=1e-06)
SERVER = ServerConfig(max_batch_size=63, max_num_batched_tokens=145)
SHAPE = Workload(avg_input_tokens=16.0, avg_output_tokens=3.0)


def test_sizing_stops_before_an_excursion_just_below_a_chunk_step() -> None:
    target = float(analyze(PARAMS, SERVER, SHAPE, max_rate(PARAMS, SERVER, SHAPE)).itl_ms)
    cap = max_rate_for_slo(PARAMS, SERVER, SHAPE, itl_ms=target)
    rates = np.linspace(cap.min_rate_rps, cap.max_rate_rps, 100_000)
    over = np.asarray(analyze(PARAMS, SERVER, SHAPE, rates).itl_ms) > target
    j = int(np.argmax(over))
    assert over.any() and j > 0  # the excursion exists, 0.57 req/s wide below MaxRate 396.7
    assert rates[j - 1] * (1 - 1e-7) <= cap.rate_rps < rates[j]
    assert cap.binding == "itl"
