"""Set up everything a real-vLLM run needs: the cached virtualenv and the tiny model. Issue 9.

Run from the repository root: `python -m bench.real_vllm.prepare`. Both steps are skipped when
their stamps say they are done, so a second run takes a second.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.real_vllm.server import MODEL_DIR
from bench.real_vllm.tiny_model import STAMP_NAME
from bench.real_vllm.vllm_env import VenvInfo, ensure_venv, venv_python

TINY_MODEL_SCRIPT = Path(__file__).resolve().parent / "tiny_model.py"


@dataclass(frozen=True, slots=True)
class Prepared:
    """What prepare() did: the virtualenv, the model directory, and the model's build time (s)."""

    venv: VenvInfo
    model_dir: Path
    model_build_s: float


def ensure_model(model_dir: Path = MODEL_DIR) -> float:
    """Build the tiny model with the vLLM interpreter unless it exists; returns seconds spent."""
    if (model_dir / STAMP_NAME).exists():
        return 0.0
    start_s = time.monotonic()
    subprocess.run(
        [str(venv_python()), str(TINY_MODEL_SCRIPT), str(model_dir)],
        check=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    return time.monotonic() - start_s


def prepare() -> Prepared:
    """The virtualenv, then the model (which needs the virtualenv's torch and transformers)."""
    info = ensure_venv()
    build_s = ensure_model()
    return Prepared(venv=info, model_dir=MODEL_DIR, model_build_s=build_s)


def main() -> int:
    """CLI: prepare and report what was done."""
    done = prepare()
    venv_state = "cached" if done.venv.cached else f"installed in {done.venv.install_s:.0f} s"
    model_state = "cached" if done.model_build_s == 0 else f"built in {done.model_build_s:.0f} s"
    print(f"vLLM virtualenv {venv_state}; model {model_state} ({done.model_dir.name}/)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
