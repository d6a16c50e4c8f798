"""`thawpool adapters push|ls|rm`: the caller's LoRA adapters.

`push DIR --base BASE [--name NAME]` uploads the folder's two PEFT files to the tenant's
own prefix as the upload `NAME.adapter` (controlplane.cli.models.push: parts checked,
resumable), then attaches them to BASE (`POST /v1/adapters`). An attach the server
refuses leaves no upload behind, so the same push runs again once the cause is fixed.
`rm NAME` deletes the adapter, and the upload its push made once no other adapter of the
tenant reads those files.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional

from controlplane.cli.client import JSON, ApiRefused, Client
from controlplane.cli.models import push
from controlplane.cli.output import Context, Subcommands, UsageError, add_command, command
from controlplane.cli.push import LocalFile, files_of
from spec.lora_adapter import CONFIG_FILE, WEIGHTS_FILE

UPLOAD_SUFFIX = ".adapter"         # an adapter's upload: never a deployment's name (no dots)


def register(commands: Subcommands, flags: argparse.ArgumentParser) -> None:
    adapters = commands.add_parser("adapters", help="LoRA adapters: push, ls, rm")
    actions = adapters.add_subparsers(dest="action", required=True)
    pushing = actions.add_parser("push", parents=[flags],
                                 help="upload a PEFT adapter folder and attach it to a base deployment")
    pushing.add_argument("source", type=Path, metavar="DIR",
                         help=f"the folder PEFT saved: {CONFIG_FILE} and {WEIGHTS_FILE}")
    pushing.add_argument("--base", required=True,
                         help="the deployment it runs on (yours, or a shared one), with engine max_loras")
    pushing.add_argument("--name", default=None, help="the adapter's name (default: the folder's)")
    pushing.add_argument("--parallel", type=int, default=4, help="parts in flight at once")
    pushing.add_argument("--restart", action="store_true",
                         help="drop an earlier unfinished push of NAME and start again")
    pushing.set_defaults(func=command(cmd_push))
    add_command(actions, flags, "ls", cmd_ls, "your adapters")
    add_command(actions, flags, "rm", cmd_rm, "delete an adapter (and the files its push uploaded)", "name")


def upload_name(adapter: str) -> str:
    return adapter + UPLOAD_SUFFIX


def adapter_files(source: Path) -> list[LocalFile]:
    """The folder's two PEFT files; anything else in it stays home."""
    if not source.is_dir():
        raise UsageError(f"{source}: not a folder (an adapter is a folder holding {CONFIG_FILE} "
                         f"and {WEIGHTS_FILE}, as PEFT saves it)")
    found = {f.path: f for f in files_of(source)}
    missing = [name for name in (CONFIG_FILE, WEIGHTS_FILE) if name not in found]
    if missing:
        raise UsageError(f"{source}: no {' and no '.join(missing)} (PEFT's save_pretrained writes both)")
    return [found[CONFIG_FILE], found[WEIGHTS_FILE]]


def cmd_push(ctx: Context) -> int:
    args = ctx.args
    files = adapter_files(args.source)
    name = args.name or args.source.resolve().name
    with ctx.client(timeout_s=300) as client:
        upload = push(ctx, client, upload_name(name), args.source, files)
        adapter = _attach(client, name, args.base, upload)
    ctx.out.result(adapter, lambda: ctx.out.say(
        f"attached {adapter['name']} to {adapter['base']}: rank {adapter['rank']}, "
        f"{adapter['weight_bytes']} bytes\ncall it as model {adapter['model']}"))
    return 0


def _attach(client: Client, name: str, base: str, upload: JSON) -> JSON:
    try:
        return client.create_adapter({"name": name, "base": base, "adapter_uri": upload["model_uri"]})
    except ApiRefused:
        client.delete_upload(upload["id"])      # nothing reads these files: push them again
        raise


def cmd_ls(ctx: Context) -> int:
    with ctx.client() as client:
        listed = client.adapters()
    ctx.out.result(listed, lambda: ctx.out.table(
        ["name", "model", "rank", "targets", "bytes", "created"],
        [(a["name"], a["model"], a["rank"], ",".join(a["target_modules"]), a["weight_bytes"],
          a["created_at"][:19]) for a in listed]))
    return 0


def cmd_rm(ctx: Context) -> int:
    name = ctx.args.name
    with ctx.client() as client:
        adapter = client.adapter(name)
        client.delete_adapter(name)
        dropped = _drop_upload(client, adapter)
    ctx.out.result({"deleted": name, "upload": dropped}, lambda: ctx.out.say(
        f"deleted {name}" + (f" and its files ({dropped})" if dropped else "")))
    return 0


def _drop_upload(client: Client, adapter: JSON) -> Optional[str]:
    """The upload `push` made for the adapter, deleted once no adapter of the tenant reads
    its files; its name, or None when there is none to delete."""
    uri = adapter["adapter_uri"]
    if any(other["adapter_uri"] == uri for other in client.adapters()):
        return None
    for upload in client.uploads():
        if upload["name"] == upload_name(adapter["name"]) and upload["model_uri"] == uri:
            client.delete_upload(upload["id"])
            return str(upload["name"])
    return None
