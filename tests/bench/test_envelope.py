"""The bench result envelope: what it records, and that every bench writes it."""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

from bench.lib.envelope import RUN_KEY, command_line, start_run, with_run
from tests.conftest import REPO_ROOT

# Entry points that write a result JSON: every script at the top of bench/, and the real-vLLM
# steps that write theirs.
BENCH_SCRIPTS = sorted((REPO_ROOT / "bench").glob("*.py")) + [
    REPO_ROOT / "bench" / "real_vllm" / name for name in ("sweep.py", "report.py", "live.py")
]


def test_envelope_records_commit_dates_machine_load_and_command() -> None:
    run = start_run(["bench/model_speed.py", "--quick"])
    out = with_run(run, {"results": [1, 2], RUN_KEY: "stale"})
    assert list(out) == [RUN_KEY, "results"]
    env = out[RUN_KEY]
    assert len(env["commit"]) == 40 and int(env["commit"], 16) >= 0
    assert isinstance(env["dirty"], bool)
    assert env["date"] <= env["finished"] and env["date"].endswith("+00:00")
    assert env["command"] == "python bench/model_speed.py --quick"
    machine = env["machine"]
    assert machine["cores"] == os.cpu_count()
    assert len(machine["load_average_start"]) == len(machine["load_average_end"]) == 3
    json.dumps(out, allow_nan=False)


def test_command_names_no_path_of_this_machine() -> None:
    absolute = str(REPO_ROOT / "bench" / "soak.py")
    assert command_line([absolute, "--minutes", "1"]) == "python bench/soak.py --minutes 1"
    assert command_line(["/elsewhere/x.py"]) == "python x.py"


def _calls(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            names.add(node.func.id)
    return names


def test_every_bench_writes_the_envelope() -> None:
    assert len(BENCH_SCRIPTS) >= 16
    missing = [
        str(p.relative_to(REPO_ROOT))
        for p in BENCH_SCRIPTS
        if not {"start_run", "with_run"} <= _calls(p)
    ]
    assert not missing, f"benches without the run envelope (bench/lib/envelope.py): {missing}"
