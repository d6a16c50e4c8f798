"""The budgets page in headless Chromium, each change checked through the API: a tenant
sets a budget on its deployment (the API then holds it, with its period and threshold),
a bad limit shows the API's refusal naming the field, the operator's tenant budget is
shown but not deletable by the tenant, and a deleted budget is gone from the API."""
from __future__ import annotations

import re
from decimal import Decimal

import pytest

from tests.console.browser import api, go, page_error, shoot, sign_in, wait_ready
from tests.console.test_console_edits import REFUSAL, click, fill, shown_error

pytestmark = pytest.mark.timeout(400)


def test_a_tenant_sets_and_deletes_a_budget_on_its_deployment(browser, stack, world, screenshots):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    with api(stack, world.viewer.key) as viewer, api(stack, stack.admin_key) as admin:
        operator = admin.put("/v1/budgets", json={"scope": "tenant", "tenant": "viewer", "limit": "1000"})
        assert operator.status_code in (200, 201), operator.text
        sign_in(browser, stack.base_url, world.viewer.key)
        go(browser, stack.base_url, "/budgets", "budgets")
        assert not page_error(browser)
        assert browser.find_elements(By.CSS_SELECTOR, f"button[data-delete-budget='{operator.json()['id']}']") == []

        Select(browser.find_element(By.ID, "budget-scope")).select_by_value("deployment")
        fill(browser, "#budget-target", world.deployment)
        fill(browser, "#budget-limit", "lots")
        click(browser, "#budget-save")
        error = shown_error(browser, "budget-error")
        assert re.fullmatch(REFUSAL, error) and "limit" in error

        fill(browser, "#budget-limit", "12.5")
        Select(browser.find_element(By.ID, "budget-period")).select_by_value("day")
        fill(browser, "#budget-time_zone", "Europe/Berlin")
        fill(browser, "#budget-soft_fraction", "0.8")
        click(browser, "#budget-save")
        wait_ready(browser, "budgets")
        held = [b for b in viewer.get("/v1/budgets").json()["data"] if b["scope"] == "deployment"]
        assert len(held) == 1
        made = held[0]
        assert (Decimal(made["limit"]), made["period"], made["time_zone"], Decimal(made["soft_fraction"])) == (
            Decimal("12.5"), "day", "Europe/Berlin", Decimal("0.8"))
        drawn = browser.execute_script("return thawpoolConsole.data.budgets")
        assert {b["id"] for b in drawn} == {made["id"], operator.json()["id"]}
        assert made["scope_name"] == world.deployment
        assert world.deployment in browser.find_element(By.ID, "budgets-table").text
        shoot(browser, screenshots, "budgets")

        click(browser, f"button[data-delete-budget='{made['id']}']")
        wait_ready(browser, "budgets")
        assert viewer.get(f"/v1/budgets/{made['id']}").status_code == 404
        assert admin.delete(f"/v1/budgets/{operator.json()['id']}").status_code == 204
