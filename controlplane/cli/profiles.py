"""Where the CLI finds its server and key: flags, then environment, then a profile.

Profiles live in `<config dir>/thawpool/profiles.json` (the config dir is
`THAWPOOL_CONFIG_DIR`, else `$XDG_CONFIG_HOME`, else `~/.config`), written with mode
0600 in a 0700 folder because they hold API keys. `thawpool login` writes one and makes
it the current one. Precedence, highest first: `--url`/`--key`, `THAWPOOL_URL` /
`THAWPOOL_API_KEY`, the profile named by `--profile` or `THAWPOOL_PROFILE` or marked
current, then the default URL http://127.0.0.1:8080.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

DEFAULT_URL = "http://127.0.0.1:8080"


class ProfileError(Exception):
    """A profile that does not exist, or a file that cannot be read: a usage error."""


@dataclass(frozen=True)
class Profile:
    url: str
    key: Optional[str] = field(repr=False)     # an API key: kept out of reprs and tracebacks
    name: Optional[str] = None       # the stored profile it came from, if any


def config_dir(env: Mapping[str, str]) -> Path:
    if env.get("THAWPOOL_CONFIG_DIR"):
        return Path(env["THAWPOOL_CONFIG_DIR"]).expanduser()
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base).expanduser() / "thawpool"


def cache_dir(env: Mapping[str, str]) -> Path:
    """Where resumable pushes keep their state (part URLs: kept 0600 like the keys)."""
    if env.get("THAWPOOL_CONFIG_DIR"):
        return config_dir(env) / "cache"
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "thawpool"


class ProfileStore:
    def __init__(self, env: Mapping[str, str]):
        self.path = config_dir(env) / "profiles.json"

    def read(self) -> dict[str, Any]:
        if not self.path.exists():
            return {"current": None, "profiles": {}}
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError) as exc:
            raise ProfileError(f"{self.path}: unreadable ({exc})") from None
        return {"current": data.get("current"), "profiles": dict(data.get("profiles") or {})}

    def save(self, name: str, url: str, key: str) -> None:
        data = self.read()
        data["profiles"][name] = {"url": url.rstrip("/"), "key": key}
        data["current"] = name
        write_private(self.path, json.dumps(data, indent=2) + "\n")

    def remove(self, name: str) -> bool:
        data = self.read()
        if data["profiles"].pop(name, None) is None:
            return False
        if data["current"] == name:
            data["current"] = next(iter(data["profiles"]), None)
        write_private(self.path, json.dumps(data, indent=2) + "\n")
        return True


def write_private(path: Path, text: str) -> None:
    """Writes `text` readable by its owner only, from the first byte (no chmod after)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    temp = path.with_name(path.name + ".tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.chmod(temp, 0o600)          # an older file of that name kept its own mode
    os.replace(temp, path)


def resolve(env: Mapping[str, str], *, profile: Optional[str] = None,
            url: Optional[str] = None, key: Optional[str] = None) -> Profile:
    """The server and key a command uses (precedence in the module docstring)."""
    data = ProfileStore(env).read()
    name = profile or env.get("THAWPOOL_PROFILE") or data["current"]
    stored: dict[str, str] = {}
    if name is not None:
        if name not in data["profiles"]:
            if profile or env.get("THAWPOOL_PROFILE"):
                raise ProfileError(f"no profile {name!r}; run `thawpool login --profile {name}`")
        else:
            stored = data["profiles"][name]
    return Profile(url=(url or env.get("THAWPOOL_URL") or stored.get("url") or DEFAULT_URL),
                   key=key or env.get("THAWPOOL_API_KEY") or stored.get("key"),
                   name=name if stored else None)
