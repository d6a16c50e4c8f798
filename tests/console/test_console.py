"""The console in headless Chromium: sign in, the deployments it lists are the API's, the
deployment page draws its thaw and sparklines, the usage charts' numbers are the report
API's, the admin page makes a key shown once. A screenshot of each page is saved."""
from __future__ import annotations

import httpx
import pytest

from tests.console.browser import api, coloured, go, page_error, shoot, sign_in, until, wait_ready

pytestmark = pytest.mark.timeout(400)


def test_a_wrong_key_is_refused_and_the_key_lives_in_session_storage(browser, stack, world):
    from selenium.webdriver.common.by import By

    browser.get(f"{stack.base_url}/ui/")
    browser.execute_script("sessionStorage.clear()")
    browser.get(f"{stack.base_url}/ui/")
    wait_ready(browser, "sign-in")
    browser.find_element(By.ID, "key").send_keys("tp_not_a_key")
    browser.execute_script("document.body.dataset.ready = ''")
    browser.find_element(By.ID, "sign-in-button").click()
    wait_ready(browser, "sign-in")
    assert "401" in browser.find_element(By.ID, "sign-in-error").text
    sign_in(browser, stack.base_url, world.viewer.key)
    assert browser.execute_script("return sessionStorage.getItem('thawpool.key')") == world.viewer.key
    assert browser.execute_script("return localStorage.length") == 0 and not browser.get_cookies()
    assert not browser.find_element(By.ID, "nav-admin").is_displayed()


def test_the_deployments_page_lists_what_the_api_lists(browser, stack, world, screenshots):
    from selenium.webdriver.common.by import By

    sign_in(browser, stack.base_url, world.viewer.key)
    with api(stack, world.viewer.key) as client:
        listed = [d["name"] for d in client.get("/v1/deployments").json()["data"]]
    rows = browser.find_elements(By.CSS_SELECTOR, "#deployments-table tbody tr")
    assert [r.get_attribute("data-name") for r in rows] == listed == ["viewer-chat"]
    assert "other-dep" not in browser.page_source, "another tenant's deployment showed"
    assert rows[0].find_element(By.CLASS_NAME, "state").text in ("ready", "scaled_to_zero",
                                                                  "starting", "draining")
    shoot(browser, screenshots, "deployments")


def test_the_deployment_page_draws_the_thaw_and_the_sparklines(browser, stack, world, screenshots):
    from selenium.webdriver.common.by import By

    sign_in(browser, stack.base_url, world.viewer.key)
    go(browser, stack.base_url, "/deployments/viewer-chat", "deployments/viewer-chat")
    assert not page_error(browser)
    revisions = browser.find_element(By.ID, "revisions-table").text
    assert "r1" in revisions and "100%" in revisions
    thaws = browser.execute_script("return thawpoolConsole.data.deployment.activity.thaws")
    stages = thaws[0]["stages"] if len(thaws) == 1 else {}
    assert stages["download"] > 0 and stages["load"] > 0 and stages["download_load"] is None
    drawn = [s.get_attribute("data-stage") for s in
             browser.find_elements(By.CSS_SELECTOR, "#waterfall .bar .seg")]
    assert drawn == ["queue", "placement", "download", "load", "first_token"]
    for chart in ("spark-requests", "spark-ttft", "spark-tokens"):
        assert coloured(browser, chart) > 0, f"{chart} drew no series"
    shoot(browser, screenshots, "deployment")
    go(browser, stack.base_url, "/deployments/other-dep", "deployments/other-dep")
    # another tenant's deployment by name: not found, like the API
    assert page_error(browser).startswith("404")


