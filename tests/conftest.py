"""Shared fixtures: test data in tests/data (golden cases, paper grid, vLLM dumps), CRD schemas."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
# Figures the model and collector tests read; tests/data/README.md says where each comes from.
DATA_DIR = REPO_ROOT / "tests" / "data"
# The CRD schemas stay in the shared data folder beside the repository; VLLM_SIZER_SHARED overrides.
SHARED_DIR = Path(os.environ.get("VLLM_SIZER_SHARED", REPO_ROOT.parent / "shared"))


def shared_path(*parts: str) -> Path:
    path = SHARED_DIR.joinpath(*parts)
    if not path.exists():
        raise FileNotFoundError(f"shared data file missing: {path} (set VLLM_SIZER_SHARED)")
    return path


def load_golden_cases() -> list[dict[str, Any]]:
    with (DATA_DIR / "model-cases.json").open() as fh:
        return list(json.load(fh)["cases"])


def load_paper_grid() -> list[dict[str, str]]:
    with (DATA_DIR / "h100-grid.csv").open() as fh:
        return list(csv.DictReader(fh))


@pytest.fixture
def vllm_metrics_text() -> str:
    return (DATA_DIR / "vllm-0.32-cpu-tiny.txt").read_text()


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(12345)
