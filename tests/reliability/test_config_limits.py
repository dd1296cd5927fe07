"""Sizes that would exhaust memory or time are refused with the key and the limit, and no
error message quotes an unbounded value."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from exporter.base.errors import ConfigError
from exporter.config.checks import MAX_PROBLEMS_SHOWN, SHOWN_CHARS
from exporter.config.loader import parse_config
from exporter.config.values import (
    MAX_CYCLE_PERIOD_S,
    MAX_DEPLOYMENTS,
    MAX_MODEL_CELLS,
    MAX_NUM_BATCHED_TOKENS,
    MAX_NUM_SEQS,
    MAX_QUEUE_SIZE,
    MAX_REPLICAS,
    MAX_RESPONSE_MIB,
    MAX_STABILIZATION_S,
    MAX_TIMEOUT_S,
    MAX_TUNER_WINDOW,
    MIB,
)


def deployment(name: str = "llama", **overrides: Any) -> dict[str, Any]:
    dep: dict[str, Any] = {
        "name": name,
        "model_name": "llama-3",
        "source": {"scrape_urls": ["http://127.0.0.1:8000/metrics"]},
        "slo": {"ttft_ms": 500, "itl_ms": 50},
    }
    dep.update(overrides)
    return dep


def problems(data: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    return info.value.problems


# (override of the deployment, key path, the limit the message must name)
TOO_LARGE = [
    ({"server": {"max_num_seqs": 100_000_000}}, "server.max_num_seqs", MAX_NUM_SEQS),
    ({"server": {"max_num_seqs": MAX_NUM_SEQS + 1}}, "server.max_num_seqs", MAX_NUM_SEQS),
    (
        {"server": {"max_num_batched_tokens": 10**12}},
        "server.max_num_batched_tokens",
        MAX_NUM_BATCHED_TOKENS,
    ),
    ({"server": {"max_queue_size": 10**9}}, "server.max_queue_size", MAX_QUEUE_SIZE),
    ({"tuner": {"window": 10**6}}, "tuner.window", MAX_TUNER_WINDOW),
    (
        {"tuner": {"min_observations": 10**6, "window": 10**6}},
        "tuner.min_observations",
        MAX_TUNER_WINDOW,
    ),
    ({"replicas": {"max": 10**9}}, "replicas.max", MAX_REPLICAS),
    ({"scale_down_stabilization_s": 10**9}, "scale_down_stabilization_s", MAX_STABILIZATION_S),
    # Larger deadlines overflow the platform's timers: every read would fail.
    ({"source": {"scrape_urls": ["http://x/"], "scrape_timeout_s": 1e12}},
     "source.scrape_timeout_s", MAX_TIMEOUT_S),  # fmt: skip
    # Each factor within its bound, their product not: 16384 x 1000 cells per fit.
    (
        {"server": {"max_num_seqs": MAX_NUM_SEQS}, "tuner": {"window": MAX_TUNER_WINDOW}},
        "tuner.window",
        MAX_MODEL_CELLS,
    ),
]


@pytest.mark.parametrize(("override", "key", "limit"), TOO_LARGE)
def test_sizes_beyond_the_limits_are_refused_naming_key_and_limit(
    override: dict[str, Any], key: str, limit: float
) -> None:
    found = problems({"deployments": [deployment(**override)]})
    bound = f"<= {limit:g}" if isinstance(limit, float) else f"<= {limit}"
    assert any(p.startswith(f"deployments[0].{key}: ") and bound in p for p in found), found


def test_the_limits_themselves_are_accepted() -> None:
    dep = deployment(
        server={"max_num_seqs": MAX_NUM_SEQS, "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS},
        tuner={"window": MAX_MODEL_CELLS // MAX_NUM_SEQS},
        replicas={"max": MAX_REPLICAS},
        scale_down_stabilization_s=MAX_STABILIZATION_S,
    )
    config = parse_config({"cycle_period_s": MAX_CYCLE_PERIOD_S, "deployments": [dep]})
    assert config.deployments[0].server.max_batch_size == MAX_NUM_SEQS


@pytest.mark.parametrize("period", [0.5, MAX_CYCLE_PERIOD_S + 1, 1e300])
def test_cycle_period_has_a_range(period: float) -> None:
    found = problems({"cycle_period_s": period, "deployments": [deployment()]})
    assert found[0].startswith("cycle_period_s: must be a number >= 1 and <= 3600")


def test_the_number_of_deployments_is_bounded() -> None:
    deps = [deployment(f"d{k}") for k in range(MAX_DEPLOYMENTS + 1)]
    assert problems({"deployments": deps}) == [
        f"deployments: must hold at most {MAX_DEPLOYMENTS} deployments, got {MAX_DEPLOYMENTS + 1}"
    ]
    assert len(parse_config({"deployments": deps[:MAX_DEPLOYMENTS]}).deployments) == 256


def _deep(levels: int) -> Any:
    node: Any = "leaf"
    for _ in range(levels):
        node = {"k": [node, node]}  # shared: 2**levels leaves if walked in full
    return node


HUGE = [
    ({"name": "X" * 1_000_000}, "deployments[0].name"),
    ({"slo": {"ttft_ms": "5" * 1_000_000}}, "deployments[0].slo.ttft_ms"),
    ({"slo": list(range(1_000_000))}, "deployments[0].slo"),
    ({"slo": _deep(20)}, "deployments[0].slo.k"),
    ({"x" * 1_000_000: 1}, "deployments[0].xxx"),  # an unknown key: its name is cut too
    ({"source": {"scrape_urls": ["nope"] * 1_000_000}}, "deployments[0].source.scrape_urls"),
]


@pytest.mark.parametrize(("override", "key"), HUGE)
def test_messages_quote_at_most_a_short_piece_of_a_value(
    override: dict[str, Any], key: str
) -> None:
    began = time.monotonic()
    found = problems({"deployments": [deployment(**override)]})
    assert time.monotonic() - began < 2.0
    (problem,) = [p for p in found if p.startswith(key)]
    # The key path, the rule (at most the allowed keys) and a value cut to SHOWN_CHARS.
    assert len(problem) < 2 * SHOWN_CHARS + 200, problem[:300]
    assert "..." in problem, problem  # the cut is marked


def test_a_file_of_many_bad_keys_lists_a_bounded_number() -> None:
    data: dict[str, Any] = {f"bad_{k}": k for k in range(10_000)}
    data["deployments"] = [deployment()]
    found = problems(data)
    assert len(found) == MAX_PROBLEMS_SHOWN + 1
    assert re.fullmatch(r"\(document\): \d+ more problems", found[-1])


def test_the_response_body_cap_is_32_mib_unless_configured() -> None:
    assert parse_config({"deployments": [deployment()]}).max_response_bytes == 32 * MIB
    config = parse_config({"max_response_mib": 1, "deployments": [deployment()]})
    assert config.max_response_bytes == MIB
    top = parse_config({"max_response_mib": MAX_RESPONSE_MIB, "deployments": [deployment()]})
    assert top.max_response_bytes == MAX_RESPONSE_MIB * MIB


@pytest.mark.parametrize("value", [0, -1, MAX_RESPONSE_MIB + 1, 10**400, 1.5, "32", True])
def test_the_response_body_cap_has_a_range(value: object) -> None:
    found = problems({"max_response_mib": value, "deployments": [deployment()]})
    assert found[0].startswith(
        f"max_response_mib: must be an integer >= 1 and <= {MAX_RESPONSE_MIB} (MiB)"
    ), found
    assert len(found[0]) < 2 * SHOWN_CHARS + 200


def test_the_prometheus_timeout_is_bounded() -> None:
    found = problems({"prometheus": {"url": "http://p:9090", "timeout_s": 1e12},
                      "deployments": [deployment()]})  # fmt: skip
    assert found == [f"prometheus.timeout_s: must be a number > 0 and <= {MAX_TIMEOUT_S:g} "
                     "(seconds), got 1000000000000.0"]  # fmt: skip
