"""A state file of any shape either restores or is set aside: the daemon always starts."""

from __future__ import annotations

import copy
import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from exporter.base.clock import ManualClock
from exporter.config.values import Config, DeploymentConfig, SloConfig, SourceConfig
from exporter.daemon.daemon import Daemon
from exporter.daemon.deployment_state import saved_state
from exporter.daemon.statefile import MAX_STATE_BYTES, STATE_VERSION, StateFile
from model import Observation, ServerConfig, ServiceParams

LLAMA = ServiceParams(6.68, 2.01e-2, 5.52e-5)
CLOCK_S = 1_700_000_000.0
DEPLOYMENT = DeploymentConfig(
    name="llama",
    model_name="llama",
    source=SourceConfig(scrape_urls=("http://127.0.0.1:1/",)),
    server=ServerConfig(),
    slo=SloConfig(ttft_ms=60.0, itl_ms=20.0),
    initial_params=LLAMA,
)


class NeverRead:
    def read(self) -> Any:
        raise AssertionError("no cycle runs in these tests")


class GivenState:
    """A StateFile stand-in that loads a given state (for states `save` cannot write)."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.path = Path("given.json")
        self._state = state

    def load(self) -> dict[str, Any]:
        return self._state

    def set_aside(self, problem: str) -> None:
        self.problem = problem


def start(statefile: Any) -> Daemon:
    config = Config(deployments=(DEPLOYMENT,))
    return Daemon(
        config, {"llama": NeverRead()}, CollectorRegistry(), ManualClock(CLOCK_S), statefile
    )


def good_state() -> dict[str, Any]:
    """What a daemon that calibrated and decided saves: every section filled."""
    state = saved_state(start(None).sizer.cycles)
    entry = state["deployments"]["llama"]
    obs = Observation(
        rate_rps=1.0, avg_input_tokens=1000.0, avg_output_tokens=500.0, ttft_ms=40.0, itl_ms=8.0
    )
    entry["tuner"]["window"] = [obs.to_dict()] * 3
    entry["recommender"] = {"history": [[CLOCK_S - 10.0, 3]]}
    entry["workload"] = [1000.0, 500.0]
    return state


def test_a_good_state_restores(tmp_path: Path) -> None:
    statefile = StateFile(tmp_path / "state.json")
    statefile.save(good_state())
    daemon = start(statefile)
    runtime = daemon.runtimes["llama"].cycle
    assert len(runtime.tuner.window) == 3 and runtime.workload is not None
    assert list(tmp_path.iterdir()) == [tmp_path / "state.json"]


def test_what_the_windows_identified_survives_a_restart(tmp_path: Path) -> None:
    """Once windows showed how latency grows with load, a restart at one operating point does
    not cut the published capacity to the rates served (exporter.sizing.evidence)."""
    state = good_state()
    assert state["deployments"]["llama"]["slope_known"] is False  # nothing seen yet
    state["deployments"]["llama"]["slope_known"] = True
    statefile = StateFile(tmp_path / "state.json")
    statefile.save(state)
    assert start(statefile).runtimes["llama"].cycle.growth_seen
    state["deployments"]["llama"]["slope_known"] = "yes"
    given = GivenState(state)
    assert not start(given).runtimes["llama"].cycle.growth_seen
    assert "slope_known must be true or false, got 'yes'" in given.problem


def _truncated() -> bytes:
    text = json.dumps({"version": STATE_VERSION, "state": good_state()})
    return text[: len(text) // 2].encode()


UNUSABLE = {
    "empty": b"",
    "truncated": _truncated(),
    "binary": bytes(range(256)),
    "latin-1": '{"version": 1, "state": {"x": "café"}}'.encode("latin-1"),
    "list": b"[1, 2, 3]",
    "string": b'"state"',
    "null": b"null",
    "other-version": b'{"version": 2, "state": {}}',
    "state-list": b'{"version": 1, "state": [1, 2]}',
    "deep": b"[" * 100_000 + b"]" * 100_000,
    "huge-int": b'{"version": 1, "state": {"x": ' + b"9" * 10_000 + b"}}",
}


@pytest.mark.parametrize("content", list(UNUSABLE.values()), ids=list(UNUSABLE))
def test_an_unusable_file_is_set_aside_with_one_warning(
    tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "state.json"
    path.write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="exporter.daemon.statefile"):
        assert StateFile(path).load() == {}
    (aside,) = tmp_path.glob("state.json.bad-*")
    assert aside.read_bytes() == content and not path.exists()
    assert int(aside.name.rsplit("-", 1)[1]) > 1_600_000_000  # unix seconds
    records = [r for r in caplog.records if r.name == "exporter.daemon.statefile"]
    assert len(records) == 1 and str(aside) in records[0].getMessage()


def test_a_file_over_the_size_cap_is_set_aside_unparsed(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    with path.open("wb") as fh:
        fh.truncate(MAX_STATE_BYTES + 1)  # sparse: 64 MiB of NUL bytes
    assert StateFile(path).load() == {}
    assert [p.name.split("-")[0] for p in tmp_path.iterdir()] == ["state.json.bad"]


def test_the_daemon_starts_fresh_after_a_garbage_file(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_bytes(b"\x00\x01 not json")
    daemon = start(StateFile(path))
    assert daemon.runtimes["llama"].cycle.tuner.window == ()
    assert len(list(tmp_path.glob("state.json.bad-*"))) == 1


SHAPES: list[Any] = [
    {"deployments": [1, 2]},  # crashed every start: `.get` on a list
    {"deployments": "llama"},
    {"deployments": 5},
    {"deployments": {"llama": [1]}},
    {"deployments": {"llama": "x"}},
    {"deployments": {"llama": {"tuner": []}}},
    {"deployments": {"llama": {"tuner": {"version": 1, "config": []}}}},
    {"deployments": {"llama": {"tuner": {"version": 1, "config": {"server": []}}}}},
]


@pytest.mark.parametrize("state", SHAPES)
def test_any_shape_of_saved_deployments_starts_fresh(state: dict[str, Any]) -> None:
    daemon = start(GivenState(state))
    assert daemon.runtimes["llama"].cycle.tuner.params == LLAMA  # the configured seed, untouched


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for k, value in enumerate(node):
            out += _paths(value, (*prefix, k))
    return out


def _replace(state: Any, path: tuple[Any, ...], value: Any) -> None:
    node = state
    try:
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    except (IndexError, KeyError, TypeError):
        pass  # an earlier replacement took this path away


GOOD = good_state()
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    replacements=st.lists(
        st.tuples(st.sampled_from(_paths(GOOD)[1:]), JSON_VALUES), min_size=1, max_size=3
    )
)
def test_any_mutation_of_a_saved_state_restores_or_starts_fresh(
    replacements: list[tuple[tuple[Any, ...], Any]],
) -> None:
    state = copy.deepcopy(GOOD)
    for path, value in replacements:
        _replace(state, path, value)
    runtime = start(GivenState(state)).runtimes["llama"].cycle
    assert runtime.tuner is not None


def test_check_writable(tmp_path: Path) -> None:
    assert StateFile(tmp_path / "sub" / "state.json").check_writable() is None
    assert list((tmp_path / "sub").iterdir()) == []  # its probe file is gone
    (tmp_path / "file").write_text("")
    reason = StateFile(tmp_path / "file" / "state.json").check_writable()
    assert reason is not None and str(tmp_path / "file") in reason
    assert StateFile(tmp_path).check_writable() == f"{tmp_path} is a directory"
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        reason = StateFile(locked / "state.json").check_writable()
        assert reason == f"cannot write in {locked}: Permission denied"


def _poisoned(where: str, key: str, value: Any) -> dict[str, Any]:
    state = good_state()
    entry = state["deployments"]["llama"]
    if where == "workload":
        entry["workload"] = [value, 500.0]
    elif where == "server":
        entry["tuner"]["config"]["server"][key] = value
    elif where == "config":
        entry["tuner"]["config"][key] = value
    else:
        entry["tuner"][where] = [{**obs, key: value} for obs in entry["tuner"]["window"]]
    return state


POISONED = {
    "window-B": ("window", "max_batch_size", 100_000_000),
    "window-tokens": ("window", "avg_input_tokens", 1e12),
    "curve-tokens": ("itl_curve", "avg_output_tokens", 1e12),
    "workload-tokens": ("workload", "", 1e12),
    "server-B": ("server", "max_batch_size", 100_000_000),
    "server-queue": ("server", "max_queue_size", 10**9),
    "window-size": ("config", "window_size", 10**9),
}


@pytest.mark.parametrize("poison", list(POISONED.values()), ids=list(POISONED))
def test_a_state_beyond_the_config_bounds_is_not_restored_and_set_aside(
    tmp_path: Path, poison: tuple[str, str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """ST1: windows with `max_batch_size: 100000000` or `avg_input_tokens: 1e12` were restored
    (then every cycle a MemoryError at 1.7 GB, or a first cycle that never ended), and the file
    stayed, so every restart repeated it."""
    path = tmp_path / "state.json"
    StateFile(path).save(_poisoned(*poison))
    with caplog.at_level(logging.ERROR):
        runtime = start(StateFile(path)).runtimes["llama"].cycle
    assert runtime.tuner.window == () and runtime.workload is None
    assert runtime.tuner.params == LLAMA  # the configured seed
    assert not path.exists() and len(list(tmp_path.glob("state.json.bad-*"))) == 1
    assert any("bound" in r.getMessage() for r in caplog.records), caplog.text
