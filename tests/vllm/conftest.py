"""A real vLLM (CPU build) on loopback for the `vllm`-marked tests; `make test-vllm` prepares it."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from bench.real_vllm.server import (
    MODEL_DIR,
    RunningServer,
    ServerOptions,
    stop_on_sigterm,
    vllm_server,
)
from bench.real_vllm.tiny_model import STAMP_NAME
from bench.real_vllm.vllm_env import STAMP as VENV_STAMP


def require_prepared() -> None:
    """Fail with the fix when the cached virtualenv or model is missing."""
    if not VENV_STAMP.exists() or not (MODEL_DIR / STAMP_NAME).exists():
        pytest.fail("the vLLM virtualenv or tiny model is missing: run `make test-vllm`")


@pytest.fixture(scope="module")
def vllm() -> Iterator[RunningServer]:
    """One server per test module, so no two vLLMs ever share the two cores."""
    require_prepared()
    with vllm_server(ServerOptions(), log_name="tests") as server:
        yield server


@pytest.fixture(scope="session", autouse=True)
def _sigterm_unwinds() -> Iterator[None]:
    """A SIGTERM to pytest unwinds the server fixtures, so vLLM is killed with it."""
    previous = signal.getsignal(signal.SIGTERM)
    stop_on_sigterm()
    yield
    signal.signal(signal.SIGTERM, previous)
