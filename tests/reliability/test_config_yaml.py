"""The config file's YAML: an alias bomb, a deep or huge file is refused before any object is
built; 8e9 and 8.03e9 are numbers; a duplicated key is an error naming its path."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from exporter.base.errors import ConfigError
from exporter.config.checks import MAX_CONFIG_BYTES, UnusableConfigError, read_yaml
from exporter.config.loader import load_config

REPO = Path(__file__).resolve().parents[2]

VALID = """\
listen_address: "127.0.0.1:9464"
deployments:
  - name: llama
    model_name: llama-3
    source: {scrape_urls: ["http://127.0.0.1:8000/metrics"]}
    slo: {ttft_ms: 500, itl_ms: 50}
"""


def billion_laughs(levels: int = 9) -> str:
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for k in range(1, levels + 1):
        lines.append(f"l{k}: &l{k} [" + ", ".join([f"*l{k - 1}"] * 10) + "]")
    lines.append(f"deployments: *l{levels}")  # 10**9 strings once expanded
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_at_startup_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(billion_laughs())
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "exporter.cli.main", "run", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert time.monotonic() - began < 30
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("vllm-sizer: "), done.stderr[:500]
    assert "aliases are expanded" in lines[0]


def test_a_few_aliases_are_fine(tmp_path: Path) -> None:
    path = tmp_path / "anchors.yaml"
    path.write_text(
        "slo: &slo {ttft_ms: 500, itl_ms: 50}\n"
        "deployments:\n"
        "  - {name: a, model_name: m, source: {scrape_urls: ['http://h:1/']}, slo: *slo}\n"
        "  - {name: b, model_name: m, source: {scrape_urls: ['http://h:1/']}, slo: *slo}\n"
    )
    data = read_yaml(path)
    assert data["deployments"][1]["slo"] == {"ttft_ms": 500, "itl_ms": 50}


@pytest.mark.parametrize(
    "text",
    [
        "a: " + "[" * 20_000 + "]" * 20_000 + "\n",  # PyYAML's composer recursed into a traceback
        "a: &a [1, *a]\n",  # an alias inside its own anchor: a recursive structure
    ],
    ids=["deep", "recursive"],
)
def test_deep_or_recursive_documents_are_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text(text)
    with pytest.raises(UnusableConfigError) as info:
        load_config(path)
    assert "\n" not in str(info.value) and str(info.value).startswith(str(path))


def test_a_file_over_the_size_cap_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text(VALID + "#" * MAX_CONFIG_BYTES + "\n")
    with pytest.raises(UnusableConfigError, match=r"big.yaml: larger than 1 MiB"):
        load_config(path)


def test_floats_without_a_dot_or_exponent_sign_are_numbers(tmp_path: Path) -> None:
    path = tmp_path / "numbers.yaml"
    path.write_text(
        "a: 8.03e9\nb: 8e9\nc: 1.5E3\nd: -2e-3\ne: 1.0e+9\n"
        "s1: abc\ns2: 1.2.3\ns3: '8e9'\ns4: e9\ns5: 1e\ni: 10\n"
    )
    data = read_yaml(path)
    assert data == {
        "a": 8.03e9,
        "b": 8e9,
        "c": 1500.0,
        "d": -0.002,
        "e": 1e9,
        "s1": "abc",
        "s2": "1.2.3",
        "s3": "8e9",
        "s4": "e9",
        "s5": "1e",
        "i": 10,
    }
    assert all(isinstance(data[k], float) for k in "abcde")


def test_the_example_config_loads_with_its_commented_architecture(tmp_path: Path) -> None:
    text = (REPO / "config" / "example.yaml").read_text()
    commented = (
        "      # architecture: {num_layers: 32, hidden_size: 4096, num_parameters: 8.03e9,\n"
        "      #                num_kv_heads: 8, head_dim: 128, kv_cache_bytes: 2}\n"
        "    # accelerator: H100"
    )
    assert commented in text
    path = tmp_path / "example.yaml"
    uncommented = (
        "      architecture: {num_layers: 32, hidden_size: 4096, num_parameters: 8.03e9,\n"
        "                     num_kv_heads: 8, head_dim: 128, kv_cache_bytes: 2}\n"
        "    accelerator: H100"
    )
    path.write_text(text.replace(commented, uncommented))
    dep = load_config(path, resolve_hosts=False).deployments[0]
    architecture = dep.model.architecture
    assert architecture is not None and architecture.num_parameters == 8.03e9
    assert architecture.kv_bytes_per_token == 131_072 and dep.accelerator == "H100"


@pytest.mark.parametrize("name", ["example.yaml", "sidecar.yaml"])
def test_the_shipped_configs_load(name: str) -> None:
    assert load_config(REPO / "config" / name, resolve_hosts=False).deployments


def test_duplicate_keys_are_refused_with_their_path(tmp_path: Path) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text(
        VALID.replace("slo: {ttft_ms: 500, itl_ms: 50}", "slo: {ttft_ms: 500, ttft_ms: 5}")
        + "listen_address: '127.0.0.1:9465'\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config(path, resolve_hosts=False)
    assert info.value.problems == [
        "deployments[0].slo.ttft_ms: duplicate key (line 6); each key may appear once",
        "listen_address: duplicate key (line 7); each key may appear once",
    ]
