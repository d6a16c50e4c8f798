"""Reads a model's config.json from S3 at deploy time (aiobotocore client from the lifespan)."""
from __future__ import annotations

import json

from controlplane.deployment_spec import check_architecture, check_heads, split_s3_uri
from controlplane.errors import invalid


class ModelChecker:
    def __init__(self, s3_client):
        self.s3 = s3_client

    async def architecture(self, model_uri: str, gpu_count: int = 1) -> str:
        """The model's architecture; 422 if it is not one we run, or if gpu_count GPUs
        cannot split its heads."""
        bucket, prefix = split_s3_uri(model_uri)
        try:
            response = await self.s3.get_object(Bucket=bucket, Key=f"{prefix}config.json")
            async with response["Body"] as stream:
                raw = await stream.read()
        except Exception as exc:  # noqa: BLE001 - any S3 failure means the model is unusable
            code = getattr(exc, "response", {}).get("Error", {}).get("Code", type(exc).__name__)
            raise invalid("model_uri", f"cannot read {model_uri}config.json ({code})") from None
        try:
            config = json.loads(raw)
        except ValueError:
            raise invalid("model_uri", "config.json is not valid JSON") from None
        architecture = check_architecture(config)
        check_heads(config, gpu_count)
        return architecture
