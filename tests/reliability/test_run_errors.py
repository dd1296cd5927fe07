"""`vllm-sizer run` refuses a file it cannot use, or a host that does not exist, with one line
on stderr and exit code 2, never a traceback; the bind failure's line is ready for run.py."""

from __future__ import annotations

import errno
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from exporter.config.loader import listen_problem
from exporter.config.values import Config
from exporter.daemon.server import SizerHTTPServer

REPO = Path(__file__).resolve().parents[2]
NO_SUCH_HOST = "no-such-host.invalid"  # RFC 2606: never resolves


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def config_text(listen: str, prometheus_url: str = "http://127.0.0.1:9090") -> str:
    return f"""\
listen_address: "{listen}"
prometheus: {{url: "{prometheus_url}"}}
deployments:
  - name: llama
    model_name: llama-3
    source: {{prometheus_selector: '{{namespace="x"}}'}}
    slo: {{ttft_ms: 500, itl_ms: 50}}
"""


def run(config: Path) -> tuple[int, list[str], str]:
    # Today's daemon starts (and is killed by the timeout) where it should have refused.
    done = subprocess.run(
        [sys.executable, "-m", "exporter.cli.main", "run", "--config", str(config)],
        capture_output=True,
        timeout=30,
        cwd=REPO,
    )
    stderr = done.stderr.decode(errors="replace")
    return done.returncode, stderr.splitlines(), stderr


def assert_one_line(config: Path, *words: str) -> None:
    code, lines, stderr = run(config)
    assert "Traceback" not in stderr, stderr
    assert code == 2, stderr
    assert len(lines) == 1 and lines[0].startswith("vllm-sizer: "), stderr
    for word in words:
        assert word in lines[0], lines[0]


@pytest.fixture
def resolver_says_no() -> Iterator[None]:
    """The host checks need a resolver that answers 'no such name' (not one that is down)."""
    try:
        socket.getaddrinfo(NO_SUCH_HOST, 80)
    except socket.gaierror as exc:
        if exc.errno != socket.EAI_NONAME:
            pytest.skip(f"the resolver does not answer here ({exc})")
    else:
        pytest.skip(f"{NO_SUCH_HOST} resolves here")
    yield


def test_a_non_utf8_file(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(
        config_text(f"127.0.0.1:{free_port()}").encode() + "# café\n".encode("latin-1")
    )
    assert_one_line(path, "not UTF-8")


@pytest.mark.parametrize(
    "content",
    [bytes(range(256)) * 4, b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", b"a: b\x00c\n", b"\xff\xfe"],
    ids=["all-bytes", "png", "nul", "bom-like"],
)
def test_a_binary_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "binary.yaml"
    path.write_bytes(content)
    assert_one_line(path, str(path))


@pytest.mark.usefixtures("resolver_says_no")
def test_an_unresolvable_prometheus_host(tmp_path: Path) -> None:
    path = tmp_path / "prometheus.yaml"
    path.write_text(config_text(f"127.0.0.1:{free_port()}", f"http://{NO_SUCH_HOST}:9090"))
    assert_one_line(path, "prometheus.url", NO_SUCH_HOST, "does not resolve")


@pytest.mark.usefixtures("resolver_says_no")
def test_an_unresolvable_listen_host(tmp_path: Path) -> None:
    path = tmp_path / "listen.yaml"
    path.write_text(config_text(f"{NO_SUCH_HOST}:{free_port()}"))
    assert_one_line(path, "listen_address", NO_SUCH_HOST, "does not resolve")


def test_a_port_in_use_has_a_one_line_message_for_run() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = int(busy.getsockname()[1])
        with pytest.raises(OSError) as info:
            SizerHTTPServer("127.0.0.1", port, CollectorRegistry(), lambda: True, None)  # type: ignore[arg-type]
    assert info.value.errno == errno.EADDRINUSE
    line = listen_problem(Config(listen_host="127.0.0.1", listen_port=port), info.value)
    assert line == f"listen_address 127.0.0.1:{port}: cannot listen (Address already in use)"
