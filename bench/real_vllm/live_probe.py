"""The live run's start: its own probe of vLLM on this host, the SLO targets derived from it,
and the quiet time before the daemon starts. Run by live.py."""

from __future__ import annotations

import numpy as np

from bench.real_vllm.server import RunningServer
from bench.real_vllm.sweep import Shape, ShapeProbe, probe_shape
from exporter.base.clock import SystemClock
from exporter.collector.sources import ScrapeSource

CYCLE_PERIOD_S = 15.0  # the daemon's
PROMETHEUS_SCRAPE_S = 2.0
MAIN = Shape(input_tokens=512, output_tokens=64)
SECOND = Shape(input_tokens=128, output_tokens=256)
# The targets are multiples of the main shape's light-load latencies, measured by this run's own
# probe (one request at a time), so the load at which they bind is the same share of capacity on
# a fast host and a slow one. On the run they were chosen on, a single 512-token request had a
# TTFT of 44 ms and an ITL of 2.5 ms, and 80 ms and 12 ms bound near 9 and 10.5 req/s (about 2/3
# of the fitted saturation, 13.5 req/s): hence the factors.
SLO_TTFT_FACTOR = 1.8
SLO_ITL_FACTOR = 4.8


async def probe(server: RunningServer, rng: np.random.Generator) -> dict[str, ShapeProbe]:
    """Single requests and a burst per shape (the sweep's probe): the saturation rates."""
    source = ScrapeSource(clock=SystemClock(), urls=[server.metrics_url], model_name=server.model)
    probes: dict[str, ShapeProbe] = {}
    for shape in (MAIN, SECOND):
        found = await probe_shape(server, source, shape, rng)
        probes[f"{shape.input_tokens}/{shape.output_tokens}"] = found
        print(f"shape {shape.input_tokens}/{shape.output_tokens}: burst saturation "
              f"{found.saturation_rps:.2f} req/s, single TTFT {found.single_ttft_ms:.1f} ms",
              flush=True)
    return probes


def slo_targets(light: ShapeProbe) -> tuple[float, float]:
    """TTFT and ITL targets (ms) from the main shape's light-load probe."""
    return (round(SLO_TTFT_FACTOR * light.single_ttft_ms, 1),
            round(SLO_ITL_FACTOR * light.single_itl_ms, 1))


def quiet_wait_s(probe_end_s: float, now_s: float) -> float:
    """Seconds to wait before starting the daemon, so that its first window (one cycle period
    back, read through Prometheus) starts after the probe's last request, with a scrape
    interval of margin either side: the probe's bursts are no load of the run."""
    return max(0.0, probe_end_s + CYCLE_PERIOD_S + 2 * PROMETHEUS_SCRAPE_S - now_s)
