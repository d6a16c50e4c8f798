"""The operator's margin page in headless Chromium, against the shared `thawpool up`
(its cost book's default 0.0004 a GPU-second, from THAWPOOL_GPU_COST_PER_SECOND): the
table is the margin API's, row for row and cell for cell; the viewer's deployment, whose
replica served a call on a CPU slot of the real pool, shows its bill and its cost by the
kind the pool reported; a cost row added in the page reaches the API, a refused one
shows the API's refusal; a tenant has no margin page."""
from __future__ import annotations

import re
from decimal import Decimal

import pytest

from tests.console.browser import api, go, page_error, shoot, sign_in, until, wait_ready
from tests.console.test_console import _between_equal, _wait_for_usage
from tests.console.test_console_edits import REFUSAL, click, fill, shown_error

pytestmark = pytest.mark.timeout(400)
COST = Decimal("0.0004")                        # tests/cli/stack.py's up_env


def _cell(value) -> str:
    return "+".join(value) if isinstance(value, list) else ("-" if value is None else str(value))


def test_the_margin_page_is_the_margin_api(browser, stack, world, screenshots):
    from selenium.webdriver.common.by import By

    with api(stack, stack.admin_key) as admin, api(stack, world.viewer.key) as viewer:
        _wait_for_usage(viewer)
        sign_in(browser, stack.base_url, stack.admin_key)
        assert browser.find_element(By.ID, "nav-margin").is_displayed()
        go(browser, stack.base_url, "/margin", "margin")
        assert not page_error(browser)
        window = {"from": browser.find_element(By.ID, "from").get_attribute("value"),
                  "to": browser.find_element(By.ID, "to").get_attribute("value")}

        def reload() -> dict:
            browser.execute_script("document.body.dataset.ready = ''")
            browser.refresh()
            wait_ready(browser, "margin")
            return browser.execute_script("return thawpoolConsole.data.margin")

        report, drawn = _between_equal(
            lambda: admin.get("/v1/billing/margin", params=window).json(), reload)
        bill = viewer.get("/v1/billing/report", params={**window, "group_by": "deployment"}).json()
    assert drawn == report
    cells = [[td.text for td in tr.find_elements(By.TAG_NAME, "td")]
             for tr in browser.find_elements(By.CSS_SELECTOR, "#margin-table tbody tr")]
    columns = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#margin-table th")]
    assert columns[:5] == ["deployment", "revenue", "GPU cost", "margin", "margin %"]
    keys = ["revenue", "gpu_cost", "margin", "margin_pct", "gpu_seconds", "idle_gpu_seconds",
            "tokens", "cost_per_1k_tokens", "cache_hit_rate", "mean_batch_size", "quantization",
            "sleep_share", "gpu_kinds"]
    assert cells == [[row["key"], *(_cell(row[k]) for k in keys)]
                     for row in [*report["rows"], {**report["totals"], "key": "TOTAL"}]]

    row = next(r for r in report["rows"] if r["key"] == "viewer/viewer-chat")
    billed = next(r for r in bill["rows"] if r["key"] == "viewer-chat")
    assert (row["requests"], row["token_revenue"]) == (billed["requests"], billed["token_cost"])
    assert row["gpu_kinds"] == ["cpu"], "the kind the real pool's slot reported"
    assert row["quantization"] == ["none"]
    assert Decimal(row["gpu_seconds"]) > 0
    assert Decimal(row["gpu_cost"]) == (Decimal(row["gpu_seconds"]) * COST).quantize(Decimal("1e-15"))
    assert Decimal(row["margin"]) == Decimal(row["revenue"]) - Decimal(row["gpu_cost"])
    assert not any(r["tenant"] == "other" and r["deployment"] == "viewer-chat"
                   for r in report["rows"])
    shoot(browser, screenshots, "margin")

    grouping = browser.find_element(By.ID, "group-by")
    grouping.find_element(By.CSS_SELECTOR, "option[value='tenant']").click()
    click(browser, "#range button[type='submit']")
    wait_ready(browser, "margin")
    by_tenant = browser.execute_script("return thawpoolConsole.data.margin")
    assert by_tenant["group_by"] == "tenant" and "viewer" in [r["key"] for r in by_tenant["rows"]]
    assert browser.find_elements(By.CSS_SELECTOR, "#margin-table th")[0].text == "tenant"


def test_a_cost_added_in_the_page_reaches_the_cost_book(browser, stack, world):
    from selenium.webdriver.common.by import By

    later = "2099-01-01T00:00:00+00:00"
    with api(stack, stack.admin_key) as admin:
        sign_in(browser, stack.base_url, stack.admin_key)
        go(browser, stack.base_url, "/margin", "margin")
        fill(browser, "#cost-value", "-1")
        click(browser, "#cost-form button")
        assert re.fullmatch(REFUSAL, shown_error(browser, "cost-error"))
        assert "per_gpu_second" in shown_error(browser, "cost-error")

        fill(browser, "#cost-kind", "cuda")
        fill(browser, "#cost-value", "0.0021")
        fill(browser, "#cost-from", later)
        click(browser, "#cost-form button")
        wait_ready(browser, "margin")
        book = admin.get("/v1/gpu-costs").json()["data"]
        added = [r for r in book if (r["gpu_kind"], r["effective_from"]) == ("cuda", later)]
        assert [r["per_gpu_second"] for r in added] == ["0.002100000"]
        until(lambda: "cuda 0.002100000 " + later in browser.find_element(By.ID, "costs-table").text)
        assert admin.delete(f"/v1/gpu-costs/{added[0]['id']}").status_code == 204


def test_a_tenant_has_no_margin_page(browser, stack, world):
    from selenium.webdriver.common.by import By

    sign_in(browser, stack.base_url, world.viewer.key)
    assert not browser.find_element(By.ID, "nav-margin").is_displayed()
    go(browser, stack.base_url, "/margin", "margin")
    assert page_error(browser).startswith("403"), page_error(browser)
