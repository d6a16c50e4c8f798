"""The web console's files at /ui: plain middleware in front of auth, because the page
and its scripts are public; everything the page shows it fetches from the API with the
key the user signs in with (kept in the tab's session storage), so it shows exactly what
that key may see.

The files are controlplane/console_static/ as they are in the repo (no build step);
uPlot is vendored there at a pinned version with its license. A strict
Content-Security-Policy keeps the page off every other origin.
"""
from __future__ import annotations

import mimetypes
from pathlib import Path

from starlette.responses import FileResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

STATIC = Path(__file__).with_name("console_static")
PREFIX = "/ui"
POLICY = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
          "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")


class ConsoleFiles:
    def __init__(self, app: ASGIApp, root: Path = STATIC):
        self.app = app
        self.files = {f"{PREFIX}/{p.relative_to(root).as_posix()}": p
                      for p in root.rglob("*") if p.is_file()}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not (path == PREFIX or path.startswith(PREFIX + "/")):
            await self.app(scope, receive, send)
            return
        await self.response(path, scope.get("method", "GET"))(scope, receive, send)

    def response(self, path: str, method: str) -> Response:
        if path == PREFIX:
            return RedirectResponse(PREFIX + "/", status_code=308)
        found = self.files.get(f"{PREFIX}/index.html" if path == PREFIX + "/" else path)
        if method not in ("GET", "HEAD") or found is None:
            return Response("not found", status_code=404, media_type="text/plain")
        media_type = mimetypes.guess_type(found.name)[0] or "application/octet-stream"
        return FileResponse(found, media_type=media_type, headers={
            "content-security-policy": POLICY, "cache-control": "no-cache",
            "x-content-type-options": "nosniff"})
