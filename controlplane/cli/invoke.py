"""`thawpool chat NAME` (a streaming REPL that keeps the conversation) and
`thawpool complete NAME PROMPT`.

A deployment scaled to zero answers after a cold start; while the first token has
not come, a watcher polls the deployment's status and prints each state it passes
through on stderr, so the wait is never silent.
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from typing import Any, Iterator, Optional

from controlplane.cli.client import JSON, Client, StreamResult
from controlplane.cli.output import Context, Output, Subcommands, command


def register(commands: Subcommands, flags: argparse.ArgumentParser) -> None:
    chat = commands.add_parser("chat", parents=[flags], help="chat with a deployment (streams)")
    chat.add_argument("name")
    chat.add_argument("--system", default=None, help="a system message first")
    _sampling(chat)
    chat.set_defaults(func=command(cmd_chat))
    complete = commands.add_parser("complete", parents=[flags], help="complete a prompt")
    complete.add_argument("name")
    complete.add_argument("prompt")
    _sampling(complete)
    complete.set_defaults(func=command(cmd_complete))


def _sampling(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--temperature", type=float, default=None)
    parser.add_argument("--top-p", type=float, default=None)


def _options(args: argparse.Namespace) -> dict[str, Any]:
    chosen = {"max_tokens": args.max_tokens, "temperature": args.temperature,
              "top_p": args.top_p}
    return {k: v for k, v in chosen.items() if v is not None}


class ThawWatcher:
    """Prints the deployment's state on stderr while a request waits for its first token."""

    def __init__(self, client: Client, name: str, out: Output, interval_s: float = 1.0):
        self.client, self.name, self.out, self.interval_s = client, name, out, interval_s
        self.first_token = threading.Event()
        self.started = time.monotonic()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "ThawWatcher":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.first_token.set()
        self.thread.join()

    def _run(self) -> None:
        said: Optional[str] = None
        while not self.first_token.wait(self.interval_s):
            word = self._state()
            if word is not None and word != said:
                self.out.note(f"{self.name}: {word} ({time.monotonic() - self.started:.0f}s)")
                said = word

    def _state(self) -> Optional[str]:
        try:
            deployment = self.client.deployment(self.name)
        except Exception:  # noqa: BLE001 - the request itself reports what went wrong
            return None
        status = deployment.get("status") or {}
        replicas = [r["state"] for s in status.values() for r in s.get("replicas", [])]
        revisions = sorted({status[r]["state"] for r in deployment["traffic"] if r in status})
        if replicas:
            return f"thawing: replica {', '.join(replicas)}"
        return f"waiting: {', '.join(revisions) or 'no replica yet'}"


def stream_out(deltas: Iterator[str], watcher: ThawWatcher, out: Output) -> None:
    """Writes each delta as it comes (not in --json mode); the first one stops the watcher."""
    for text in deltas:
        watcher.first_token.set()
        if not out.json_mode:
            sys.stdout.write(text)
            sys.stdout.flush()
    if not out.json_mode:
        sys.stdout.write("\n")


def cmd_complete(ctx: Context) -> int:
    args, result = ctx.args, StreamResult()
    with ctx.client() as client, ctx.client() as status_client:
        with ThawWatcher(status_client, args.name, ctx.out) as watcher:
            stream_out(client.stream_completion(args.name, args.prompt, result, **_options(args)),
                       watcher, ctx.out)
    _finish(ctx.out, {"text": result.text}, result)
    return 0


def cmd_chat(ctx: Context) -> int:
    """Reads one user turn per line until EOF or /exit; /reset forgets the conversation."""
    args = ctx.args
    history: list[JSON] = [{"role": "system", "content": args.system}] if args.system else []
    with ctx.client() as client, ctx.client() as status_client:
        for line in _turns(ctx.out):
            if line == "/reset":
                del history[1 if args.system else 0:]
                continue
            history.append({"role": "user", "content": line})
            result = StreamResult()
            with ThawWatcher(status_client, args.name, ctx.out) as watcher:
                stream_out(client.stream_chat(args.name, history, result, **_options(args)),
                           watcher, ctx.out)
            history.append({"role": "assistant", "content": result.text})
            _finish(ctx.out, {"role": "assistant", "content": result.text}, result)
    return 0


def _turns(out: Output) -> Iterator[str]:
    interactive = sys.stdin.isatty()
    if interactive:
        out.note("chat: one message per line; /reset forgets, /exit or Ctrl-D ends")
    while True:
        try:
            line = input("you> ") if interactive else sys.stdin.readline()
        except (EOFError, KeyboardInterrupt):
            return
        if not interactive and not line:
            return
        line = line.strip()
        if line == "/exit":
            return
        if line:
            yield line


def _finish(out: Output, shown: JSON, result: StreamResult) -> None:
    """The turn's usage on stderr; in --json mode one JSON line on stdout per turn."""
    usage = result.usage or {}
    if out.json_mode:
        print(json.dumps({**shown, "usage": usage, "finish_reason": result.finish_reason,
                          "request_id": result.request_id}), flush=True)
        return
    out.note(f"[{usage.get('prompt_tokens', '?')} prompt + "
             f"{usage.get('completion_tokens', '?')} completion tokens, "
             f"request id {result.request_id}]")
