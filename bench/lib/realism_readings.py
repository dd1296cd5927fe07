"""What the daemon would read from a simulated run, for bench/workload_realism.py: the length
CVs of vLLM's token histograms, the KV cache running requests hold at each collector cycle's
end, the sidecar sampler's arrival CV, and whether the run held a steady state."""

from __future__ import annotations

import math

import numpy as np

from exporter.collector.arrival_sampler import SAMPLE_PERIOD_S, index_of_dispersion
from exporter.testbed.emulator import DEFAULT_MAX_MODEL_LEN
from exporter.testbed.emulator_metrics import length_histogram
from model.calibration.histogram import length_cv
from model.calibration.kv_context import KvContext
from model.simulation.simulator import SimResult, Simulator

# A run whose last tenth of arrivals waits this many times longer than the first tenth: the
# backlog grew through the run (no steady state).
GROWTH_FACTOR = 3.0
WINDOW_S = 30.0  # a collector window for the arrival sampler's reading


def cv_of(values: np.ndarray) -> float:
    return float(np.std(values) / np.mean(values))


def histogram_cv(tokens: np.ndarray) -> float:
    """The length CV the collector reads from vLLM's token histogram (1-2-5 buckets as the
    emulator exposes them, exact sum and count) of these requests."""
    cv = length_cv(length_histogram(tokens, DEFAULT_MAX_MODEL_LEN))
    return math.nan if cv is None else cv


def run_reading_kv(sim: Simulator, start_s: float, end_s: float, until_s: float) -> tuple[
    SimResult, KvContext
]:
    """Run the simulation to `until_s`, reading the KV tokens running requests hold and the
    running requests (every replica) at each collector cycle's end (WINDOW_S apart) in
    (start_s, end_s], as the collector reads the gauges at its windows' ends."""
    context = KvContext(0.0, 0.0)
    read_s = start_s + WINDOW_S
    while read_s <= end_s:
        sim.advance(read_s)
        for replica in sim.replica_status():
            context = context + KvContext(float(replica.kv_tokens), float(replica.running))
        read_s += WINDOW_S
    return sim.run(until_s=until_s), context


def dispersion_cv(first_token_s: np.ndarray, start_s: float, end_s: float) -> float:
    """The arrival CV the sidecar sampler reads: the index of dispersion of the per-request
    counter (it ticks at each first token) over 1 s bins, per WINDOW_S window, averaged over
    the windows weighted by their requests (as the traffic tracker smooths it); its root."""
    edges = np.arange(start_s, end_s + SAMPLE_PERIOD_S / 2, SAMPLE_PERIOD_S)
    counts = np.histogram(first_token_s, bins=edges)[0].astype(np.float64)
    per = int(WINDOW_S / SAMPLE_PERIOD_S)
    found = [(index_of_dispersion(counts[k:k + per]), counts[k:k + per].sum())
             for k in range(0, counts.size - per + 1, per)]
    pairs = [(i, w) for i, w in found if i is not None and w > 0]
    if not pairs:
        return math.nan
    index = sum(i * w for i, w in pairs) / sum(w for _, w in pairs)
    return math.sqrt(index)


def grew(res: SimResult, keep: np.ndarray) -> bool:
    """The backlog grew through the run: late arrivals wait far longer than early ones."""
    waits = res.ttft_ms[keep]
    tenth = max(waits.size // 10, 1)
    early, late = np.nanmean(waits[:tenth]), waits[-tenth:]
    return bool(np.isnan(late).mean() > 0.5 or np.nanmean(late) > GROWTH_FACTOR * early + 1e3)
