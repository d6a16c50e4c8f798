"""The control plane's REST API as typed calls: the one HTTP client of the CLI.

Every call answers the server's JSON (or text) or raises `Refused` (the server said no:
status, error type and code, message, request id) or `Unreachable` (no answer at all).
Streams (`stream_chat`, `stream_completion`) yield text deltas and keep the last usage
frame. No output and no argument parsing here: commands build on it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Optional

import httpx

JSON = dict[str, Any]


class ApiRefused(Exception):
    """The server answered an error: its status, error body and X-Request-Id."""

    def __init__(self, status: int, message: str, *, code: Optional[str] = None,
                 kind: Optional[str] = None, request_id: Optional[str] = None):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code
        self.kind, self.request_id = kind, request_id

    @classmethod
    def of(cls, response: httpx.Response) -> "ApiRefused":
        try:
            error = response.json().get("error") or {}
        except ValueError:
            error = {}
        message = error.get("message") if isinstance(error, dict) else None
        return cls(response.status_code, message or response.text.strip()[:200] or
                   response.reason_phrase, code=error.get("code") if error else None,
                   kind=error.get("type") if error else None,
                   request_id=response.headers.get("x-request-id"))


class Unreachable(Exception):
    """No answer from the server (refused connection, timeout, broken stream)."""


@dataclass
class StreamResult:
    """What a stream left behind once its deltas were read."""
    text: str = ""
    usage: Optional[JSON] = None
    finish_reason: Optional[str] = None
    request_id: Optional[str] = None


class Client:
    def __init__(self, url: str, key: Optional[str], *, timeout_s: float = 60.0,
                 transport: Optional[httpx.BaseTransport] = None):
        headers = {"authorization": f"Bearer {key}"} if key else {}
        self.url = url.rstrip("/")
        self.http = httpx.Client(base_url=self.url, headers=headers, transport=transport,
                                 timeout=httpx.Timeout(timeout_s, connect=10.0))

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------- plumbing

    def call(self, method: str, path: str, *, body: Any = None,
             params: Optional[Mapping[str, str]] = None) -> Any:
        """The answer's JSON (None for an empty body, the text for a non-JSON one)."""
        response = self._send(method, path, body=body, params=params)
        if not response.content:
            return None
        if response.headers.get("content-type", "").startswith("application/json"):
            return response.json()
        return response.text

    def _send(self, method: str, path: str, *, body: Any = None,
              params: Optional[Mapping[str, str]] = None) -> httpx.Response:
        try:
            response = self.http.request(method, path, json=body, params=params)
        except httpx.HTTPError as exc:
            raise Unreachable(f"{self.url}: {type(exc).__name__}: {exc}") from None
        if response.status_code >= 400:
            raise ApiRefused.of(response)
        return response

    # ------------------------------------------------------------- deployments

    def deployments(self) -> list[JSON]:
        return list(self.call("GET", "/v1/deployments")["data"])

    def deployment(self, name: str) -> JSON:
        return dict(self.call("GET", f"/v1/deployments/{name}"))

    def create_deployment(self, body: JSON) -> JSON:
        return dict(self.call("POST", "/v1/deployments", body=body))

    def patch_deployment(self, name: str, body: JSON) -> JSON:
        return dict(self.call("PATCH", f"/v1/deployments/{name}", body=body))

    def delete_deployment(self, name: str) -> None:
        self.call("DELETE", f"/v1/deployments/{name}")

    def set_traffic(self, name: str, split: Mapping[str, int]) -> JSON:
        return dict(self.call("POST", f"/v1/deployments/{name}/traffic", body=dict(split)))

    def rollback(self, name: str) -> JSON:
        return dict(self.call("POST", f"/v1/deployments/{name}/rollback"))

    # ------------------------------------------------------------- model uploads

    def uploads(self) -> list[JSON]:
        return list(self.call("GET", "/v1/models/uploads")["data"])

    def upload(self, upload_id: str) -> JSON:
        return dict(self.call("GET", f"/v1/models/uploads/{upload_id}"))

    def start_upload(self, name: str, files: list[JSON]) -> JSON:
        return dict(self.call("POST", "/v1/models/uploads", body={"name": name, "files": files}))

    def complete_upload(self, upload_id: str, files: list[JSON]) -> JSON:
        return dict(self.call("POST", f"/v1/models/uploads/{upload_id}/complete",
                              body={"files": files}))

    def delete_upload(self, upload_id: str) -> None:
        self.call("DELETE", f"/v1/models/uploads/{upload_id}")

    # ------------------------------------------------------------- adapters

    def adapters(self) -> list[JSON]:
        return list(self.call("GET", "/v1/adapters")["data"])

    def adapter(self, name: str) -> JSON:
        return dict(self.call("GET", f"/v1/adapters/{name}"))

    def create_adapter(self, body: JSON) -> JSON:
        return dict(self.call("POST", "/v1/adapters", body=body))

    def delete_adapter(self, name: str) -> JSON:
        return dict(self.call("DELETE", f"/v1/adapters/{name}"))

    # ------------------------------------------------------------- billing

    def report(self, params: Mapping[str, str]) -> Any:
        """The billing report: JSON, or CSV text with params["format"] == "csv"."""
        return self.call("GET", "/v1/billing/report", params=params)

    def margin(self, params: Mapping[str, str]) -> Any:
        """The margin report (admin): JSON, or CSV text with params["format"] == "csv"."""
        return self.call("GET", "/v1/billing/margin", params=params)

    def quota(self) -> JSON:
        return dict(self.call("GET", "/v1/quota"))

    # ------------------------------------------------------------- admin

    def tenants(self) -> list[JSON]:
        return list(self.call("GET", "/v1/tenants")["data"])

    def create_tenant(self, name: str) -> JSON:
        return dict(self.call("POST", "/v1/tenants", body={"name": name}))

    def tenant_quota(self, tenant: str) -> JSON:
        return dict(self.call("GET", f"/v1/tenants/{tenant}/quota"))

    def set_tenant_quota(self, tenant: str, limits: Mapping[str, Optional[int]]) -> JSON:
        return dict(self.call("PATCH", f"/v1/tenants/{tenant}/quota", body=dict(limits)))

    def keys(self, tenant: Optional[str] = None) -> list[JSON]:
        """A tenant's keys (admin), or without one the caller's own tenant's."""
        path = f"/v1/tenants/{tenant}/keys" if tenant else "/v1/keys"
        return list(self.call("GET", path)["data"])

    def create_key(self, tenant: str, body: JSON) -> JSON:
        return dict(self.call("POST", f"/v1/tenants/{tenant}/keys", body=body))

    def revoke_key(self, prefix: str) -> JSON:
        return dict(self.call("DELETE", f"/v1/keys/{prefix}"))

    # ------------------------------------------------------------- webhooks

    def webhooks(self, tenant: Optional[str] = None) -> list[JSON]:
        """The caller's endpoints (admin: every one, or one tenant's)."""
        params = {"tenant": tenant} if tenant else None
        return list(self.call("GET", "/v1/webhooks", params=params)["data"])

    def webhook(self, endpoint_id: str) -> JSON:
        return dict(self.call("GET", f"/v1/webhooks/{endpoint_id}"))

    def create_webhook(self, body: JSON) -> JSON:
        return dict(self.call("POST", "/v1/webhooks", body=body))

    def update_webhook(self, endpoint_id: str, changes: JSON) -> JSON:
        return dict(self.call("PATCH", f"/v1/webhooks/{endpoint_id}", body=changes))

    def delete_webhook(self, endpoint_id: str) -> None:
        self.call("DELETE", f"/v1/webhooks/{endpoint_id}")

    def webhook_deliveries(self, endpoint_id: str, limit: int) -> list[JSON]:
        return list(self.call("GET", f"/v1/webhooks/{endpoint_id}/deliveries",
                              params={"limit": str(limit)})["data"])

    def test_webhook(self, endpoint_id: str) -> JSON:
        return dict(self.call("POST", f"/v1/webhooks/{endpoint_id}/test"))

    # ------------------------------------------------------------- invocation

    def stream_chat(self, model: str, messages: list[JSON], result: StreamResult,
                    **options: Any) -> Iterator[str]:
        body = {"model": model, "messages": messages, **options}
        return self._stream("/v1/chat/completions", body, result, chat=True)

    def stream_completion(self, model: str, prompt: str, result: StreamResult,
                          **options: Any) -> Iterator[str]:
        body = {"model": model, "prompt": prompt, **options}
        return self._stream("/v1/completions", body, result, chat=False)

    def _stream(self, path: str, body: JSON, result: StreamResult, *,
                chat: bool) -> Iterator[str]:
        """Text deltas of an SSE stream; `result` gets the text, usage and finish reason.
        A stream that ends without [DONE] was cut: Unreachable after what arrived."""
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        try:
            with self.http.stream("POST", path, json=body,
                                  timeout=httpx.Timeout(None, connect=10.0)) as response:
                result.request_id = response.headers.get("x-request-id")
                if response.status_code >= 400:
                    response.read()
                    raise ApiRefused.of(response)
                yield from _deltas(response.iter_lines(), result, chat)
        except httpx.HTTPError as exc:
            raise Unreachable(f"{self.url}: the stream broke off ({type(exc).__name__})") from None


def _deltas(lines: Iterator[str], result: StreamResult, chat: bool) -> Iterator[str]:
    for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        event = json.loads(data)
        if "error" in event:
            error = event["error"]
            raise ApiRefused(502, str(error.get("message", error)), code=error.get("code"),
                          kind=error.get("type"), request_id=result.request_id)
        if event.get("usage"):
            result.usage = event["usage"]
        for choice in event.get("choices") or []:
            text = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
            result.finish_reason = choice.get("finish_reason") or result.finish_reason
            if text:
                result.text += text
                yield text
    raise Unreachable("the stream ended without [DONE]: the answer is incomplete")
