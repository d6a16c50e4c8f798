"""The console's webhooks page in headless Chromium, each step checked through the API: a
tenant adds an endpoint (its secret shown once, then never again), sends a test event
and sees its delivery, never sees another tenant's endpoint, disables and deletes its own."""
from __future__ import annotations

import pytest

from tests.console.browser import api, go, shoot, sign_in, wait_ready
from tests.console.test_console_edits import click, fill

pytestmark = pytest.mark.timeout(400)


def tenant_key(stack, name: str) -> str:
    with api(stack, stack.admin_key) as admin:
        made = admin.post("/v1/tenants", json={"name": name})
        assert made.status_code in (201, 409), made.text
        key = admin.post(f"/v1/tenants/{name}/keys", json={"scopes": ["deploy"]})
        assert key.status_code == 201, key.text
        return key.json()["key"]


def test_a_tenant_manages_its_webhooks_in_the_console(browser, stack, screenshots):
    key, other_key = tenant_key(stack, "hooked"), tenant_key(stack, "unhooked")
    with api(stack, other_key) as other:
        theirs = other.post("/v1/webhooks", json={"url": "https://other.example.com/theirs",
                                                  "event_types": ["*"]}).json()
    sign_in(browser, stack.base_url, key)
    go(browser, stack.base_url, "/webhooks", "webhooks")
    fill(browser, "#webhook-url", "https://hooks.example.com/console")
    click(browser, "#webhook-form button[type=submit]")
    wait_ready(browser, "webhooks")
    secret = browser.find_element("css selector", "#new-webhook-secret").text.split()[0]
    assert secret.startswith("whsec_")
    with api(stack, key) as tenant:
        [made] = tenant.get("/v1/webhooks").json()["data"]
    assert made["url"] == "https://hooks.example.com/console"
    assert made["event_types"] == ["budget.threshold"]
    assert browser.execute_script("return thawpoolConsole.data.webhooks") == [made["id"]]
    assert theirs["id"] not in browser.page_source and "other.example.com" not in browser.page_source

    go(browser, stack.base_url, "/keys", "keys")          # away and back: the secret is gone
    go(browser, stack.base_url, "/webhooks", "webhooks")
    assert secret not in browser.page_source

    click(browser, f"button[data-test='{made['id']}']")
    wait_ready(browser, "webhooks")
    [shown] = browser.execute_script("return thawpoolConsole.data.deliveries")
    with api(stack, key) as tenant:
        [delivery] = tenant.get(f"/v1/webhooks/{made['id']}/deliveries").json()["data"]
    assert shown["id"] == delivery["id"] and delivery["event_type"] == "webhook.test"
    assert "webhook.test" in browser.find_element("css selector", "#deliveries-table").text
    shoot(browser, screenshots, "webhooks")

    click(browser, f"button[data-toggle-webhook='{made['id']}']")
    wait_ready(browser, "webhooks")
    with api(stack, key) as tenant:
        assert tenant.get(f"/v1/webhooks/{made['id']}").json()["enabled"] is False
    assert browser.find_element("css selector",
                                f"button[data-toggle-webhook='{made['id']}']").text == "Enable"

    click(browser, f"button[data-delete-webhook='{made['id']}']")
    wait_ready(browser, "webhooks")
    assert browser.execute_script("return thawpoolConsole.data.webhooks") == []
    with api(stack, key) as tenant:
        assert tenant.get(f"/v1/webhooks/{made['id']}").status_code == 404
    with api(stack, other_key) as other:
        assert other.get(f"/v1/webhooks/{theirs['id']}").status_code == 200
