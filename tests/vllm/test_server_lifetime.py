"""The vLLM server manager's lifetime rules, on a stand-in server: no real vLLM, so no marker.

A stand-in process answers /v1/models like vLLM and starts a child in its process group (as
vLLM starts its engine core); whatever way the `with` block ends, both must be gone.
"""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

import pytest

from bench.real_vllm.server import ServerOptions, ServerStartError, vllm_server

pytestmark = pytest.mark.integration

STAND_IN = textwrap.dedent('''
    import http.server, json, os, subprocess, sys, time
    port, mode = int(sys.argv[1]), sys.argv[2]
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    print("child", child.pid, flush=True)
    if mode == "crash":
        sys.exit(3)
    if mode == "deaf":
        import signal
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    class Models(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"data": [{"id": "tiny"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        def log_message(self, *args):
            pass
    if mode != "mute":
        http.server.HTTPServer(("127.0.0.1", port), Models).serve_forever()
    time.sleep(300)
''')


@pytest.fixture(autouse=True)
def _fast_polling(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("bench.real_vllm.server.POLL_INTERVAL_S", 0.05)


def stand_in(mode: str):  # noqa: ANN201
    return lambda port: [sys.executable, "-c", STAND_IN, str(port), mode]


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie awaiting its reaper."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def child_pid(log_path: Path) -> int:
    for _ in range(50):
        for line in log_path.read_text().splitlines():
            if line.startswith("child "):
                return int(line.split()[1])
        time.sleep(0.1)
    raise AssertionError(f"stand-in never reported its child: {log_path.read_text()!r}")


def gone(*pids: int, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not any(alive(pid) for pid in pids):
            return True
        time.sleep(0.05)
    return False


def test_normal_exit_kills_the_whole_group(tmp_path: Path) -> None:
    with vllm_server(log_dir=tmp_path, command=stand_in("serve")) as server:
        child = child_pid(server.log_path)
        assert alive(server.pid) and alive(child)
        assert server.base_url == f"http://127.0.0.1:{server.port}"
    assert gone(server.pid, child)


def test_an_exception_in_the_block_still_kills_it(tmp_path: Path) -> None:
    pids: list[int] = []
    with pytest.raises(RuntimeError, match="boom"):  # noqa: PT012
        with vllm_server(log_dir=tmp_path, command=stand_in("serve")) as server:
            pids += [server.pid, child_pid(server.log_path)]
            raise RuntimeError("boom")
    assert gone(*pids)


def test_a_server_deaf_to_sigterm_is_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("bench.real_vllm.server.STOP_GRACE_S", 0.5)
    with vllm_server(log_dir=tmp_path, command=stand_in("deaf")) as server:
        child = child_pid(server.log_path)
    assert gone(server.pid, child)


def test_exit_during_startup_is_reported_with_the_log(tmp_path: Path) -> None:
    with pytest.raises(ServerStartError, match=r"exited with code 3(.|\n)*child \d+"):
        with vllm_server(log_dir=tmp_path, command=stand_in("crash")):
            pass
    (log,) = tmp_path.iterdir()
    assert gone(child_pid(log))


def test_startup_timeout_kills_the_group(tmp_path: Path) -> None:
    with pytest.raises(ServerStartError, match="not ready"):
        with vllm_server(ServerOptions(startup_timeout_s=1.5), log_dir=tmp_path,
                         command=stand_in("mute")):
            pass
    (log,) = tmp_path.iterdir()
    assert gone(child_pid(log))
