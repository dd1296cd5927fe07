"""The configuration page's table (docs/reference/configuration.md) lists exactly the keys the
config reader accepts.

The accepted keys come from the reader itself: a config with an unknown key in a section is
refused with that section's allowed keys, so each section the page documents is probed that
way; a key the code accepts but the page omits (a new section included) shows up in its
parent's allowed list."""

from __future__ import annotations

import re
from typing import Any

import pytest

from exporter.base.errors import ConfigError
from exporter.config.loader import parse_config
from tests.test_readme_metrics import CONFIG_PAGE, section, table_rows

PROBE = "zz_not_a_key"


def documented_keys() -> set[str]:
    """Key paths of the table: `a.b.c`, then `.d` for a sibling of `c`; `deployments[]` is a list
    item; `pNN_ms` stands for the percentile keys p50_ms ... p99.9_ms."""
    keys: set[str] = set()
    for row in table_rows(section("# Configuration", CONFIG_PAGE)):
        names = re.findall(r"`([a-zN_.\[\]]+)`", row[0])
        assert names and not names[0].startswith("."), row
        parent = names[0].rpartition(".")[0]
        keys.add(names[0])
        keys.update(f"{parent}{name}" for name in names[1:] if name.startswith("."))
    return keys


def sections_of(keys: set[str]) -> set[str]:
    """Every mapping that holds a documented key ('' is the top level)."""
    out = {""}
    for key in keys:
        parts = key.split(".")
        out.update(".".join(parts[:n]) for n in range(1, len(parts)))
    return out


def base_config() -> dict[str, Any]:
    return {
        "prometheus": {"url": "http://127.0.0.1:9090"},
        "deployments": [
            {
                "name": "d",
                "model_name": "m",
                "source": {"scrape_urls": ["http://127.0.0.1:8000/metrics"]},
            }
        ],
    }


def allowed_keys(section_path: str) -> set[str]:
    """The keys the reader allows in `section_path`, from its refusal of an unknown one."""
    config = base_config()
    node: dict[str, Any] = config
    for part in section_path.split(".") if section_path else []:
        if part == "deployments[]":
            node = config["deployments"][0]
        else:
            node = node.setdefault(part, {})
    node[PROBE] = 1
    with pytest.raises(ConfigError) as refused:
        parse_config(config)
    shown = f"{section_path}.{PROBE}".lstrip(".").replace("deployments[]", "deployments[0]")
    line = next(p for p in refused.value.problems if p.startswith(f"{shown}:"))
    listed = re.search(r"unknown key \(allowed: ([^)]*)\)", line)
    assert listed is not None, line
    return set(listed.group(1).split(", "))


def test_readme_config_table_lists_exactly_the_accepted_keys() -> None:
    documented = documented_keys()
    accepted: set[str] = set()
    for section_path in sections_of(documented):
        prefix = f"{section_path}." if section_path else ""
        accepted.update(f"{prefix}{key}" for key in allowed_keys(section_path))
    sections = {s.removesuffix("[]") for s in sections_of(documented) - {""}}  # a list's key
    undocumented = accepted - documented - sections
    assert undocumented == set(), "the code accepts keys the page's table omits"
    assert documented - accepted == set(), "the page's table lists keys the code refuses"


def test_the_probe_sees_a_missing_row() -> None:
    """The check would catch a dropped row: remove one and the key shows as undocumented."""
    documented = documented_keys() - {"deployments[].look_ahead_s"}
    accepted = {f"deployments[].{k}" for k in allowed_keys("deployments[]")}
    assert "deployments[].look_ahead_s" in accepted - documented
