"""A real vLLM (CPU build) on loopback for the `vllm`-marked tests; `make test-vllm` prepares it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench.real_vllm.server import MODEL_DIR, RunningServer, ServerOptions, vllm_server
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
