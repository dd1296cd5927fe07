"""The fleet plan live on loopback: two emulated variants of one model with different parameters
(an H100-like and a slower L40S-like engine, one model's traffic routed over both by the mixed
emulator's load-aware gateway), a real Prometheus server scraping their pods, an
inventory exporter and the daemon itself, the daemon in central mode reading the pods and the
L40S inventory through Prometheus, and the test playing KEDA (each variant's Deployment follows
its exported count).

Checked, in real time:
- each variant's exported `vllm_sizer_desired_replicas` equals what `vllm-sizer plan` answers
  for the rate and capacities the daemon exported, on the inventory it read;
- the inventory comes from the query: the exported GPUs available follow the exporter, and when
  it answers none the model moves to the H100 variant;
- the dashboard's fleet panels return series from Prometheus.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import yaml
from prometheus_client import CollectorRegistry, start_http_server

from exporter.base.clock import SystemClock
from exporter.cli.main import main
from exporter.collector.demand import DemandSource
from exporter.collector.promapi import PrometheusClient
from exporter.collector.sources import PrometheusSource
from exporter.config.loader import parse_config
from exporter.daemon.daemon import Daemon
from exporter.testbed.mixed_emulator import MixedEmulatedFleet
from model import ServerConfig, ServiceParams
from model.simulation.mixed import FleetRouting, VariantSpec
from model.simulation.workloads import LengthDist, LengthKind
from tests.ecosystem.dashboard import panel_queries
from tests.fixtures.metrics_server import MetricsServer
from tests.integration.prometheus_server import JOB, PrometheusServer, StartPrometheus, Target

pytestmark = pytest.mark.integration

FAST = ServiceParams(6.68, 2.01e-2, 5.52e-5)  # paper Table I, H100
SLOW = ServiceParams(16.0, 5.5e-2, 2.1e-4)  # about an L40S
VARIANTS = {"on-h100": ("H100", FAST, 1), "on-l40s": ("L40S", SLOW, 2)}
RATE_RPS = 5.0
PERIOD_S = 2.0
SCRAPE_S = 0.25
INVENTORY = 'sum(gpus_free{accelerator="L40S"})'


def config_data(prom_url: str) -> dict[str, Any]:
    variants = [
        {
            "name": name, "accelerator": kind, "initial_params": params.to_dict(),
            "replicas": {"min": 0, "max": 8}, "scale_down_stabilization_s": 0,
            "tuner": {"min_observations": 3, "window": 5},
            "source": {"prometheus_selector": f'{{job="{JOB}", variant="{name}"}}'},
        }
        for name, (kind, params, _) in VARIANTS.items()
    ]  # fmt: skip
    return {
        "cycle_period_s": PERIOD_S,
        "prometheus": {"url": prom_url, "timeout_s": 2.0},
        "accelerators": {
            "H100": {"price_per_gpu_hour": 4.0, "inventory": 8},
            "L40S": {"price_per_gpu_hour": 0.1, "inventory": {"query": INVENTORY}},
        },
        "models": [{"name": "llama", "slo": {"ttft_ms": 80, "itl_ms": 25},
                    "variants": variants}],
    }  # fmt: skip


@dataclass
class Stack:
    fleet: MixedEmulatedFleet
    prom: PrometheusServer
    daemon_target: str
    inventory_target: str
    work: Path
    registry: CollectorRegistry
    gpus_free: list[float] = field(default_factory=lambda: [3.0])
    scraped: dict[str, list[str]] = field(default_factory=dict)

    def targets(self) -> list[Target]:
        return [*pods(self.fleet), Target(self.daemon_target), Target(self.inventory_target)]

    def apply(self, desired: dict[str, int]) -> None:
        """KEDA's part: each variant's Deployment to its count; Prometheus follows the pods."""
        for name, count in desired.items():
            if count != len(self.fleet.urls_by_variant().get(name, [])):
                self.fleet.set_variant_replicas(name, count)
        urls = self.fleet.urls_by_variant()
        if urls != self.scraped:
            self.scraped = urls
            self.prom.set_targets(self.targets())

    def query(self, expr: str) -> list[dict[str, Any]]:
        reply = requests.post(f"{self.prom.base_url}/api/v1/query", data={"query": expr},
                              timeout=5)  # fmt: skip
        return list(reply.json()["data"]["result"])


def pods(fleet: MixedEmulatedFleet) -> list[Target]:
    return [Target(u, {"variant": n}) for n, urls in fleet.urls_by_variant().items() for u in urls]


@pytest.fixture
def stack(start_prometheus: StartPrometheus, tmp_path: Path) -> Iterator[Stack]:
    fleet = MixedEmulatedFleet(
        [VariantSpec(name=name, params=params, server=ServerConfig(),
                     kv_capacity_tokens=400_000, startup_delay_s=0.0)
         for name, (_, params, _) in VARIANTS.items()],
        replicas={name: count for name, (_, _, count) in VARIANTS.items()},
        routing=FleetRouting.LEAST_LOADED, rng=np.random.default_rng(3), arrivals=RATE_RPS,
        input_lengths=LengthDist(LengthKind.UNIFORM, 512),
        output_lengths=LengthDist(LengthKind.UNIFORM, 128), model_name="llama",
    )  # fmt: skip
    gpus_free = [3.0]

    def inventory_body() -> str:
        return (
            "# HELP gpus_free GPUs this fleet may use.\n# TYPE gpus_free gauge\n"
            f'gpus_free{{accelerator="L40S"}} {gpus_free[0]}\n'
        )

    registry = CollectorRegistry()
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    with fleet, MetricsServer(inventory_body) as inventory:
        daemon_target = f"http://127.0.0.1:{server.server_port}/metrics"
        prom = start_prometheus([*pods(fleet), Target(daemon_target), Target(inventory.url)],
                                scrape_interval_s=SCRAPE_S)  # fmt: skip
        try:
            yield Stack(fleet, prom, daemon_target, inventory.url, tmp_path, registry,
                        gpus_free, fleet.urls_by_variant())  # fmt: skip
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)


def daemon(stack: Stack) -> Daemon:
    config = parse_config(config_data(stack.prom.base_url))
    client = PrometheusClient(stack.prom.base_url, timeout_s=2.0)
    clock = SystemClock()
    sources = {
        name: PrometheusSource(client=client, clock=clock, model_name="llama",
                               selector=f'job="{JOB}", variant="{name}"', pod_label="instance")
        for name in VARIANTS
    }  # fmt: skip
    inventory = DemandSource(client=client, query=INVENTORY, what="inventory")
    return Daemon(config, sources, stack.registry, clock, inventory={"L40S": inventory})


def exported(stack: Stack, name: str, **labels: str) -> float | None:
    return stack.registry.get_sample_value("vllm_sizer_" + name, labels)


def cycle(stack: Stack, sizer: Daemon) -> dict[str, int]:
    time.sleep(PERIOD_S)
    sizer.run_cycle()
    desired = {}
    for name in VARIANTS:
        value = exported(stack, "desired_replicas", deployment=name, model_name="llama")
        assert value is not None, name
        desired[name] = int(value)
    stack.apply(desired)
    return desired


def plan_cli(stack: Stack, capsys: pytest.CaptureFixture[str]) -> dict[str, int]:
    """`vllm-sizer plan` on the daemon's configuration, with the rate, capacities and
    inventory the daemon exported."""
    path = stack.work / "fleet.yaml"
    path.write_text(yaml.safe_dump(config_data(stack.prom.base_url)))
    demand = exported(stack, "fleet_demand_requests_per_second", model_name="llama")
    l40s = exported(stack, "fleet_gpus_available", accelerator="L40S")
    assert demand is not None and l40s is not None
    args = ["plan", "--config", str(path), "--fleet-model", "llama", "--rate", repr(demand),
            "--inventory", f"L40S={l40s:g}"]
    for name in VARIANTS:
        value = exported(stack, "variant_capacity_requests_per_second", deployment=name,
                         model_name="llama")
        args += ["--capacity", f"{name}={value!r}"]
    capsys.readouterr()
    assert main(args) == 0
    counts = {}
    for line in capsys.readouterr().out.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) == 3 and parts[0] in VARIANTS:
            counts[parts[0]] = int(parts[1])
    return counts


def settled(stack: Stack, sizer: Daemon, capsys: pytest.CaptureFixture[str],
            cycles: int, l40s_gpus: float) -> tuple[dict[str, int], dict[str, int]]:
    """Cycle until a cycle plans the model with nothing held (its pods ready: no replacement
    waits), on the L40S inventory `l40s_gpus`, and the counts did not change from the cycle
    before (at most `cycles`): (exported counts, plan's counts)."""
    last: dict[str, int] = {}
    for _ in range(cycles):
        desired = cycle(stack, sizer)
        status = None if sizer.fleet is None else sizer.fleet.last
        plan = None if status is None else status.plan
        gpus = exported(stack, "fleet_gpus_available", accelerator="L40S")
        if (desired == last and plan is not None and dict(plan.desired) == dict(plan.target)
                and gpus == l40s_gpus):
            break
        last = desired
    else:
        pytest.fail(f"no settled plan in {cycles} cycles: {last}")
    return last, plan_cli(stack, capsys)


def test_exported_counts_equal_plans_and_the_inventory_is_read(
    stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    sizer = daemon(stack)
    try:
        for _ in range(4):  # windows to observe, the first plans
            cycle(stack, sizer)
        exported_counts, planned = settled(stack, sizer, capsys, 10, 3.0)
        assert exported_counts == planned
        # About 5 req/s arrive; an L40S replica carries about 3.4 within the targets (2.5 while
        # untrusted), an H100 one about 32 at 40 times the price: two or three L40S replicas.
        assert exported_counts["on-h100"] == 0 and 2 <= exported_counts["on-l40s"] <= 3
        # The dashboard's fleet panels read these series back from Prometheus.
        values = {"$deployment": "on-h100", "$__rate_interval": "1m"}
        fleet_queries = [q for q in panel_queries(values=values)
                         if "fleet_" in q.expr or "variant_" in q.expr or "inventory_" in q.expr]
        empty = [q.expr for q in fleet_queries if not stack.query(q.expr)]
        # Both variants have pods from the start: no prior was transferred, so no error.
        assert empty == ['max(vllm_sizer_variant_transfer_capacity_error_ratio'
                         '{deployment="on-h100"})']
        # The inventory query answers no L40S GPU now: the model moves to the H100s (no GPU
        # is left to keep the L40S replicas while the H100 one starts).
        stack.gpus_free[0] = 0.0
        exported_counts, planned = settled(stack, sizer, capsys, 15, 0.0)
        assert exported_counts == planned == {"on-h100": 1, "on-l40s": 0}
    finally:
        sizer.close()
