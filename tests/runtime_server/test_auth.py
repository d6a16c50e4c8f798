"""A replica with a secret answers only callers that send it (all but /health); one
started on its own without a secret is open, like `vllm serve`, and says so."""
from __future__ import annotations

import httpx

from tests.runtime_server.conftest import STANDBY_SECRET

PATHS = [("GET", "/v1/models"), ("GET", "/metrics"), ("POST", "/v1/completions"),
         ("POST", "/v1/chat/completions"), ("POST", "/admin/load"), ("POST", "/sleep"), ("POST", "/wake"),
         ("GET", "/no/such/path")]


def test_a_replica_with_a_secret_refuses_every_call_without_it_but_health(standby):
    with httpx.Client(base_url=standby.base_url, timeout=30) as c:
        for header in (None, "Bearer wrong", f"Bearer {STANDBY_SECRET}x", STANDBY_SECRET,
                       f"Basic {STANDBY_SECRET}"):
            headers = {"Authorization": header} if header else {}
            for method, path in PATHS:
                refused = c.request(method, path, headers={**headers, "X-Request-Id": "auth-1"},
                                    json={"model": "/etc", "prompt": "hi"})
                assert refused.status_code == 401, (method, path, header, refused.text)
                assert refused.json()["error"]["type"] == "authentication_error"
                assert refused.headers["www-authenticate"] == "Bearer"
                assert refused.headers["x-request-id"] == "auth-1"
        assert c.get("/health").status_code in (200, 503)        # open: the pool's probes
        right = {"Authorization": f"Bearer {STANDBY_SECRET}"}
        assert c.get("/v1/models", headers=right).status_code == 200
        assert c.get("/metrics", headers=right).status_code == 200
    assert STANDBY_SECRET not in standby.log()


def test_a_replica_started_without_a_secret_is_open_and_says_so(server, client):
    assert "no replica secret" in server.log()
    assert client.get("/v1/models").status_code == 200
