"""The bounds a saved deployment state must keep before anything of it is built: the config's.

A state file is the daemon's own output, but it outlives the daemon that wrote it and can be
edited, corrupted or written by another version: a saved window with a batch size or token
means that no configuration could hold would cost every cycle the memory or time such a
configuration is refused for (a 1e8 batch: a MemoryError at 1.7 GB; 1e12 prompt tokens: a
first cycle that never ended). The raw JSON is checked, so nothing is allocated on its word.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from exporter.config.values import (
    MAX_NUM_BATCHED_TOKENS,
    MAX_NUM_SEQS,
    MAX_QUEUE_SIZE,
    MAX_TUNER_WINDOW,
)

# A request's mean prompt or output length: no context served today is longer than the
# largest batch-token budget the config takes.
MAX_TOKENS = float(MAX_NUM_BATCHED_TOKENS)
_SERVER_BOUNDS: tuple[tuple[str, float], ...] = (
    ("max_batch_size", MAX_NUM_SEQS),
    ("max_num_batched_tokens", MAX_NUM_BATCHED_TOKENS),
    ("max_queue_size", MAX_QUEUE_SIZE),
)
_OBSERVATION_BOUNDS: tuple[tuple[str, float], ...] = (
    ("max_batch_size", MAX_NUM_SEQS),
    ("avg_input_tokens", MAX_TOKENS),
    ("avg_output_tokens", MAX_TOKENS),
)


def out_of_bounds(entry: Mapping[str, Any]) -> str | None:
    """The first saved value beyond the config's bounds, as `path: value > bound`; None when
    all are within them. Values of the wrong type are left to the parsers, which refuse them."""
    tuner = entry.get("tuner")
    if isinstance(tuner, Mapping):
        config = tuner.get("config")
        if isinstance(config, Mapping):
            server = config.get("server")
            server = server if isinstance(server, Mapping) else {}
            for key, bound in _SERVER_BOUNDS:
                if _above(server.get(key), bound):
                    return f"tuner.config.server.{key}: {server[key]!r} > {bound:g}"
            for key in ("window_size", "min_observations"):
                if _above(config.get(key), MAX_TUNER_WINDOW):
                    return f"tuner.config.{key}: {config[key]!r} > {MAX_TUNER_WINDOW}"
        for section in ("window", "itl_curve"):
            points = tuner.get(section)
            if not isinstance(points, list):
                continue
            if len(points) > MAX_TUNER_WINDOW:
                return f"tuner.{section}: {len(points)} points > {MAX_TUNER_WINDOW}"
            for k, point in enumerate(points):
                if not isinstance(point, Mapping):
                    continue
                for key, bound in _OBSERVATION_BOUNDS:
                    if _above(point.get(key), bound):
                        return f"tuner.{section}[{k}].{key}: {point[key]!r} > {bound:g}"
    workload = entry.get("workload")
    if isinstance(workload, list):
        for k, tokens in enumerate(workload):
            if _above(tokens, MAX_TOKENS):
                return f"workload[{k}]: {tokens!r} tokens > {MAX_TOKENS:g}"
    return None


def _above(value: Any, bound: float) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > bound
