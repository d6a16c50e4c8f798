"""Session-wide real services and model folders for every test package.

Postgres (pgserver) and S3 (SeaweedFS) are started lazily, once per test
session, on loopback, and always stopped. Package conftests add what is
theirs (migrations, app clients, runtime processes).
"""
from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory):
    from controlplane.embedded import EmbeddedPostgres

    server = EmbeddedPostgres(tmp_path_factory.mktemp("pg") / "data").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    from controlplane.embedded import EmbeddedS3

    server = EmbeddedS3(tmp_path_factory.mktemp("s3")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(s3_server) -> str:
    """A fresh, empty bucket for one test."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    s3_server.ensure_bucket(name)
    return name


@pytest.fixture(scope="session")
def model_factory(tmp_path_factory):
    """make(arch="llama", **ModelSpec fields) -> Path of a model folder (cached per spec)."""
    from tests.support.model_factory import ModelSpec, make_model

    made: dict[str, Path] = {}

    def make(**fields) -> Path:
        spec = ModelSpec(**fields)
        # keyed by value: rope_scaling is a dict, so the spec itself is unhashable
        key = json.dumps(spec.__dict__, sort_keys=True)
        if key not in made:
            made[key] = make_model(tmp_path_factory.mktemp(f"model-{spec.arch}"), spec)
        return made[key]

    return make


@pytest.fixture(scope="session")
def tiny_model(model_factory) -> Path:
    """The default tiny Llama (GQA 4:2, 2 layers, vocab 512), fp32."""
    return model_factory(arch="llama")


# the session's loopback Ray cluster, one for every folder that needs one
from tests.support.ray_cluster import cluster, ray_cluster  # noqa: E402,F401
