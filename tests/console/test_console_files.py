"""controlplane.console.ConsoleFiles without a browser: what /ui serves and what it never does."""
from __future__ import annotations

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from controlplane.console import ConsoleFiles


def client() -> TestClient:
    app = Starlette(routes=[Route("/v1/x", lambda request: PlainTextResponse("api"))],
                    middleware=[Middleware(ConsoleFiles)])
    return TestClient(app, follow_redirects=False)


def test_the_page_and_its_files_are_served_with_a_strict_policy():
    with client() as http:
        assert http.get("/ui").headers["location"] == "/ui/"
        page = http.get("/ui/")
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        assert "default-src 'self'" in page.headers["content-security-policy"]
        assert "connect-src 'self'" in page.headers["content-security-policy"]
        for script in ("/ui/app.js", "/ui/charts.js", "/ui/vendor/uplot-1.6.32/uPlot.iife.min.js"):
            assert script.rsplit("/", 1)[1] in page.text
            served = http.get(script)
            assert served.status_code == 200 and "javascript" in served.headers["content-type"]
        assert "MIT License" in http.get("/ui/vendor/uplot-1.6.32/LICENSE").text


def test_nothing_outside_the_folder_and_nothing_but_reads():
    with client() as http:
        assert http.get("/ui/../console.py").status_code == 404
        assert http.get("/ui/%2e%2e/console.py").status_code == 404
        assert http.get("/ui/nope.js").status_code == 404
        assert http.post("/ui/app.js").status_code == 404
        assert http.get("/v1/x").text == "api", "other paths pass through"
        assert http.get("/uix").status_code == 404 and http.get("/uix").text != "not found"
