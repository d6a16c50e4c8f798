"""Read a replica's /metrics into {sample name with labels: value}."""
from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families


def scrape(base_url: str) -> dict[str, float]:
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return samples


def families(base_url: str) -> set[str]:
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    return {f.name for f in text_string_to_metric_families(text)}
