"""The daemon's log reads as healthy when it is: one INFO line per cycle per deployment; a
failing source is one WARNING per streak and an INFO line when it recovers; an unexpected error
is one ERROR line with its cause, the traceback at DEBUG only."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry

from exporter.base.errors import PrometheusQueryError
from exporter.daemon.daemon import Daemon
from tests.exporter.daemon.test_daemon import FleetSource, config, cycles
from tests.exporter.daemon.test_daemon import fleet as fleet  # noqa: F401  (the fixture)


def records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == level and r.name.startswith("exporter")]


def test_a_healthy_daemon_logs_one_info_line_per_cycle(  # type: ignore[no-untyped-def]
    fleet, caplog: pytest.LogCaptureFixture
) -> None:
    emulated, clock = fleet
    daemon = Daemon(config(), {"llama": FleetSource(emulated)}, CollectorRegistry(),
                    emulated.sim_clock)  # fmt: skip
    with caplog.at_level(logging.INFO):
        cycles(daemon, emulated, clock, 4)
    lines = [r.getMessage() for r in records(caplog, logging.INFO)]
    assert len(lines) == 4, lines
    for text in lines:  # observed, decided and why
        for field in ("deployment=llama", "rate_rps=", "replicas=2->", "reason=", "ttft_ms=",
                      "tuner="):  # fmt: skip
            assert field in text, text
    assert records(caplog, logging.WARNING) == [] and records(caplog, logging.ERROR) == []


def test_a_failing_source_warns_once_per_streak_and_says_when_it_recovers(  # type: ignore[no-untyped-def]
    fleet, caplog: pytest.LogCaptureFixture
) -> None:
    emulated, clock = fleet
    source = FleetSource(emulated)
    daemon = Daemon(config(), {"llama": source}, CollectorRegistry(), emulated.sim_clock)
    cycles(daemon, emulated, clock, 2)
    source.down = True
    with caplog.at_level(logging.INFO):
        cycles(daemon, emulated, clock, 3)
        source.down = False
        cycles(daemon, emulated, clock, 1)
    warnings = [r.getMessage() for r in records(caplog, logging.WARNING)]
    assert len(warnings) == 1 and "llama: source failed (connection)" in warnings[0], warnings
    infos = [r.getMessage() for r in records(caplog, logging.INFO)]
    assert "llama: source recovered after 3 failed cycle(s) (connection)" in infos
    assert sum("reason=source_down" in m for m in infos) == 3
    assert all("replicas=None" not in m for m in infos)


def test_an_unexpected_error_is_one_line_with_its_cause(  # type: ignore[no-untyped-def]
    fleet, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    emulated, clock = fleet
    daemon = Daemon(config(), {"llama": FleetSource(emulated)}, CollectorRegistry(),
                    emulated.sim_clock)  # fmt: skip

    def boom(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("boom")

    cycles(daemon, emulated, clock, 1)  # a first decision to keep
    monkeypatch.setattr(daemon.runtimes["llama"].cycle.recommender, "decide", boom)
    with caplog.at_level(logging.DEBUG, logger="exporter.daemon.daemon"):
        cycles(daemon, emulated, clock, 1)
    errors = records(caplog, logging.ERROR)
    assert [r.getMessage() for r in errors] == ["llama: cycle failed: RuntimeError: boom"]
    assert errors[0].exc_info is None
    assert [r.levelno for r in caplog.records if r.exc_info] == [logging.DEBUG]


def test_an_unexpected_error_in_a_first_cycle_publishes_the_other_deployments(  # type: ignore[no-untyped-def]
    fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    emulated, clock = fleet
    two = replace(config(), deployments=(config().deployments[0], replace(
        config().deployments[0], name="other")))  # fmt: skip
    source = FleetSource(emulated)
    daemon = Daemon(two, {"llama": source, "other": source}, CollectorRegistry(),
                    emulated.sim_clock)  # fmt: skip

    def boom(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(daemon.runtimes["llama"].cycle.recommender, "decide", boom)
    clock.advance(30.0)
    emulated.sync()
    snapshot = daemon.run_cycle()  # raised before: no decision yet to publish for llama
    assert [s.deployment for s in snapshot.deployments] == ["other"]


def test_a_prometheus_error_message_shows_the_start_of_its_query() -> None:
    query = '{__name__=~"' + "|".join(f"vllm:metric_{k}" for k in range(100)) + '"}'
    assert len(query) > 1500
    exc = PrometheusQueryError("http://prom:9090/api/v1/query", query, "connection refused")
    text = str(exc)
    assert len(text) < 200
    assert text.startswith("http://prom:9090/api/v1/query: connection refused [query {__name__")
    assert exc.query == query
