"""/api/v1/predict under load while cycles run: every answer is the what-if of one published
estimate, never a mix of a cycle's new request shape or window with the previous parameters."""

from __future__ import annotations

import json
import threading
from typing import Any
from urllib.error import HTTPError
from urllib.request import urlopen

from prometheus_client import CollectorRegistry

from exporter.base.clock import ManualClock
from exporter.daemon.daemon import Daemon
from exporter.daemon.server import SizerHTTPServer
from exporter.testbed.emulator import EmulatedFleet
from tests.exporter.daemon.test_daemon import FleetSource, config, cycles, fleet  # noqa: F401

THREADS = 8
MIN_CALLS = 3000
MIN_CYCLES = 12
QUERY = "deployment=llama&rate=12&replicas=3&percentiles=95"
Answer = str | None  # the JSON answer, canonical; None: no estimate yet (404)


def _canonical(body: dict[str, Any]) -> str:
    return json.dumps(body, sort_keys=True)


def _ask(url: str) -> Answer:
    try:
        with urlopen(url, timeout=30) as resp:
            return _canonical(json.loads(resp.read()))
    except HTTPError as exc:
        if exc.code == 404:
            return None
        raise


def test_every_predict_answer_is_one_published_estimates(fleet) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    emulated, clock = fleet
    assert isinstance(emulated, EmulatedFleet) and isinstance(clock, ManualClock)
    registry = CollectorRegistry()
    daemon = Daemon(config(), {"llama": FleetSource(emulated)}, registry, emulated.sim_clock)
    http = SizerHTTPServer("127.0.0.1", 0, registry, daemon.ready, daemon.predict)
    http.start()
    url = f"http://127.0.0.1:{http.port}/api/v1/predict?{QUERY}"
    stop = threading.Event()
    answers: list[Answer] = []
    failures: list[BaseException] = []

    def hammer() -> None:
        try:
            while not stop.is_set():
                answers.append(_ask(url))
        except BaseException as exc:  # reported by the test, not lost in a thread
            failures.append(exc)

    # Between cycles nothing changes: the answer then is the one each estimate stands for.
    published: set[Answer] = {_ask(url)}
    threads = [threading.Thread(target=hammer) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    try:
        done = 0
        while (done < MIN_CYCLES or len(answers) < MIN_CALLS) and not failures:
            cycles(daemon, emulated, clock, 1)
            done += 1
            published.add(_ask(url))
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        http.stop()
    assert not failures, failures
    assert len(answers) >= MIN_CALLS
    assert len(published - {None}) >= MIN_CYCLES // 2  # the estimate moved from cycle to cycle
    strays = [a for a in answers if a not in published]
    assert not strays, f"{len(strays)} of {len(answers)} answers match no published estimate"
