"""The console's Adapters page in headless Chromium: a tenant sees its own adapters (pushed
with `thawpool adapters push`, real PEFT adapters of the tiny llama) as the API lists
them, never another tenant's, and deletes one (the API then answers 404)."""
from __future__ import annotations

import httpx
import pytest

from tests.cli.stack import ok_json
from tests.console.browser import api, go, page_error, shoot, sign_in, wait_ready
from tests.console.test_console_edits import click
from tests.support.peft_adapters import make_adapter

pytestmark = pytest.mark.timeout(400)


def base_with_slots(client: httpx.Client, name: str, like: str) -> None:
    """`name`: the model of the tenant's deployment `like`, with two adapter slots."""
    model_uri = client.get(f"/v1/deployments/{like}").json()["revisions"][0]["model_uri"]
    made = client.post("/v1/deployments", json={"name": name, "model_uri": model_uri,
                                                "engine": {"max_loras": 2}})
    assert made.status_code == 201, made.text


def test_the_adapters_page_lists_the_tenants_own_and_deletes_one(browser, stack, world, tiny_model,
                                                                 tmp_path_factory, screenshots):
    tmp = tmp_path_factory.mktemp("console-adapters")
    with api(stack, world.viewer.key) as viewer, api(stack, world.other.key) as other:
        base_with_slots(viewer, "viewer-lora", "viewer-chat")
        base_with_slots(other, "other-lora", "other-dep")
    pushes = ((world.viewer, "viewer-lora", "support"), (world.viewer, "viewer-lora", "legal"),
              (world.other, "other-lora", "theirs"))
    for seed, (tenant, base, name) in enumerate(pushes):
        folder = make_adapter(tiny_model, tmp / name, 4, ["q_proj", "v_proj"], seed=seed)
        ok_json(tenant.env, "adapters", "push", str(folder), "--base", base)

    sign_in(browser, stack.base_url, world.viewer.key)
    go(browser, stack.base_url, "/adapters", "adapters")
    assert not page_error(browser)
    with api(stack, world.viewer.key) as viewer:
        listed = viewer.get("/v1/adapters").json()["data"]
    assert browser.execute_script("return thawpoolConsole.data.adapters") == \
        [a["name"] for a in listed] == ["legal", "support"]
    rows = browser.find_element("id", "adapters-table").text.splitlines()
    assert any(r.startswith("support viewer-lora viewer-lora:support 4 0.0") for r in rows), rows
    assert "theirs" not in browser.page_source and "other-lora" not in browser.page_source
    shoot(browser, screenshots, "adapters")

    click(browser, "button[data-delete='support']")
    wait_ready(browser, "adapters")
    assert browser.execute_script("return thawpoolConsole.data.adapters") == ["legal"]
    with api(stack, world.viewer.key) as viewer, api(stack, world.other.key) as other:
        assert viewer.get("/v1/adapters/support").status_code == 404
        assert [a["name"] for a in other.get("/v1/adapters").json()["data"]] == ["theirs"]
