"""`thawpool login` and `thawpool profiles`: servers and keys kept for later commands
(stored by controlplane.cli.profiles, mode 0600)."""
from __future__ import annotations

import argparse
import getpass
import os
import sys

from controlplane.cli.client import Client, ApiRefused
from controlplane.cli.output import Context, Subcommands, UsageError, command
from controlplane.cli.profiles import DEFAULT_URL, ProfileStore


def register(commands: Subcommands, flags: argparse.ArgumentParser) -> None:
    login = commands.add_parser("login", parents=[flags],
                                help="check a key against a server and keep both as a profile")
    login.set_defaults(func=command(cmd_login, stored=False))
    profiles = commands.add_parser("profiles", parents=[flags], help="the stored profiles")
    profiles.add_argument("--remove", default=None, metavar="NAME", help="forget a profile")
    profiles.set_defaults(func=command(cmd_profiles, stored=False))


def cmd_login(ctx: Context) -> int:
    """The key is checked first: a key the server refuses (401) is never stored."""
    args = ctx.args
    url = (args.url or os.environ.get("THAWPOOL_URL") or DEFAULT_URL).rstrip("/")
    key = _key(args.key)
    with Client(url, key) as client:
        try:
            client.deployments()
        except ApiRefused as exc:
            if exc.status != 403:          # 403: a valid key without the deploy scope
                raise
    name = args.profile or "default"
    store = ProfileStore(os.environ)
    store.save(name, url, key)
    ctx.out.result({"profile": name, "url": url, "path": str(store.path)}, lambda: ctx.out.say(
        f"logged in to {url} as profile {name!r} (kept in {store.path})"))
    return 0


def _key(given: str | None) -> str:
    if given == "-":
        given = sys.stdin.readline().strip()
    elif given is None and sys.stdin.isatty():
        given = getpass.getpass("API key: ").strip()
    if not given:
        raise UsageError("login: pass --key KEY (or --key - to read it from stdin)")
    return given


def cmd_profiles(ctx: Context) -> int:
    store = ProfileStore(os.environ)
    if ctx.args.remove:
        if not store.remove(ctx.args.remove):
            raise UsageError(f"no profile {ctx.args.remove!r}")
    data = store.read()
    shown = [{"name": name, "url": p["url"], "key": p["key"][:10] + "...",
              "current": name == data["current"]} for name, p in data["profiles"].items()]
    ctx.out.result(shown, lambda: ctx.out.table(
        ["", "profile", "url", "key"],
        [("*" if p["current"] else "", p["name"], p["url"], p["key"]) for p in shown]))
    return 0
