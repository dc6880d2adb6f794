"""Report mode: per-region figures of a real run (calls, memory saved, recompute cost).

The first time a region (keyed by its name) runs, its price is measured with ``pricing``'s own
helpers on the real inputs: activation bytes kept without and with checkpoint, recompute FLOPs
and the verdict. Every call and recompute after that is only counted and timed, so the run pays
the measuring cost once per region.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ckptguard import pricing

MIB = 1024 * 1024


@dataclass
class RegionStats:
    name: str
    calls: int = 0
    recomputes: int = 0
    recompute_seconds: float = 0.0
    price: pricing.RegionPrice | None = None
    price_error: str | None = None

    @property
    def negligible(self) -> bool:
        """The runtime twin of lint rule CKP101: checkpointing this region saves ~nothing."""
        return self.price is not None and not self.price.worth_it

    def to_dict(self) -> dict[str, Any]:
        price = self.price
        return {
            "name": self.name,
            "calls": self.calls,
            "recomputes": self.recomputes,
            "recompute_seconds": self.recompute_seconds,
            "bytes_saved_per_call": price.bytes_saved if price else None,
            "bytes_without_checkpoint": price.bytes_without_checkpoint if price else None,
            "bytes_with_checkpoint": price.bytes_with_checkpoint if price else None,
            "recompute_flops_per_call": price.recompute_flops if price else None,
            "recompute_flops_total": price.recompute_flops * self.recomputes if price else None,
            "mib_saved_per_recompute_gflop": price.mib_saved_per_gflop if price else None,
            "verdict": price.verdict if price else None,
            "reason": price.reason if price else self.price_error,
            "negligible": self.negligible,
        }


@dataclass
class Collector:
    regions: dict[str, RegionStats] = field(default_factory=dict)
    measuring: bool = False  # while pricing runs the region again, the guard stands aside

    def on_forward(self, name: str, fn: Any, args: tuple, kwargs: dict) -> RegionStats:
        stats = self.regions.get(name)
        if stats is None:
            stats = self.regions[name] = RegionStats(name)
        stats.calls += 1
        if stats.price is None and stats.price_error is None:
            self.measuring = True
            try:
                stats.price = pricing.price_call(fn, args, kwargs, name=name)
            except Exception as error:  # an unpriceable region must not stop training
                stats.price_error = f"not priced: {type(error).__name__}: {error}"
            finally:
                self.measuring = False
        return stats

    @staticmethod
    def timed_recompute(stats: RegionStats, fn: Any, args: tuple, kwargs: dict) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            stats.recomputes += 1
            stats.recompute_seconds += time.perf_counter() - start

    def data(self) -> list[dict[str, Any]]:
        """JSON-serialisable figures, one dict per region, in first-seen order."""
        return [stats.to_dict() for stats in self.regions.values()]

    def table(self) -> str:
        header = (
            f"{'region':<40} {'calls':>6} {'recomp':>6} {'saved/call':>10} "
            f"{'re-GFLOP':>9} {'re-ms':>8} {'MiB/GFLOP':>9}  verdict"
        )
        rows = ["ckptguard report: checkpointed regions of this run", header, "-" * len(header)]
        for stats in self.regions.values():
            row = stats.to_dict()
            price = stats.price
            saved = pricing.format_bytes(price.bytes_saved) if price else "-"
            gflop = f"{row['recompute_flops_total'] / 1e9:.3f}" if price else "-"
            ratio = row["mib_saved_per_recompute_gflop"]
            ratio_text = "-" if ratio is None else f"{ratio:.2f}"
            verdict = row["reason"] if price is None else f"{price.verdict} ({price.reason})"
            if stats.negligible:
                verdict = "NEGLIGIBLE SAVING (like CKP101): " + verdict
            rows.append(
                f"{_short(stats.name):<40} {stats.calls:>6} {stats.recomputes:>6} {saved:>10} "
                f"{gflop:>9} {stats.recompute_seconds * 1e3:>8.2f} {ratio_text:>9}  {verdict}"
            )
        return "\n".join(rows)


def _short(name: str) -> str:
    """Region names carry an absolute path; keep the qualified name and the file's basename."""
    if " (" in name:
        qualname, location = name.split(" (", 1)
        name = f"{qualname} ({location.rsplit('/', 1)[-1]}"
    return name if len(name) <= 40 else name[:37] + "..."
