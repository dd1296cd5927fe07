"""Load generator against a small fake streaming completions server on loopback."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import numpy as np
import pytest

from exporter.testbed.completion_stream import completion_payload
from exporter.testbed.load_run import LoadSpec, RequestStatus
from exporter.testbed.loadgen import arrival_offsets_s, random_prompt, run_load

# Tests that talk HTTP to the fake server on loopback carry the integration marker (style §7).
loopback = pytest.mark.integration


@dataclass
class FakeServer:
    """Streams `max_tokens` SSE chunks, `token_delay_s` apart, chunked or with no length."""

    token_delay_s: float = 0.002
    status: int = 200
    chunked: bool = True
    send_done: bool = True
    bodies: list[dict[str, object]] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._respond(reader, writer)
        finally:
            writer.close()

    async def _respond(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        headers: dict[str, str] = {}
        await reader.readline()
        while line := (await reader.readline()).strip():
            name, _, value = line.decode().partition(":")
            headers[name.lower()] = value.strip()
        body = json.loads(await reader.readexactly(int(headers["content-length"])))
        self.bodies.append(body)
        if self.status != 200:
            text = b'{"error": "bad"}'
            head = b"HTTP/1.1 %d Bad\r\nContent-Length: %d\r\n\r\n" % (self.status, len(text))
            writer.write(head + text)
            await writer.drain()
            return
        te = b"Transfer-Encoding: chunked\r\n" if self.chunked else b""
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n" + te + b"\r\n")
        n = int(body["max_tokens"])
        events = [{"choices": [{"text": "x", "index": 0}]} for _ in range(n)]
        events.append({"choices": [], "usage": {"prompt_tokens": len(body["prompt"]),
                                                "completion_tokens": n}})
        for i, event in enumerate(events):
            if i:
                await asyncio.sleep(self.token_delay_s)
            self._send(writer, b"data: " + json.dumps(event).encode() + b"\n\n")
            await writer.drain()
        if self.send_done:
            self._send(writer, b"data: [DONE]\n\n")
        if self.chunked:
            writer.write(b"0\r\n\r\n")
        await writer.drain()

    def _send(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        if self.chunked:
            writer.write(b"%x\r\n" % len(data) + data + b"\r\n")
        else:
            writer.write(data)


@asynccontextmanager
async def serving(fake: FakeServer) -> AsyncIterator[str]:
    server = await asyncio.start_server(fake.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()


def spec_for(url: str, **overrides: object) -> LoadSpec:
    values: dict[str, object] = dict(base_url=url, model="tiny", rate_rps=200.0, input_tokens=7,
                                     output_tokens=5, duration_s=0.1, timeout_s=5.0, drain_s=5.0)
    values.update(overrides)
    return LoadSpec(**values)  # type: ignore[arg-type]


def run(fake: FakeServer, rng: np.random.Generator, **overrides: object):  # noqa: ANN201
    async def go():  # noqa: ANN202
        async with serving(fake) as url:
            return await run_load(spec_for(url, **overrides), rng)

    return asyncio.run(go())


@loopback
@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "until-close"])
def test_counts_tokens_and_latencies(chunked: bool, rng: np.random.Generator) -> None:
    fake = FakeServer(chunked=chunked)
    result = run(fake, rng)
    assert result.sent >= 5
    assert result.failed == 0
    assert result.prompt_tokens_total == 7 * result.sent
    assert result.output_tokens_total == 5 * result.sent
    for record in result.records:
        assert record.ttft_ms is not None and record.ttft_ms > 0
        assert len(record.itl_ms) == 4 and min(record.itl_ms) >= 0
        assert record.ttft_ms + sum(record.itl_ms) <= record.e2e_ms + 1e-6
        assert record.tpot_ms is not None and record.tpot_ms > 0
        assert record.send_s < record.end_s
    # Chunks leave the server 2 ms apart; a busy client loop may read two at once now and
    # then, so the typical gap, not every gap, shows the spacing.
    assert np.median([g for r in result.records for g in r.itl_ms]) >= 1.0
    assert len(fake.bodies) == result.sent


@loopback
def test_payload_asks_for_exact_lengths(rng: np.random.Generator) -> None:
    fake = FakeServer()
    run(fake, rng, max_requests=1)
    body = fake.bodies[0]
    assert body["stream"] is True and body["ignore_eos"] is True
    assert body["max_tokens"] == 5
    assert isinstance(body["prompt"], list) and len(body["prompt"]) == 7


@loopback
def test_http_error_is_recorded_not_raised(rng: np.random.Generator) -> None:
    result = run(FakeServer(status=400), rng, max_requests=3)
    assert result.sent == 3 and result.failed == 3
    assert {r.status for r in result.records} == {RequestStatus.HTTP_ERROR}
    assert "HTTP 400" in result.records[0].message


@loopback
def test_stream_without_done_is_a_protocol_error(rng: np.random.Generator) -> None:
    result = run(FakeServer(send_done=False), rng, max_requests=2)
    assert {r.status for r in result.records} == {RequestStatus.PROTOCOL_ERROR}


@loopback
def test_slow_request_times_out(rng: np.random.Generator) -> None:
    result = run(FakeServer(token_delay_s=0.5), rng, max_requests=1, timeout_s=0.2)
    assert result.records[0].status is RequestStatus.TIMEOUT
    assert result.records[0].ttft_ms is None


@loopback
def test_drain_deadline_bounds_the_run(rng: np.random.Generator) -> None:
    result = run(FakeServer(token_delay_s=0.5), rng, max_requests=2, timeout_s=30.0, drain_s=0.2)
    assert result.elapsed_s < 1.0
    assert {r.status for r in result.records} == {RequestStatus.TIMEOUT}


@loopback
def test_refused_connection_is_recorded(rng: np.random.Generator) -> None:
    async def go():  # noqa: ANN202
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        return await run_load(spec_for(f"http://127.0.0.1:{port}", max_requests=1), rng)

    result = asyncio.run(go())
    assert result.records[0].status is RequestStatus.CONNECT_ERROR


def test_count_bound(rng: np.random.Generator) -> None:
    offsets = arrival_offsets_s(1000.0, 10.0, 25, rng)
    assert offsets.size == 25


def test_poisson_arrivals_have_the_asked_rate(rng: np.random.Generator) -> None:
    offsets = arrival_offsets_s(50.0, 200.0, 100_000, rng)
    assert abs(offsets.size / 200.0 - 50.0) < 2.0
    gaps = np.diff(offsets)
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.05  # exponential: coefficient of variation 1
    assert np.all(offsets < 200.0) and np.all(gaps > 0)


def test_same_seed_same_arrivals_and_prompts() -> None:
    spec = spec_for("http://127.0.0.1:1")
    a, b = np.random.default_rng(7), np.random.default_rng(7)
    first, second = arrival_offsets_s(3.0, 10.0, 100, a), arrival_offsets_s(3.0, 10.0, 100, b)
    assert np.array_equal(first, second)
    assert random_prompt(spec, a) == random_prompt(spec, b)
    assert min(completion_payload(spec, random_prompt(spec, a))["prompt"]) >= spec.low_token_id


@pytest.mark.parametrize(
    "url", ["http://10.0.0.1:8000", "https://127.0.0.1:8000", "http://example.com"],
    ids=["private", "https", "dns-name"],
)
def test_only_loopback_targets(url: str) -> None:
    with pytest.raises(ValueError, match=r"`base_url` must be an http:// URL on a loopback host"):
        spec_for(url)


@pytest.mark.parametrize(
    ("name", "value"),
    [("rate_rps", 0.0), ("input_tokens", 0), ("output_tokens", 0), ("duration_s", -1.0),
     ("max_requests", 0), ("timeout_s", 0.0)],
)
def test_bad_spec_names_the_field(name: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"`{name}` must be .*got {value}"):
        spec_for("http://127.0.0.1:1", **{name: value})
