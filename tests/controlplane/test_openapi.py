"""/openapi.json: generated from the route table, valid OpenAPI, and every operation fuzzed
with schemathesis against a running control plane (real Postgres, real S3): no answer is
a 5xx, every 4xx has the documented error shape.

The fuzz run is bounded: THAWPOOL_FUZZ_EXAMPLES examples per operation and mode (default
8) and THAWPOOL_FUZZ_SECONDS in all (default 120); raise both for a longer run on demand,
e.g. `THAWPOOL_FUZZ_EXAMPLES=300 THAWPOOL_FUZZ_SECONDS=1800 pytest tests/controlplane/test_openapi.py`.
The default run draws the same examples every time (a stable `make test`);
THAWPOOL_FUZZ_RANDOM=1 draws new ones.
"""
from __future__ import annotations

import asyncio
import os
import time

import jsonschema
import pytest
import pytest_asyncio
from openapi_spec_validator import validate
from starlette.routing import Route

from controlplane.routes.openapi_document import ERROR, document
from pool.api import QueueFull
from tests.controlplane.conftest import make_settings, running_control_plane
from tests.controlplane.support.routes import every_route

in_session_loop = pytest.mark.asyncio(loop_scope="session")
EXAMPLES = int(os.environ.get("THAWPOOL_FUZZ_EXAMPLES", "8"))
BUDGET_S = float(os.environ.get("THAWPOOL_FUZZ_SECONDS", "120"))
RANDOM = os.environ.get("THAWPOOL_FUZZ_RANDOM") == "1"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def plane(db_url, s3_server, tmp_path_factory):
    settings = make_settings(db_url, s3_server, tmp_path_factory.mktemp("cp-openapi"))
    async with running_control_plane(settings) as plane:
        plane.app.state.pool.refuse_with = QueueFull("no replicas in the fuzz run")
        yield plane


@in_session_loop
async def test_the_document_is_valid_openapi_and_covers_every_route(plane):
    response = await plane.client().get("/openapi.json")
    assert response.status_code == 200
    doc = response.json()
    validate(doc)
    documented = {(method.upper(), path) for path, ops in doc["paths"].items() for method in ops}
    assert documented == set(every_route(plane.app.routes))
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            assert op["responses"]["4XX"]["content"]["application/json"]["schema"] == \
                {"$ref": "#/components/schemas/Error"}, (method, path)
            assert ("security" in op) == (path not in ("/healthz", "/readyz", "/openapi.json"))


def test_an_undocumented_route_cannot_be_served():
    async def endpoint(request):
        raise AssertionError

    with pytest.raises(TypeError, match="/v1/secret"):
        document([Route("/v1/secret", endpoint)])


@in_session_loop
async def test_fuzzing_every_operation_finds_no_5xx_and_only_the_error_shape(plane):
    doc = (await plane.client().get("/openapi.json")).json()
    tenant_key = await plane.tenant_key("fuzzed")
    problems = await asyncio.to_thread(fuzz, doc, plane.base_url,
                                       {"admin": plane.admin_key, "tenant": tenant_key})
    assert not problems, "\n".join(problems[:20])


def fuzz(doc: dict, base_url: str, keys: dict[str, str]) -> list[str]:
    """Passes over every operation, in order: positive then negative examples as the admin
    (every route: the admin's are its own, the tenants' as the operator's tenant), then as
    a tenant on the tenant routes. The time budget may end the later passes, never the
    first (that fails the test instead: every operation is fuzzed)."""
    import requests
    import schemathesis
    from schemathesis import GenerationMode

    schema = schemathesis.openapi.from_dict(doc)
    # the key is ours to send: negative cases break the body, path and query, not the auth
    # (a missing or wrong key is the isolation matrix's subject)
    schema.config.generation.update(with_security_parameters=False)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == sum(len(ops) for ops in doc["paths"].values())
    passes = [(GenerationMode.POSITIVE, "admin"), (GenerationMode.NEGATIVE, "admin"),
              (GenerationMode.POSITIVE, "tenant"), (GenerationMode.NEGATIVE, "tenant")]
    deadline = time.monotonic() + BUDGET_S
    problems: list[str] = []
    with requests.Session() as session:
        for number, (mode, who) in enumerate(passes):
            for operation in operations:
                if who == "tenant" and _admin_only(operation):
                    continue
                if time.monotonic() > deadline:
                    assert number > 0, "the time budget ended the first pass: raise it"
                    return problems
                problems += run_operation(operation, mode, base_url, keys[who], session, who)
    return problems


def _admin_only(operation) -> bool:
    return str(operation.definition.raw.get("description", "")).startswith("An admin key")


def run_operation(operation, mode, base_url: str, key: str, session, who: str) -> list[str]:
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis.errors import Unsatisfiable

    found: list[str] = []

    @settings(max_examples=EXAMPLES, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck), derandomize=not RANDOM)
    @given(case=operation.as_strategy(generation_mode=mode))
    def one(case) -> None:
        response = case.call(base_url=base_url, session=session, timeout=30,
                             headers={"Authorization": f"Bearer {key}"})
        problem = judge(response)
        if problem:
            found.append(f"{case.method} {case.formatted_path} ({mode.value}, {who}): {problem}; "
                         f"body={str(case.body)[:200]!r} query={case.query!r}")

    try:
        one()
    except Unsatisfiable:           # negative mode, and nothing in the operation to break
        pass
    return found


def judge(response) -> str | None:
    if response.status_code >= 500:
        return f"{response.status_code}: {response.text[:300]}"
    if 400 <= response.status_code < 500:
        try:
            jsonschema.validate(response.json(), ERROR)
        except (ValueError, jsonschema.ValidationError) as exc:
            return f"{response.status_code} not in the error shape ({type(exc).__name__}): " \
                   f"{response.text[:200]}"
    return None


def test_no_route_is_shadowed_by_an_earlier_one():
    """controlplane.app puts the invocation routes first for speed: that is free only while
    no earlier pattern matches a later route's path for the same method."""
    from controlplane.app import ROUTES

    assert [r.path for r in ROUTES[:3]] == ["/v1/completions", "/v1/chat/completions", "/v1/embeddings"]
    for i, later in enumerate(ROUTES):
        for earlier in ROUTES[:i]:
            shared = set(earlier.methods or ()) & set(later.methods or ())
            assert not (shared and earlier.path_regex.match(later.path)), (earlier.path, later.path)
