"""Open-loop load generator for a vLLM server on loopback: Poisson arrivals, streaming completions.

Each request is a `/v1/completions` call with `stream=true`, a prompt given as token ids (so the
input length is exact), `ignore_eos` and `max_tokens` (so the output length is exact). Per request
it records the send time, TTFT, the gaps between streamed chunks (ITL) and the token counts that the
server reports in its final usage chunk. Runs are bounded in request count and in time.
"""

from __future__ import annotations

import asyncio
import logging

import numpy as np

from exporter.base.clock import Clock, SystemClock
from exporter.testbed.completion_stream import one_request
from exporter.testbed.load_run import (
    LoadResult,
    LoadSpec,
    RequestRecord,
    RequestStatus,
    failed_record,
)

logger = logging.getLogger(__name__)


def arrival_offsets_s(
    rate_rps: float, duration_s: float, max_requests: int, rng: np.random.Generator
) -> np.ndarray:
    """Poisson arrival times in [0, duration_s) (s), at most max_requests of them."""
    # Draw in blocks: a Poisson count with a generous margin almost always covers the window.
    expected = rate_rps * duration_s
    block = int(expected + 6.0 * np.sqrt(expected) + 16)
    times = np.cumsum(rng.exponential(1.0 / rate_rps, size=block))
    while times[-1] < duration_s and times.size < max_requests:
        more = times[-1] + np.cumsum(rng.exponential(1.0 / rate_rps, size=block))
        times = np.concatenate([times, more])
    times = times[times < duration_s][:max_requests]
    times.setflags(write=False)
    return times


def random_prompt(spec: LoadSpec, rng: np.random.Generator) -> list[int]:
    """A prompt of exactly spec.input_tokens random token ids."""
    ids = rng.integers(spec.low_token_id, spec.vocab_size, size=spec.input_tokens)
    return [int(i) for i in ids]


async def run_load(
    spec: LoadSpec, rng: np.random.Generator, clock: Clock | None = None
) -> LoadResult:
    """Send Poisson arrivals for spec.duration_s, then wait up to spec.drain_s for stragglers."""
    clock = clock or SystemClock()
    offsets = arrival_offsets_s(spec.rate_rps, spec.duration_s, spec.max_requests, rng)
    prompts = [random_prompt(spec, rng) for _ in range(offsets.size)]
    start_unix_s = clock.time()
    start_s = clock.monotonic()
    tasks: list[asyncio.Task[RequestRecord]] = []
    for index, (offset_s, prompt) in enumerate(zip(offsets, prompts, strict=True)):
        delay_s = start_s + float(offset_s) - clock.monotonic()
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        coro = one_request(spec, index, prompt, clock, start_s)
        tasks.append(asyncio.create_task(coro))
    deadline_s = start_s + spec.duration_s + spec.drain_s
    records: list[RequestRecord] = []
    if tasks:
        done, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline_s - clock.monotonic()))
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for index, task in enumerate(tasks):
            if task in done:
                records.append(task.result())
            else:
                records.append(
                    failed_record(
                        index,
                        RequestStatus.TIMEOUT,
                        float(offsets[index]),
                        clock.monotonic() - start_s,
                        "not finished by the drain deadline",
                    )
                )
    elapsed_s = clock.monotonic() - start_s
    logger.info(
        "load run: rate=%.3f rps shape=%d/%d sent=%d failed=%d elapsed=%.1fs",
        spec.rate_rps,
        spec.input_tokens,
        spec.output_tokens,
        len(records),
        sum(1 for r in records if not r.ok),
        elapsed_s,
    )
    return LoadResult(
        spec=spec, start_unix_s=start_unix_s, elapsed_s=elapsed_s, records=tuple(records)
    )
