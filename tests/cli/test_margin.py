"""`thawpool usage --margin`, run as users run it (the installed command, a config dir of
its own), against a control plane holding the margin report's test history
(tests/controlplane/support/margin_history.py): the table's rows and TOTAL line, the CSV
as the API writes it, --json as the API answers, the admin key taken from
THAWPOOL_ADMIN_KEY, and a tenant's key refused."""
from __future__ import annotations

import asyncio
import json
import re

import pytest
import pytest_asyncio

from tests.cli.stack import cli_env, run_cli
from tests.controlplane.conftest import (db_url, make_settings, model_uri,  # noqa: F401 (fixtures)
                                         models_bucket, running_control_plane)
from tests.controlplane.support.margin_history import SETTINGS, WINDOW, write_history

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(400)]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def plane(db_url, s3_server, tmp_path_factory):  # noqa: F811 (db_url, the fixture)
    settings = make_settings(db_url, s3_server, tmp_path_factory.mktemp("cli-margin"), **SETTINGS)
    async with running_control_plane(settings) as plane:
        yield plane


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def world(plane, model_uri):  # noqa: F811 (model_uri, the fixture)
    return await write_history(plane, model_uri)


@pytest.fixture
def admin_env(plane, tmp_path):
    """No profile: the URL and the admin key from the environment, as an operator keeps them."""
    return cli_env(tmp_path / "config", THAWPOOL_URL=plane.base_url,
                   THAWPOOL_ADMIN_KEY=plane.admin_key)


async def thawpool(env, *argv: str):
    """The CLI in a thread: the control plane answers from this test's event loop."""
    return await asyncio.to_thread(run_cli, env, *argv, "--from", WINDOW["from"],
                                   "--to", WINDOW["to"])


def table_rows(text: str) -> dict[str, dict[str, str]]:
    """A rich table's rows by their first cell, each as {column title: cell}."""
    lines = [[c.strip() for c in re.split("[│┃]", line)[1:-1]] for line in text.splitlines()]
    lines = [cells for cells in lines if cells]
    header = lines[0]
    return {cells[0]: dict(zip(header, cells)) for cells in lines[1:]}


async def test_the_margin_table_has_a_row_per_deployment_and_the_totals(plane, world, admin_env):
    done = await thawpool(admin_env, "usage", "--margin")
    assert done.returncode == 0, done.stderr
    rows = table_rows(done.stdout)
    assert list(rows) == ["margin-a/chat", "margin-a/embed", "margin-b/chat", "TOTAL"]
    chat = rows["margin-a/chat"]
    assert (chat["revenue"], chat["GPU cost"], chat["margin"], chat["margin %"]) == (
        "12.300000000000000", "4.800000000000000", "7.500000000000000", "60.98")
    assert (chat["idle GPU s"], chat["cache hit"], chat["batch"], chat["quant"],
            chat["sleep share"]) == ("3060.000000", "0.400000", "1.222222", "int8", "0.400000")
    total = rows["TOTAL"]
    assert (total["revenue"], total["GPU cost"], total["margin"], total["quant"],
            total["cost/1k tok"]) == ("13.310000000000000", "5.160000000000000",
                                      "8.150000000000000", "int8+none", "1.522123893805310")


async def test_by_tenant_csv_and_json_are_the_apis(plane, world, admin_env):
    params = {**WINDOW, "group_by": "tenant"}
    api_csv = (await plane.admin.get("/v1/billing/margin",
                                     params={**params, "format": "csv"})).text
    done = await thawpool(admin_env, "usage", "--margin", "--group-by", "tenant", "--csv")
    assert done.returncode == 0, done.stderr
    assert done.stdout == api_csv and api_csv.splitlines()[-1].startswith("TOTAL,,,5,")
    done = await thawpool(admin_env, "usage", "--margin", "--group-by", "tenant", "--json")
    assert json.loads(done.stdout) == (await plane.admin.get("/v1/billing/margin",
                                                             params=params)).json()
    table = table_rows((await thawpool(admin_env, "usage", "--margin", "--group-by",
                                       "tenant")).stdout)
    assert list(table) == ["margin-a", "margin-b", "TOTAL"]
    assert table["margin-a"]["margin"] == "7.600000000000000"


async def test_a_tenant_key_is_refused_and_a_wrong_grouping_is_a_usage_error(plane, world,
                                                                             tmp_path):
    env = cli_env(tmp_path / "tenant", THAWPOOL_URL=plane.base_url)
    refused = await thawpool(env, "usage", "--margin", "--key", world["keys"]["margin-a"])
    assert refused.returncode == 1 and "admin key required" in refused.stderr
    assert "12.3" not in refused.stdout + refused.stderr
    wrong = await thawpool(env, "usage", "--margin", "--group-by", "day", "--key", "tp_x")
    assert wrong.returncode == 2 and "deployment, tenant" in wrong.stderr
