"""The app's route table, walked: so a test over every route cannot miss a new one."""
from __future__ import annotations

import re


def every_route(routes, prefix: str = "") -> list[tuple[str, str]]:
    """(method, path template) for every route of the app, mounts included."""
    found = []
    for route in routes:
        path = prefix + route.path
        if getattr(route, "routes", None) is not None:          # a Mount or a Router
            found += every_route(route.routes, path)
        else:
            found += [(m, path) for m in sorted(route.methods or {"GET"}) if m != "HEAD"]
    return found


def filled(path: str, value: str = "x1") -> str:
    """The path with each {param} filled in."""
    return re.sub(r"\{[^}]*\}", value, path)
