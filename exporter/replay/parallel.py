"""`vllm-sizer replay`'s policies in parallel processes (issue 45): the policies are split into
`jobs` groups, each replayed by a forked process on its own copy of the arrivals (the same
requests: a fresh source from the same seed), and the scorecards joined into one result.

The processes step their windows in lockstep: after each window every process says whether its
arms were at rest and the parent answers whether all were, so idle stretches are skipped
exactly where one process holding every arm would skip them (exporter/replay/engine.py), and
the report is the one-process report, figure for figure. The same answer carries the parent's
`stop()` (Ctrl-C): the processes stop after the window that follows. They ignore SIGINT
themselves; the parent alone decides. `on_step` sees each step without its arms (progress).
"""

from __future__ import annotations

import multiprocessing
import signal
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

from exporter.replay.engine import ArrivalSource, Step
from exporter.replay.policies import PolicyName
from exporter.replay.session import ReplayResult, replay
from exporter.replay.settings import ReplaySettings
from model.queueing.params import ServiceParams


def groups(policies: Sequence[PolicyName], jobs: int) -> list[tuple[PolicyName, ...]]:
    """The policies dealt round-robin into at most `jobs` non-empty groups."""
    jobs = max(1, min(jobs, len(policies)))
    return [tuple(policies[k::jobs]) for k in range(jobs)]


def replay_parallel(
    settings: ReplaySettings,
    truth: ServiceParams,
    policies: Sequence[PolicyName],
    arrivals: Callable[[], ArrivalSource],
    *,
    jobs: int,
    on_step: Callable[[Step, ReplayResult], None] | None = None,
    stop: Callable[[], bool] = lambda: False,
    skip_idle: bool = True,
) -> ReplayResult:
    """`replay` with the policies in `jobs` processes; `arrivals()` gives a fresh source of
    the same requests each call. One group: `replay` in this process."""
    parts = groups(policies, jobs)
    if len(parts) == 1:
        source = arrivals()
        try:
            result = replay(settings, truth, policies, source, on_step=on_step, stop=stop,
                            skip_idle=skip_idle)
        finally:
            _close(source)
        _note_source(result, source)
        return result
    began = time.perf_counter()
    context = multiprocessing.get_context("fork")
    pipes, workers = [], []
    for part in parts:
        mine, theirs = context.Pipe()
        worker = context.Process(target=_work, daemon=True,
                                 args=(theirs, settings, truth, part, arrivals, skip_idle))
        worker.start()
        theirs.close()
        pipes.append(mine)
        workers.append(worker)
    try:
        results = _drive(pipes, settings, truth, on_step, stop)
    finally:
        for worker in workers:
            worker.join(timeout=5.0)
            if worker.is_alive():
                worker.kill()
    merged = results[0]
    merged.policies = tuple(p.value for p in policies)
    merged.cards = {name: card for name in merged.policies for r in results
                    for n, card in r.cards.items() if n == name}
    for r in results[1:]:
        merged.rejected.update(r.rejected)
        merged.final_params.update(r.final_params)
        merged.partial = merged.partial or r.partial
    merged.rejected = {name: merged.rejected[name] for name in merged.policies}
    merged.wall_s = time.perf_counter() - began
    return merged


def _drive(
    pipes: list[Connection],
    settings: ReplaySettings,
    truth: ServiceParams,
    on_step: Callable[[Step, ReplayResult], None] | None,
    stop: Callable[[], bool],
) -> list[ReplayResult]:
    """Answer the processes' votes window by window until each has sent its result."""
    progress = ReplayResult(settings, truth, (), {})
    while True:
        kinds: list[str] = []
        values: list[Any] = []
        for index, pipe in enumerate(pipes):
            while True:
                kind, value = pipe.recv()
                if kind == "step":
                    if index == 0 and on_step is not None:
                        step, progress.windows, progress.arrivals = value
                        on_step(step, progress)
                    continue
                if kind == "error":
                    raise value
                kinds.append(kind)
                values.append(value)
                break
        if all(kind == "done" for kind in kinds):
            return values
        if any(kind == "done" for kind in kinds):
            raise RuntimeError("replay processes out of step: one finished while another "
                               "was still stepping")
        answer = (all(values), stop())
        for pipe in pipes:
            pipe.send(answer)


def _work(
    pipe: Connection,
    settings: ReplaySettings,
    truth: ServiceParams,
    policies: tuple[PolicyName, ...],
    arrivals: Callable[[], ArrivalSource],
    skip_idle: bool,
) -> None:
    """One process: replay its policies, voting on rest after each window."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the run
    stopping = False

    def vote(rest: bool) -> bool:
        nonlocal stopping
        pipe.send(("vote", rest))
        every, stop = pipe.recv()
        stopping = stopping or stop
        return bool(every)

    def report(step: Step, result: ReplayResult) -> None:
        light = Step(step.index, step.start_s, step.end_s, step.offered_rps, step.arrivals, (),
                     step.input_tokens, step.output_tokens, step.windows)
        pipe.send(("step", (light, result.windows, result.arrivals)))

    try:
        source = arrivals()
        try:
            result = replay(settings, truth, policies, source, on_step=report,
                            stop=lambda: stopping, skip_idle=skip_idle, rest_vote=vote)
        finally:
            _close(source)
        _note_source(result, source)
        pipe.send(("done", result))
    except BaseException as exc:  # noqa: BLE001 - every failure goes to the parent
        try:
            pipe.send(("error", exc))
        except Exception:  # noqa: BLE001 - an exception that does not pickle
            pipe.send(("error", RuntimeError(f"replay process failed: {exc!r}")))
    finally:
        pipe.close()


def _close(source: ArrivalSource) -> None:
    close = getattr(source, "close", None)
    if close is not None:
        close()


def _note_source(result: ReplayResult, source: ArrivalSource) -> None:
    """The rows the source read and the bad rows it skipped (the caller's report)."""
    result.rows_read = getattr(source, "rows", None)
    result.bad_rows = getattr(source, "bad_rows", 0)
