"""Seconds per stage of loading a model; torch-free, so the engine imports it before torch."""
from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class LoadTimings:
    stages: dict[str, float] = field(default_factory=dict)

    def record(self, stage: str, since: float) -> float:
        """Add the time since `since` to `stage`; returns now, the start of the next stage."""
        now = time.perf_counter()
        self.stages[stage] = round(self.stages.get(stage, 0.0) + now - since, 6)
        return now
