"""`thawpool models push|ls|rm`: the caller's uploaded models (work: controlplane.cli.push)."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from controlplane.cli.client import JSON, Client, ApiRefused
from controlplane.cli.output import add_command, Context, Subcommands, UsageError, command
from controlplane.cli.profiles import cache_dir
from controlplane.cli.progress import upload_progress
from controlplane.cli.push import (LocalFile, Part, PartSender, PushState, completion, files_of,
                                   new_state, parts_left, pending_upload, state_path)


def register(actions: Subcommands, flags: argparse.ArgumentParser) -> None:
    push = actions.add_parser("push", parents=[flags], help="upload a model folder or a GGUF file")
    push.add_argument("source", type=Path, help="model folder, or one .gguf file")
    push.add_argument("name", help="the model's name under your prefix")
    push.add_argument("--parallel", type=int, default=4, help="parts in flight at once")
    push.add_argument("--restart", action="store_true",
                      help="drop an earlier unfinished push of NAME and start again")
    push.set_defaults(func=command(cmd_push))
    add_command(actions, flags, "ls", cmd_ls, "your uploaded models")
    add_command(actions, flags, "rm", cmd_rm, "delete an uploaded model", "name")


def cmd_push(ctx: Context) -> int:
    args = ctx.args
    if not args.source.exists():
        raise UsageError(f"{args.source}: no such file or folder")
    files = files_of(args.source)
    if not files:
        raise UsageError(f"{args.source}: no files to upload")
    with ctx.client() as client:
        upload = push(ctx, client, args.name, args.source, files)
    ctx.out.result(upload, lambda: ctx.out.say(
        f"pushed {upload['name']}: {upload['model_uri']}\n"
        f"deploy it: thawpool deploy NAME --model {upload['name']}"))
    return 0


def push(ctx: Context, client: Client, name: str, source: Path, files: list[LocalFile]) -> JSON:
    """`files` of `source` uploaded as `name` (resumed where an earlier push of the same
    bytes stopped; `--restart` and `--parallel` from the command line): the upload."""
    state = _resumable(ctx, client, name, source, files)
    return _finish(ctx, client, state, files)


def _resumable(ctx: Context, client: Client, name: str, source: Path,
               files: list[LocalFile]) -> PushState:
    """The saved state of an earlier push of the same bytes, or a new upload's."""
    path = state_path(cache_dir(os.environ), client.url, name, source)
    state = PushState.load(path)
    if state is not None and not ctx.args.restart and state.matches(client.url, files):
        if pending_upload(client, state) is not None:
            done = sum(len(state.done(f.path)) for f in files)
            ctx.out.note(f"push: resuming {name}: {done} parts already uploaded")
            return state
    if ctx.args.restart:
        _drop_named(client, name)
    upload = client.start_upload(name, [{"path": f.path, "size": f.size} for f in files])
    ctx.out.note(f"push: {name}: {len(files)} files, {_total(files)} bytes")
    return new_state(path, client.url, files, upload)


def _finish(ctx: Context, client: Client, state: PushState, files: list[LocalFile]) -> JSON:
    left = parts_left(state, files)
    total, sending = _total(files), sum(p.size for p in left)
    progress = upload_progress(total, total - sending)
    for file in files:
        progress.add_file(file.path, file.size, file.size - sum(p.size for p in left
                                                                  if p.file == file))
    plans = state.data["plans"]

    def on_part(part: Part) -> None:
        count = len(plans[part.file.path]["urls"])
        progress.advance(part.file.path, part.size, f"part {part.number}/{count}")

    try:
        PartSender(state, on_part).send_all(left, ctx.args.parallel)
    finally:
        progress.close()
    upload = client.complete_upload(state.data["upload_id"], completion(state, files))
    state.forget()
    return upload


def _drop_named(client: Client, name: str) -> None:
    for upload in client.uploads():
        if upload["name"] == name:
            client.delete_upload(upload["id"])


def _total(files: list[LocalFile]) -> int:
    return sum(f.size for f in files)


def cmd_ls(ctx: Context) -> int:
    with ctx.client() as client:
        uploads = client.uploads()
    ctx.out.result(uploads, lambda: ctx.out.table(
        ["name", "status", "bytes", "files", "model uri", "created"],
        [(u["name"], u["status"], u["total_bytes"], len(u["files"]), u["model_uri"],
          u["created_at"][:19]) for u in uploads]))
    return 0


def cmd_rm(ctx: Context) -> int:
    with ctx.client() as client:
        upload = find_upload(client, ctx.args.name)
        client.delete_upload(upload["id"])
    ctx.out.result({"deleted": upload["name"]}, lambda: ctx.out.say(f"deleted {upload['name']}"))
    return 0


def find_upload(client: Client, name: str) -> JSON:
    for upload in client.uploads():
        if upload["name"] == name:
            return upload
    raise ApiRefused(404, f"no uploaded model named {name!r} (thawpool models ls)",
                  code="upload_not_found")
