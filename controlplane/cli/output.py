"""What every client command shares: its common flags, its output, its exit code.

Exit codes: 0 ok, 1 the server refused (or could not be reached), 2 a usage error
(argparse's own, a missing key, an unknown profile, a bad argument). An error is one
line on stderr with the server's message and request id; with `--json` that line is
JSON (`{"error": {...}}`) and results are JSON on stdout, so scripts parse both.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Sequence, TypeAlias

from rich.console import Console
from rich.table import Table

from controlplane.cli.client import Client, ApiRefused, Unreachable
from controlplane.cli.profiles import Profile, ProfileError, resolve

OK, REFUSED, USAGE = 0, 1, 2
# what add_subparsers returns (generic in typeshed only: a string alias)
Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


class UsageError(Exception):
    """The command line asks for something impossible: exit 2, nothing sent."""


def common_flags() -> argparse.ArgumentParser:
    """The flags every client command takes, after its name (`thawpool ls --json`)."""
    flags = argparse.ArgumentParser(add_help=False)
    flags.add_argument("--profile", default=None, help="stored profile (THAWPOOL_PROFILE)")
    flags.add_argument("--url", default=None, help="server URL (THAWPOOL_URL)")
    flags.add_argument("--key", default=None, help="API key (THAWPOOL_API_KEY)")
    flags.add_argument("--json", action="store_true", help="JSON output for scripts")
    return flags


class Output:
    """Results on stdout (tables, or JSON), progress and errors on stderr."""

    def __init__(self, json_mode: bool):
        self.json_mode = json_mode
        wide = None if sys.stdout.isatty() else 200     # a pipe gets whole rows, not 80 columns
        self.console = Console(soft_wrap=True, width=wide, highlight=False)
        self.err = Console(stderr=True, highlight=False, soft_wrap=True)

    def json(self, data: Any) -> None:
        print(json.dumps(data, indent=2, default=str), flush=True)

    def result(self, data: Any, human: Callable[[], None]) -> None:
        """`data` as JSON in --json mode, else whatever `human` prints."""
        if self.json_mode:
            self.json(data)
        else:
            human()

    def say(self, text: str) -> None:
        self.console.print(text, markup=False)

    def note(self, text: str) -> None:
        """Progress and hints: stderr, so stdout stays the result."""
        self.err.print(text, markup=False)

    def table(self, columns: Sequence[str], rows: Iterable[Sequence[Any]],
              title: Optional[str] = None) -> None:
        table = Table(*columns, title=title, show_lines=False, header_style="bold")
        for row in rows:
            table.add_row(*["" if v is None else str(v) for v in row])
        self.console.print(table)


@dataclass
class Context:
    """One command's parsed flags, its output and where its server is."""
    args: argparse.Namespace
    out: Output
    profile: Profile

    def client(self, *, need_key: bool = True, timeout_s: float = 60.0) -> Client:
        if need_key and not self.profile.key:
            raise UsageError("no API key: run `thawpool login --url URL --key KEY`, "
                             "or pass --key, or set THAWPOOL_API_KEY")
        return Client(self.profile.url, self.profile.key, timeout_s=timeout_s)


Command = Callable[[Context], int]


def command(fn: Command, *, stored: bool = True) -> Callable[[argparse.Namespace], int]:
    """argparse's `func` for a client command: its context built, its errors mapped.
    `stored=False` (login, profiles): the command reads no stored profile."""
    @functools.wraps(fn)
    def run(args: argparse.Namespace) -> int:
        out = Output(getattr(args, "json", False))
        try:
            profile = (resolve(os.environ, profile=args.profile, url=args.url, key=args.key)
                       if stored else Profile(url=args.url or "", key=args.key))
            return fn(Context(args, out, profile))
        except ApiRefused as exc:
            return fail(out, REFUSED, exc.message, status=exc.status, code=exc.code,
                        request_id=exc.request_id)
        except Unreachable as exc:
            return fail(out, REFUSED, f"no answer from the server: {exc}")
        except (UsageError, ProfileError) as exc:
            return fail(out, USAGE, str(exc))
    return run


def add_command(actions: Subcommands, flags: argparse.ArgumentParser, name: str, fn: Command,
                help: str, *positionals: str) -> argparse.ArgumentParser:
    """A client command: the common flags, its positional arguments, its function."""
    parser = actions.add_parser(name, parents=[flags], help=help)
    for positional in positionals:
        parser.add_argument(positional)
    parser.set_defaults(func=command(fn))
    return parser


def fail(out: Output, exit_code: int, message: str, *, status: Optional[int] = None,
         code: Optional[str] = None, request_id: Optional[str] = None) -> int:
    """The one error line, on stderr; returns the exit code."""
    if out.json_mode:
        error = {"message": message, "status": status, "code": code, "request_id": request_id}
        print(json.dumps({"error": error}), file=sys.stderr, flush=True)
        return exit_code
    head = " ".join(str(p) for p in (status, code) if p)
    line = f"thawpool: error: {head + ': ' if head else ''}{message}"
    if request_id:
        line += f" (request id {request_id})"
    print(line.replace("\n", " "), file=sys.stderr, flush=True)
    return exit_code


def parse_pairs(pairs: Sequence[str], what: str) -> dict[str, str]:
    """`a=1 b=2` -> {"a": "1", "b": "2"}; anything else is a usage error."""
    parsed: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name or not value:
            raise UsageError(f"{what}: expected NAME=VALUE, got {pair!r}")
        parsed[name] = value
    return parsed
