"""What the console changes, in headless Chromium, each change checked through the API: an
operator's quota override (the API then refuses past it) and a deployment's price (the
tenant then reads it), a tenant revoking one of its keys (the API then answers 401), and
a tenant's session that holds no operator control. The API's refusals are shown on the
page with their status and request id."""
from __future__ import annotations

import re
from decimal import Decimal

import pytest

from tests.console.browser import api, go, page_error, shoot, sign_in, until, wait_ready

pytestmark = pytest.mark.timeout(400)
REFUSAL = r"4\d\d: .+ \(request id \S+\)"        # how app.js shows an API error


def fill(driver, selector: str, value: str) -> None:
    from selenium.webdriver.common.by import By

    field = driver.find_element(By.CSS_SELECTOR, selector)
    field.clear()
    field.send_keys(value)


def click(driver, selector: str) -> None:
    """Clicks after clearing body[data-ready], so a wait_ready after it waits for the redraw."""
    from selenium.webdriver.common.by import By

    driver.execute_script("document.body.dataset.ready = ''")
    driver.find_element(By.CSS_SELECTOR, selector).click()


def shown_error(driver, element_id: str) -> str:
    from selenium.webdriver.common.by import By

    until(lambda: driver.find_element(By.ID, element_id).text)
    return driver.find_element(By.ID, element_id).text


def open_tenant(driver, stack, tenant: str) -> None:
    sign_in(driver, stack.base_url, stack.admin_key)
    go(driver, stack.base_url, "/admin", "admin")
    click(driver, f"button[data-tenant='{tenant}']")
    wait_ready(driver, f"admin/{tenant}")


def test_an_operator_edits_a_quota_and_the_api_enforces_it(browser, stack, world, screenshots):
    limit = "#quota-form input[data-limit='max_deployments']"
    with api(stack, world.viewer.key) as viewer, api(stack, stack.admin_key) as admin:
        model_uri = viewer.get("/v1/deployments/viewer-chat").json()["revisions"][0]["model_uri"]
        open_tenant(browser, stack, "viewer")
        fill(browser, limit, "-1")
        click(browser, "#quota-save")
        assert re.fullmatch(REFUSAL, shown_error(browser, "quota-error"))
        assert "max_deployments" in shown_error(browser, "quota-error")

        fill(browser, limit, "1")
        click(browser, "#quota-save")
        wait_ready(browser, "admin/viewer")
        assert viewer.get("/v1/quota").json()["limits"]["max_deployments"] == 1
        refused = viewer.post("/v1/deployments", json={"name": "viewer-second",
                                                       "model_uri": model_uri})
        assert refused.status_code == 422 and refused.json()["error"]["code"] == "quota_exceeded"
        assert "max_deployments 1" in browser.find_element("id", "quota-table").text.splitlines()
        shoot(browser, screenshots, "admin-quota")

        fill(browser, limit, "")                       # blank: back to the default
        click(browser, "#quota-save")
        wait_ready(browser, "admin/viewer")
        assert admin.get("/v1/tenants/viewer/quota").json()["overrides"].get(
            "max_deployments") is None
        assert viewer.get("/v1/quota").json()["limits"]["max_deployments"] != 1


def test_an_operator_grants_egress_in_the_quota_form(browser, stack, world):
    egress = "#quota-form input[data-limit='egress']"
    with api(stack, stack.admin_key) as admin:
        open_tenant(browser, stack, "viewer")
        fill(browser, egress, "api.example.com:443, 10.0.0.5:8080")
        click(browser, "#quota-save")
        wait_ready(browser, "admin/viewer")
        assert admin.get("/v1/tenants/viewer/quota").json()["limits"]["egress"] == [
            "10.0.0.5:8080", "api.example.com:443"]
        fill(browser, egress, "not a host")
        click(browser, "#quota-save")
        assert "egress" in shown_error(browser, "quota-error")
        fill(browser, egress, "")                      # blank: back to none
        click(browser, "#quota-save")
        wait_ready(browser, "admin/viewer")
        assert admin.get("/v1/tenants/viewer/quota").json()["limits"]["egress"] is None


def test_an_operator_sets_a_deployment_price_and_the_tenant_reads_it(browser, stack, world,
                                                                    screenshots):
    sign_in(browser, stack.base_url, stack.admin_key)
    go(browser, stack.base_url, "/admin", "admin")
    for field, value in (("tenant", "viewer"), ("deployment", "no-such-deployment"),
                         ("input_per_mtok", "7"), ("output_per_mtok", "8.5")):
        fill(browser, f"#price-{field}", value)
    click(browser, "#price-form button")
    error = shown_error(browser, "price-error")
    assert re.fullmatch(REFUSAL, error) and error.startswith("404")

    fill(browser, "#price-deployment", "viewer-chat")
    click(browser, "#price-form button")
    wait_ready(browser, "admin")
    assert not page_error(browser)
    rows = browser.find_element("id", "prices-table").text.splitlines()
    assert any(r.startswith("viewer viewer-chat ") and " 7.000000000 8.500000000 " in r + " "
               for r in rows), rows
    browser.execute_script("document.getElementById('price-form').scrollIntoView()")
    shoot(browser, screenshots, "admin-prices")
    with api(stack, world.viewer.key) as viewer:
        mine = viewer.get("/v1/billing/prices").json()["deployments"]
    (chat,) = [d for d in mine if d["name"] == "viewer-chat"]
    assert chat["scope"] == "deployment"
    assert Decimal(chat["prices"]["input_per_mtok"]) == 7
    assert Decimal(chat["prices"]["output_per_mtok"]) == Decimal("8.5")


def test_a_tenant_revokes_its_own_key_and_the_api_refuses_it(browser, stack, world, screenshots):
    with api(stack, stack.admin_key) as admin:
        doomed = admin.post("/v1/tenants/viewer/keys",
                            json={"scopes": ["invoke"], "name": "doomed"}).json()
    with api(stack, doomed["key"]) as client:
        assert client.get("/v1/models").status_code == 200
    sign_in(browser, stack.base_url, world.viewer.key)
    go(browser, stack.base_url, "/keys", "keys")
    with api(stack, world.viewer.key) as viewer:
        listed = [k["prefix"] for k in viewer.get("/v1/keys").json()["data"]]
    assert browser.execute_script("return thawpoolConsole.data.keys") == listed
    assert doomed["prefix"] in listed and doomed["key"] not in browser.page_source
    signed_in = "_".join(world.viewer.key.split("_")[:2])      # tp_<8 hex>: its prefix
    assert "(this session's key)" in browser.find_element(
        "css selector", f"#keys-table tr:has(button[data-revoke='{signed_in}'])").text

    click(browser, f"button[data-revoke='{doomed['prefix']}']")
    wait_ready(browser, "keys")
    assert not browser.find_elements("css selector", f"button[data-revoke='{doomed['prefix']}']")
    shoot(browser, screenshots, "keys")
    with api(stack, doomed["key"]) as client:
        assert client.get("/v1/models").status_code == 401
    with api(stack, world.viewer.key) as viewer:
        assert viewer.get("/v1/models").status_code == 200, "only that key was revoked"


def test_a_tenant_session_holds_no_operator_control(browser, stack, world):
    sign_in(browser, stack.base_url, world.viewer.key)
    assert not browser.find_element("id", "nav-admin").is_displayed()
    go(browser, stack.base_url, "/admin", "admin")
    assert page_error(browser).startswith("403")
    for form in ("tenant-form", "key-form", "quota-form", "price-form"):
        assert not browser.find_elements("id", form), f"a tenant's page shows {form}"
