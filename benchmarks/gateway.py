"""Gateway overhead: a 1-token completion through the control plane vs straight to its replica.

    .venv/bin/python benchmarks/gateway.py [--pairs 1000] [--warmup 50]

Starts the fault suite's platform (tests/faults/stack.py: its own Postgres, SeaweedFS
S3 and `thawpool up` as separate processes, with the pool's default timings) over a
tiny random model, deploys it for one tenant, thaws it with one call, and reads the
serving replica's address and secret from the pool's process registry. Then --pairs
pairs of the same non-streaming 1-token /v1/completions (greedy, same prompt): one
through the gateway (API key, deployment -> revision, pool lease, usage metering) and
one straight to the replica (with its secret), interleaved, the order alternating from
pair to pair, one call at a time on kept-alive connections, so that both paths see the
same machine. The peer is the direct call, measured in the same run.

Printed: p50/p90/p99 of each path; the added latency: the percentiles of each pair's
difference (gateway minus direct, the two calls of one pair), not the difference of the
two paths' percentiles, which pairs no call with its peer; the ratio of the p50s; and
the issue-20 target (added p50 at most 1 ms, p99 at most 3 ms, both per pair). The rate
limit is raised for the tenant's key (the default of 600 requests a minute would refuse
the run); nothing else is tuned. The report is also
written to benchmarks/results/gateway.txt.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TENANT = "gatewaybench"
PROMPT = "Serverless GPU pools scale to zero"
TARGET_P50_MS, TARGET_P99_MS = 1.0, 3.0
# `thawpool up` as it runs by default, apart from the rate limit: the fault suite's
# stack speeds its pool loop up and shrinks its usage buffer, here set back.
PLANE_ENV = {"THAWPOOL_TICK_S": "0.5", "THAWPOOL_DESIRED_REFRESH_S": "5", "THAWPOOL_HEARTBEAT_S": "15",
             "THAWPOOL_USAGE_BUFFER_MAX": "10000", "THAWPOOL_DB_STATEMENT_TIMEOUT_S": "15",
             "THAWPOOL_DB_CONNECT_TIMEOUT_S": "5", "THAWPOOL_DB_POOL_TIMEOUT_S": "5",
             "THAWPOOL_REQUESTS_PER_MIN": "1000000"}


@dataclass(frozen=True)
class Summary:
    """Milliseconds."""
    direct: dict[str, float]          # p50, p90, p99
    gateway: dict[str, float]
    paired: dict[str, float]          # of gateway - direct within each pair

    @property
    def added_p50(self) -> float:
        return self.paired["p50"]

    @property
    def added_p99(self) -> float:
        return self.paired["p99"]

    @property
    def target_met(self) -> bool:
        return self.added_p50 <= TARGET_P50_MS and self.added_p99 <= TARGET_P99_MS


def percentiles(seconds: Sequence[float]) -> dict[str, float]:
    cuts = statistics.quantiles([s * 1000 for s in seconds], n=100, method="inclusive")
    return {"p50": cuts[49], "p90": cuts[89], "p99": cuts[98]}


def summarize(gateway: Sequence[float], direct: Sequence[float]) -> Summary:
    """gateway[i] and direct[i]: the two calls of pair i, in seconds."""
    return Summary(percentiles(direct), percentiles(gateway),
                   percentiles([g - d for g, d in zip(gateway, direct)]))


def report(summary: Summary, pairs: int, warmup: int) -> str:
    def row(name: str, p: dict[str, float]) -> str:
        return f"  {name:<25s} p50 {p['p50']:7.2f} ms   p90 {p['p90']:7.2f} ms   p99 {p['p99']:7.2f} ms"

    met = "met" if summary.target_met else "NOT met"
    return "\n".join([
        f"1-token /v1/completions, {pairs} pairs interleaved (after {warmup} warm-up pairs), one call at a time:",
        row("direct to the replica", summary.direct),
        row("through the gateway", summary.gateway),
        row("gateway - direct, paired", summary.paired),
        f"added latency (per pair): p50 {summary.added_p50:+.2f} ms, p99 {summary.added_p99:+.2f} ms; "
        f"gateway / direct at p50: {summary.gateway['p50'] / summary.direct['p50']:.2f}x",
        f"target (issue 20): added p50 <= {TARGET_P50_MS:g} ms and p99 <= {TARGET_P99_MS:g} ms: {met}",
    ])


def caller(client: httpx.Client, url: str, body: dict[str, Any]) -> Callable[[], float]:
    """A function making one call and returning its seconds; any answer but a 1-token 200 raises."""
    def call() -> float:
        started = time.perf_counter()
        response = client.post(url, json=body)
        elapsed = time.perf_counter() - started
        if response.status_code != 200 or response.json()["usage"]["completion_tokens"] != 1:
            raise RuntimeError(f"{url}: {response.status_code} {response.text[:300]}")
        return elapsed
    return call


def interleave(gateway: Callable[[], float], direct: Callable[[], float],
               pairs: int) -> tuple[list[float], list[float]]:
    """pairs of calls, the gateway first in even pairs and the replica first in odd ones."""
    through, straight = [], []
    for i in range(pairs):
        if i % 2 == 0:
            through.append(gateway())
            straight.append(direct())
        else:
            straight.append(direct())
            through.append(gateway())
    return through, straight


def serving_replica(state_dir: Path) -> tuple[str, str]:
    """(base URL, secret) of the one replica the local backend has registered as serving."""
    from pool.backends.local_state import ProcessEntry

    entries = [ProcessEntry.from_json(json.loads(p.read_text())) for p in state_dir.glob("*.json")]
    serving = [e.replica for e in entries if e.replica is not None]
    if len(serving) != 1:
        raise RuntimeError(f"expected one serving replica in {state_dir}, found {len(serving)}")
    return serving[0].base_url, serving[0].secret


@contextlib.contextmanager
def direct_client(base_url: str, secret: str) -> Iterator[tuple[httpx.Client, str]]:
    """A client to the replica and the base URL to call it at: over its unix socket
    (a sandboxed replica's, wire/replica_address.py) when it has one, as the gateway's hop is."""
    from wire.replica_address import address_of

    socket = address_of(base_url).socket
    transport = httpx.HTTPTransport(uds=socket) if socket else None
    with httpx.Client(headers={"authorization": f"Bearer {secret}"}, timeout=120, transport=transport) as client:
        yield client, ("http://replica" if socket else base_url)


def measure(root: Path, pairs: int, warmup: int) -> Summary:
    from tests.faults.stack import FaultStack
    from tests.support.model_factory import ModelSpec, make_model

    stack = FaultStack(root / "stack", env=PLANE_ENV)
    try:
        stack.start()
        key = stack.tenant_key(TENANT)
        stack.deploy(key, TENANT, stack.upload(make_model(root / "model", ModelSpec()), TENANT))
        body = {"prompt": PROMPT, "max_tokens": 1, "temperature": 0}
        with httpx.Client(headers={"authorization": f"Bearer {key}"}, timeout=120) as plane:
            through = caller(plane, f"{stack.base_url}/v1/completions", {"model": TENANT, **body})
            through()                                               # the thaw
            assert stack.plane is not None
            base_url, secret = serving_replica(stack.plane.state_dir)
            with direct_client(base_url, secret) as (replica, url):
                straight = caller(replica, f"{url}/v1/completions", body)
                interleave(through, straight, warmup)
                gateway, direct = interleave(through, straight, pairs)
        return summarize(gateway, direct)
    except Exception:
        print(f"--- the control plane's log, its end:\n{stack.plane.tail() if stack.plane else ''}", file=sys.stderr)
        raise
    finally:
        stack.close()


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=50)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="thawpool-gateway-") as root:
        summary = measure(Path(root), args.pairs, args.warmup)
    print(report(summary, args.pairs, args.warmup))


if __name__ == "__main__":
    from benchmarks.results import recorded  # type: ignore[attr-defined]  # mypy: the folder results/

    with recorded(__file__):
        main()
