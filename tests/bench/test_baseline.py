"""The speed benches' frozen model comes from git history, imported beside today's under another
name; a clone without that history is told how to get it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.lib.baseline import BaselineUnavailable, load_baseline

OLD = {
    "model/__init__.py": "from model.queueing.speed import SPEED, pace\n",
    "model/queueing/__init__.py": '"""queueing"""\n',
    "model/queueing/speed.py": (
        "import model.queueing\n"
        "SPEED = 'old'\n"
        "def pace() -> str:\n"
        "    from model.queueing import speed\n"
        "    return speed.SPEED\n"
    ),
}


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.strip()


@pytest.fixture()
def history(tmp_path: Path) -> tuple[Path, str]:
    """A repository whose first commit holds an old `model` and whose head has a newer one."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    for name, text in OLD.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "old model")
    old = _git(repo, "rev-parse", "HEAD")
    (repo / "model/queueing/speed.py").write_text("SPEED = 'new'\n")
    _git(repo, "commit", "-q", "-am", "new model")
    return repo, old


def test_the_old_model_is_imported_under_another_name(history: tuple[Path, str]) -> None:
    repo, old = history
    package = "baseline_under_test_a"
    try:
        baseline = load_baseline(old, package, repo)
        # Its own absolute imports, at import and inside a function, reach the old copy.
        assert (baseline.SPEED, baseline.pace()) == ("old", "old")
        assert baseline.queueing.speed.__name__ == f"{package}.queueing.speed"
        assert "model.queueing.speed" not in sys.modules or (
            sys.modules["model.queueing.speed"] is not baseline.queueing.speed
        )
        assert load_baseline(old, package, repo) is baseline
    finally:
        for name in [m for m in sys.modules if m.split(".")[0] == package]:
            del sys.modules[name]


def test_a_shallow_clone_is_told_to_fetch_the_history(
    history: tuple[Path, str], tmp_path: Path
) -> None:
    repo, old = history
    shallow = tmp_path / "shallow"
    subprocess.run(
        ["git", "clone", "-q", "--depth", "1", f"file://{repo}", str(shallow)],
        capture_output=True, check=True,
    )  # fmt: skip
    with pytest.raises(BaselineUnavailable, match="shallow.*git fetch --unshallow"):
        load_baseline(old, "baseline_under_test_b", shallow)
    assert "baseline_under_test_b" not in sys.modules


def test_outside_a_checkout_the_error_says_so(tmp_path: Path) -> None:
    with pytest.raises(BaselineUnavailable, match="clone of the repository with its history"):
        load_baseline("0" * 40, "baseline_under_test_c", tmp_path)
