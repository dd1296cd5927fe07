"""One HTTP request over loopback: with `keep_line` the body holds exactly the accepted lines of
the whole body, whatever its read boundaries, drops an overlong line, keeps the size cap (and one
of its own on the kept lines) and holds no more than a read buffer of an endless body."""

from __future__ import annotations

import pytest

from exporter.base.errors import FailureReason
from exporter.collector.http_fetch import MAX_KEPT_BYTES, MAX_KEPT_LINE_BYTES, FetchError, fetch
from tests.fixtures.memory import MIB, peak_traced_mib
from tests.reliability.fault_server import Fault, FaultServer


def keep(line: bytes) -> bool:
    return line.startswith(b"keep")


def test_the_kept_lines_are_those_of_the_whole_body() -> None:
    # lines of many lengths, so that lines cross the 64 KiB read boundaries; no final newline
    lines = [(b"keep " if i % 3 else b"drop ") + b"x" * (i % 997) for i in range(2000)]
    body = b"\n".join(lines)
    with FaultServer(Fault.SERVE, [body.decode()]) as server:
        whole = fetch(server.url, deadline_s=10.0).body
        kept = fetch(server.url, deadline_s=10.0, keep_line=keep).body
    assert whole == body
    assert kept == b"".join(line + b"\n" for line in lines if keep(line))
    assert kept.count(b"\n") == sum(1 for i in range(2000) if i % 3)


def test_an_overlong_line_is_dropped_and_the_next_one_kept() -> None:
    body = "keep " + "x" * (3 * MAX_KEPT_LINE_BYTES) + "\nkeep me\nkeep " + "y" * 70_000
    with FaultServer(Fault.SERVE, [body]) as server:
        kept = fetch(server.url, deadline_s=10.0, keep_line=keep).body
    assert kept == b"keep me\n"


def test_kept_lines_past_their_cap_are_a_body_too_large() -> None:
    body = "keep this line\n" * (MAX_KEPT_BYTES // 15 + 1)
    with FaultServer(Fault.SERVE, [body]) as server:
        assert len(fetch(server.url, deadline_s=10.0).body) == len(body)
        with pytest.raises(FetchError) as caught:
            fetch(server.url, deadline_s=10.0, keep_line=keep)
    assert caught.value.reason is FailureReason.BODY_TOO_LARGE


@pytest.mark.parametrize("filtered", [False, True])
def test_an_endless_body_is_cut_at_the_cap(filtered: bool) -> None:
    with FaultServer(Fault.HUGE, max_seconds=20.0) as server:
        with pytest.raises(FetchError) as caught:
            fetch(
                server.url, deadline_s=10.0, max_body_bytes=MIB,
                keep_line=keep if filtered else None,
            )  # fmt: skip
    assert caught.value.reason is FailureReason.BODY_TOO_LARGE


def test_kept_lines_hold_a_read_buffer_of_an_endless_body_not_the_body() -> None:
    """Read to the 32 MiB cap, the whole body peaks at the cap; the kept lines at a few reads."""
    peaks_mib = {}
    with FaultServer(Fault.HUGE, max_seconds=60.0) as server:
        for filtered in (False, True):

            def read(filtered: bool = filtered) -> FailureReason:
                try:
                    fetch(server.url, deadline_s=30.0, keep_line=keep if filtered else None)
                except FetchError as exc:
                    return exc.reason
                raise AssertionError("an endless body was read to its end")

            reason, peaks_mib[filtered] = peak_traced_mib(read)
            assert reason is FailureReason.BODY_TOO_LARGE
    assert peaks_mib[False] > 30, peaks_mib
    assert peaks_mib[True] < 1, peaks_mib
