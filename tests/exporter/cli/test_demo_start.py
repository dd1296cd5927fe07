"""The demo prepares the model before its emulated clock starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.cli import demo
from exporter.cli.main import build_parser


class _Compiled(Exception):
    pass


def test_the_kernel_is_compiled_before_the_fleet_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A first run compiles for seconds to a minute; inside the first cycle that stalled the
    # daemon while the fleet's time ran on, and the bunched windows it then read asked for 8
    # replicas. So the compile comes first, before any fleet (and its clock) is made.
    events: list[str] = []

    def compile_kernel() -> None:
        events.append("compile")
        raise _Compiled

    def fleet(*args: object, **kwargs: object) -> None:
        events.append("fleet")
        raise AssertionError("the fleet was made before the kernel was compiled")

    monkeypatch.setattr(demo, "compile_model_kernel", compile_kernel, raising=False)
    monkeypatch.setattr(demo, "EmulatedFleet", fleet)
    parser, _ = build_parser()
    args = parser.parse_args(["demo", "--out", str(tmp_path / "out")])
    with pytest.raises(_Compiled):
        args.func(args)
    assert events == ["compile"]