def test_the_usage_charts_equal_the_report_api(browser, stack, world, screenshots):
    """The GPU seconds (and so the cost) of a replica still up grow with each heartbeat, so
    the page is compared with the report only when the report did not move while the page
    read it: two equal reports around the page's load bound what the page can have seen."""
    from selenium.webdriver.common.by import By

    with api(stack, world.viewer.key) as client:
        _wait_for_usage(client)
        sign_in(browser, stack.base_url, world.viewer.key)
        go(browser, stack.base_url, "/usage", "usage")
        assert not page_error(browser)
        start = browser.find_element(By.ID, "from").get_attribute("value")
        end = browser.find_element(By.ID, "to").get_attribute("value")
        range_ = {"from": start, "to": end, "group_by": "day"}

        def reload() -> dict:
            browser.execute_script("document.body.dataset.ready = ''")
            browser.refresh()
            wait_ready(browser, "usage")
            return browser.execute_script("return thawpoolConsole.data.usage")

        def download() -> str:
            browser.execute_script("thawpoolConsole.data.csv = null")
            browser.find_element(By.ID, "csv").click()
            until(lambda: browser.execute_script("return thawpoolConsole.data.csv"))
            return browser.execute_script("return thawpoolConsole.data.csv")

        report, drawn = _between_equal(lambda: _bill(client.get("/v1/billing/report", params=range_).json()),
                                       reload)
        csv, downloaded = _between_equal(
            lambda: client.get("/v1/billing/report", params={**range_, "format": "csv"}).text, download)
    assert report["rows"], "no usage to draw"
    for row in report["rows"]:
        day = drawn["days"].index(row["key"])
        assert sum(t[day] for t in drawn["tokens"].values()) == \
            row["prompt_tokens"] + row["completion_tokens"]
        assert sum(c[day] for c in drawn["cost"].values()) == pytest.approx(float(row["cost"]))
        assert drawn["gpu_seconds"][day] == pytest.approx(float(row["gpu_seconds"]))
    table = browser.find_element(By.ID, "report-table").text
    assert f"TOTAL {report['totals']['requests']}" in table
    assert "items function_gpu_seconds" in table, "function calls' columns, as in the CSV"
    for chart in ("chart-tokens", "chart-cost", "chart-gpu"):
        assert coloured(browser, chart) > 0, f"{chart} drew no series"
    shoot(browser, screenshots, "usage")
    assert downloaded == csv


def _bill(report: dict) -> dict:
    return {"rows": report["rows"], "totals": report["totals"]}


def _between_equal(read, act, attempts: int = 10):
    """(what `read` gave both before and after `act`, what `act` gave); a bill that moved
    while `act` ran is read again (at most `attempts` times: a live replica's heartbeat
    moves it every few seconds, not continuously)."""
    for _ in range(attempts):
        before = read()
        result = act()
        if read() == before:
            return before, result
    raise AssertionError(f"the bill moved during each of {attempts} reads")


def test_the_admin_page_lists_tenants_and_shows_a_new_key_once(browser, stack, world, screenshots):
    from selenium.webdriver.common.by import By

    sign_in(browser, stack.base_url, stack.admin_key)
    assert browser.find_element(By.ID, "nav-admin").is_displayed()
    go(browser, stack.base_url, "/admin", "admin")
    assert not page_error(browser)
    with api(stack, stack.admin_key) as client:
        tenants = sorted(t["name"] for t in client.get("/v1/tenants").json()["data"])
        assert sorted(browser.execute_script("return thawpoolConsole.data.admin.tenants")) == tenants
        browser.find_element(By.CSS_SELECTOR, "button[data-tenant='viewer']").click()
        wait_ready(browser, "admin/viewer")
        keys = client.get("/v1/tenants/viewer/keys").json()["data"]
        rows = browser.find_elements(By.CSS_SELECTOR, "#keys-table tbody tr")
        assert len(rows) == len(keys)
        browser.find_element(By.CSS_SELECTOR, "#key-form button").click()
        until(lambda: browser.find_element(By.ID, "new-key").is_displayed())
        secret = browser.find_element(By.ID, "new-key").text.split()[0]
        assert len(client.get("/v1/tenants/viewer/keys").json()["data"]) == len(keys) + 1
    with api(stack, secret) as made:
        assert [d["name"] for d in made.get("/v1/deployments").json()["data"]] == ["viewer-chat"]
    shoot(browser, screenshots, "admin")


def _wait_for_usage(client: httpx.Client) -> None:
    """The usage writer batches: the world's request is in the report once written."""
    until(lambda: client.get("/v1/billing/report").json()["totals"]["requests"] >= 1)


def test_the_header_says_whether_tenants_code_runs_in_the_sandbox(browser, stack, world):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    mode = httpx.get(f"{stack.base_url}/readyz", timeout=10).json()["sandbox"]
    sign_in(browser, stack.base_url, world.viewer.key)
    badge = browser.find_element(By.ID, "sandbox")
    WebDriverWait(browser, 10).until(lambda _: badge.text)
    assert badge.text == ("sandbox OFF: tenants' code runs unconfined" if mode == "off" else f"sandbox: {mode}")
    assert mode == "bwrap" and "off" not in badge.get_attribute("class"), "this stack runs the sandbox"
