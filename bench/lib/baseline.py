"""The frozen model the speed benches time beside today's, rebuilt from git history at bench time.

`load_baseline()` extracts `model/` as it stood at BASELINE_COMMIT (before the compiled kernel,
issue 19) into a temporary directory with `git archive`, rewrites its absolute `model` imports
to BASELINE_PACKAGE and imports it under that name: both models live in one process, so a speed
ratio does not depend on the machine's load. Nothing of it is kept in the tree; it needs the
commit in the clone's history (a shallow clone gets an error that says how to fetch it).
"""

from __future__ import annotations

import atexit
import importlib
import io
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from types import ModuleType

REPO_ROOT = Path(__file__).resolve().parents[2]
# main before the compiled kernel: the model the speed targets of issue 19 are ratios against.
BASELINE_COMMIT = "a3d9c4891d7ed12c2b14d4c72cd995f63ed987a5"
BASELINE_PACKAGE = "vllm_sizer_baseline_model"
# `from model.x import y`, `from model import y`, `import model.x` (at any indentation).
_IMPORT = re.compile(r"^(\s*)(from|import) model(?=[.\s])", re.MULTILINE)


class BaselineUnavailable(RuntimeError):
    """The baseline commit cannot be read from this checkout (no git, shallow, or unknown)."""


def load_baseline(
    commit: str = BASELINE_COMMIT,
    package: str = BASELINE_PACKAGE,
    repo: Path = REPO_ROOT,
) -> ModuleType:
    """The `model` package of `commit` imported as `package` (imported once per process)."""
    if package in sys.modules:
        return sys.modules[package]
    archive = _archive(repo, commit)
    where = Path(tempfile.mkdtemp(prefix="vllm-sizer-baseline-"))
    atexit.register(shutil.rmtree, where, ignore_errors=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(where, filter="data")
    (where / "model").rename(where / package)
    for source in (where / package).rglob("*.py"):
        source.write_text(_IMPORT.sub(rf"\1\2 {package}", source.read_text()))
    sys.path.insert(0, str(where))
    try:
        return importlib.import_module(package)
    finally:
        sys.path.remove(str(where))


def _archive(repo: Path, commit: str) -> bytes:
    """`git archive` of `model/` at `commit`, or BaselineUnavailable saying what to do."""
    try:
        done = subprocess.run(
            ["git", "-C", str(repo), "archive", "--format=tar", commit, "model"],
            capture_output=True, check=False, timeout=60,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BaselineUnavailable(f"cannot run git in {repo}: {exc}") from exc
    if done.returncode == 0:
        return done.stdout
    shallow = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--is-shallow-repository"],
        capture_output=True, text=True, check=False,
    ).stdout.strip()  # fmt: skip
    hint = (
        "this clone is shallow: fetch the history first (`git fetch --unshallow`)"
        if shallow == "true"
        else "the speed benches need a git clone of the repository with its history"
    )
    error = done.stderr.decode(errors="replace").strip()
    raise BaselineUnavailable(
        f"the baseline model (commit {commit}) is not readable: {hint} (git: {error})"
    )
