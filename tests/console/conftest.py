"""The console in a real headless Chromium (Debian's `chromium` driven by Selenium through
`chromium-driver`), against the same `thawpool up` as the CLI tests.

Skipped, naming what is missing, where the browser or its driver is not installed
(`make setup` installs both with apt where it can).
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.cli.stack import Tenant, api_tenant, ok_json, shared_stack


def _missing() -> list[str]:
    missing = [name for name in ("chromium", "chromedriver") if shutil.which(name) is None]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (pip)")
    return missing


@pytest.fixture(scope="session")
def stack(s3_server, tmp_path_factory):
    with shared_stack(s3_server, tmp_path_factory.mktemp("stack")) as stack:
        yield stack


@pytest.fixture(scope="module")
def browser():
    missing = _missing()
    if missing:
        pytest.skip(f"no headless browser: {', '.join(missing)} missing (make browser)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")        # Selenium Manager: never download
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--window-size=1280,1000", "--disable-extensions", "--no-first-run"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=shutil.which("chromedriver")),
                              options=options)
    try:
        yield driver
    finally:
        driver.quit()


@dataclass
class World:
    """A tenant with a deployment that thawed and served a request, and another tenant
    with a deployment of its own (which the first must never see)."""
    viewer: Tenant
    other: Tenant
    deployment: str


@pytest.fixture(scope="session")
def world(stack, tiny_model, tmp_path_factory) -> World:
    """Set up through the API where the CLI tests already cover the command (each CLI
    start costs a second or more of import on a busy machine); once for every module."""
    configs = tmp_path_factory.mktemp("console-configs")
    viewer, other = api_tenant(stack, "viewer", configs), api_tenant(stack, "other", configs)
    # each its own copy: a tenant's uploads are its own (no grant reaches into them)
    pushed = {tenant.name: ok_json(tenant.env, "models", "push", str(tiny_model), "tiny")["model_uri"]
              for tenant in (viewer, other)}
    with httpx.Client(base_url=stack.base_url, timeout=300) as client:
        for tenant, name in ((viewer, "viewer-chat"), (other, "other-dep")):
            made = client.post("/v1/deployments", headers=_auth(tenant), json={
                "name": name, "model_uri": pushed[tenant.name], "scaling": {"idle_timeout_s": 600}})
            assert made.status_code == 201, made.text
        # streamed: the gateway times the first token (the TTFT sparkline's point)
        with client.stream("POST", "/v1/completions", headers=_auth(viewer), json={
                "model": "viewer-chat", "prompt": "Hello", "max_tokens": 5,
                "stream": True}) as done:
            assert done.status_code == 200 and "[DONE]" in done.read().decode()
    return World(viewer, other, "viewer-chat")


def _auth(tenant: Tenant) -> dict:
    return {"authorization": f"Bearer {tenant.key}"}


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory) -> Path:
    """Under the test output; also copied to THAWPOOL_CONSOLE_SCREENSHOTS (docs/console)
    when that is set, to refresh the docs' pictures."""
    return tmp_path_factory.mktemp("screenshots")
