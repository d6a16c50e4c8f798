"""Driving the console in the browser tests: sign in, open a page and wait until it says
it is drawn, read its error, save a screenshot, count a chart's coloured pixels."""
from __future__ import annotations

import os
import shutil
import time

import httpx

BLUE = (43, 125, 233)        # PALETTE[0] in charts.js: the first series' stroke
# Pixels of one colour in a chart's canvas (axes and grid are grey: a series drew these).
COLOURED = """
const [el, r, g, b] = arguments;
const canvas = el.querySelector("canvas");
const px = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
let n = 0;
for (let i = 0; i < px.length; i += 4)
  if (Math.abs(px[i] - r) < 8 && Math.abs(px[i + 1] - g) < 8 && Math.abs(px[i + 2] - b) < 8 && px[i + 3] > 200) n++;
return n;
"""


def wait_ready(driver, ready: str, timeout_s: float = 60) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, timeout_s).until(
        lambda d: d.execute_script("return document.body.dataset.ready") == ready,
        f"the page never said ready={ready}")


def page_error(driver) -> str:
    return driver.execute_script("const e = document.getElementById('page-error'); "
                                 "return e ? e.textContent : ''")


def sign_in(driver, base_url: str, key: str) -> None:
    from selenium.webdriver.common.by import By

    driver.get(f"{base_url}/ui/")
    driver.execute_script("sessionStorage.clear(); location.hash = '';")
    driver.get(f"{base_url}/ui/")
    wait_ready(driver, "sign-in")
    driver.find_element(By.ID, "key").send_keys(key)
    driver.find_element(By.ID, "sign-in-button").click()
    wait_ready(driver, "deployments")


def go(driver, base_url: str, hash_: str, ready: str) -> None:
    """Opens a page by its route and waits until it is drawn (errors are the caller's to read)."""
    driver.get(f"{base_url}/ui/#{hash_}")
    wait_ready(driver, ready)


def shoot(driver, screenshots, name: str) -> None:
    path = screenshots / f"{name}.png"
    driver.save_screenshot(str(path))
    assert path.stat().st_size > 10_000, "a blank page"
    docs = os.environ.get("THAWPOOL_CONSOLE_SCREENSHOTS")
    if docs:
        shutil.copy(path, os.path.join(docs, path.name))


def coloured(driver, element_id: str) -> int:
    from selenium.webdriver.common.by import By

    return driver.execute_script(COLOURED, driver.find_element(By.ID, element_id), *BLUE)


def api(stack, key: str) -> httpx.Client:
    return httpx.Client(base_url=stack.base_url, headers={"authorization": f"Bearer {key}"},
                        timeout=30)


def until(check, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.1)
