"""The GPUs each accelerator type has this cycle: a static count, or a PromQL query of one value
read each cycle. A failed read keeps the last value read, is logged once per run of failures
(and its recovery) and counted; a type never read yet is unknown (the plan then keeps what runs
on it: exporter/sizing/fleet_cycle.py)."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter

from exporter.base.errors import FailureReason, SourceError
from exporter.collector.demand import DemandSource
from exporter.config.values import FleetConfig
from exporter.daemon.metric_names import PREFIX

logger = logging.getLogger(__name__)


class InventoryReader:
    """Reads every accelerator type's inventory once per cycle."""

    def __init__(
        self,
        fleet: FleetConfig | None,
        queries: Mapping[str, DemandSource],
        registry: CollectorRegistry,
    ) -> None:
        """`queries`: a source per type whose inventory is a query (by type name)."""
        self.errors = Counter(
            PREFIX + "inventory_read_errors",
            "Failed reads of an accelerator type's inventory query, by reason; the plan keeps "
            "the last inventory read.",
            ["accelerator", "reason"],
            registry=registry,
        )
        self._static: dict[str, int] = {}
        self._queries = dict(queries)
        self._last: dict[str, int] = {}
        self._failing: set[str] = set()
        for a in () if fleet is None else fleet.accelerators:
            name = a.name.value
            if a.inventory is not None:
                self._static[name] = a.inventory
            elif name not in self._queries:
                raise ValueError(f"`queries` must have a source for accelerator {name}")
            else:
                for reason in FailureReason:
                    self.errors.labels(name, reason)

    def read(self) -> dict[str, int]:
        """GPUs per type: static ones, the queries' values (the last on a failure); a type
        whose query never answered is left out (unknown)."""
        for name, source in self._queries.items():
            try:
                value = source.read().value
            except SourceError as exc:
                self._failed(name, exc)
                continue
            if name in self._failing:
                logger.info("accelerator %s: inventory query answers again", name)
                self._failing.discard(name)
            self._last[name] = math.floor(value)  # a fractional GPU is not one to place
        return {**self._static, **self._last}

    def _failed(self, name: str, exc: SourceError) -> None:
        self.errors.labels(name, exc.reason).inc()
        if name not in self._failing:
            kept = self._last.get(name)
            held = "unknown (never read)" if kept is None else f"{kept} GPUs"
            logger.warning(
                "accelerator %s: inventory query failed (%s), keeping the last inventory, %s "
                "(logged once): %s", name, exc.reason, held, exc,
            )  # fmt: skip
        self._failing.add(name)
