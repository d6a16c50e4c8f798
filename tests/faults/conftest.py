"""One platform for the whole fault suite (tests/faults/stack.py): Postgres, S3 and the
control plane as separate processes. Each test breaks what it is about and mends it;
what a failed test left broken is started again before the next one. Each test has a
tenant and a deployment of its own, so bills do not mix."""
from __future__ import annotations

import pytest

from tests.faults.stack import FaultStack


@pytest.fixture(scope="session")
def platform(tmp_path_factory):
    started = FaultStack(tmp_path_factory.mktemp("faults"))
    try:
        yield started.start()
    finally:
        started.close()


@pytest.fixture
def stack(platform):
    yield platform
    platform.mend()


@pytest.fixture(scope="session")
def model_uri(platform, tiny_model) -> str:
    return platform.upload(tiny_model, "tiny")
