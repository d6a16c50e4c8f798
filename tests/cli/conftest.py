"""One `thawpool up` for the CLI tests (shared with tests/console), with a tenant logged in
through the CLI itself."""
from __future__ import annotations

import pytest

from tests.cli.stack import Tenant, new_tenant, shared_stack


@pytest.fixture(scope="session")
def stack(s3_server, tmp_path_factory):
    with shared_stack(s3_server, tmp_path_factory.mktemp("stack")) as stack:
        yield stack


@pytest.fixture(scope="session")
def tenant(stack, tmp_path_factory) -> Tenant:
    return new_tenant(stack, "acme", tmp_path_factory.mktemp("configs"))
