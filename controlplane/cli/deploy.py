"""`thawpool deploy|ls|traffic|rollback|rm`: deployments and their revisions
(`status` lives in controlplane.cli.status)."""
from __future__ import annotations

import argparse
import json
from typing import Any, Optional

from controlplane.cli.client import JSON, Client, ApiRefused
from controlplane.cli.models import find_upload
from controlplane.cli.output import add_command, Context, Subcommands, UsageError, command, parse_pairs

SCALING_FLAGS = {"min_replicas": "--min-replicas", "max_replicas": "--max-replicas",
                 "target_concurrency": "--target-concurrency", "idle_timeout_s": "--idle-timeout",
                 "sleep_timeout_s": "--sleep-timeout"}
SECONDS = ("idle_timeout_s", "sleep_timeout_s")


def register(commands: Subcommands, flags: argparse.ArgumentParser) -> None:
    deploy = commands.add_parser("deploy", parents=[flags],
                                 help="deploy a model, or change a deployment (a new revision)")
    deploy.add_argument("name")
    deploy.add_argument("--model", default=None,
                        help="an uploaded model's name (thawpool models ls) or an s3:// URI")
    deploy.add_argument("--gpus", type=int, default=None, help="GPUs per replica")
    deploy.add_argument("--gpu-memory-gb", type=float, default=None, help="memory per replica")
    for name, flag in SCALING_FLAGS.items():
        deploy.add_argument(flag, dest=name, type=float if name in SECONDS else int, default=None)
    deploy.add_argument("--prefetch", action=argparse.BooleanOptionalAction, default=None,
                        help="pull the weights into the node cache on deploy and scale-up")
    deploy.add_argument("--engine", nargs="*", default=[], metavar="KEY=VALUE",
                        help="engine options, values as JSON (kv_cache_tokens=4096)")
    deploy.add_argument("--fallback", action="append", default=None, metavar="NAME[:ON[:WAIT_S]]",
                        help="another deployment of yours that answers when this one cannot, "
                             "repeated in order: small, small:cold,error, small:cold:2 "
                             "(conditions cold, rate_limited, error; docs/fallbacks.md); "
                             "--fallback '' clears them")
    deploy.add_argument("--no-promote", action="store_true",
                        help="a new revision takes no traffic until `thawpool traffic`")
    deploy.set_defaults(func=command(cmd_deploy))
    add_command(commands, flags, "ls", cmd_ls, "your deployments")
    traffic = add_command(commands, flags, "traffic", cmd_traffic,
                          "split traffic by percent: NAME r1=90 r2=10", "name")
    traffic.add_argument("split", nargs="+", metavar="REVISION=PERCENT")
    add_command(commands, flags, "rollback", cmd_rollback,
                "all traffic to the revision before the newest live one", "name")
    add_command(commands, flags, "rm", cmd_rm, "delete a deployment", "name")


def cmd_deploy(ctx: Context) -> int:
    args = ctx.args
    with ctx.client(timeout_s=300) as client:
        body = _body(args, client)
        try:
            deployment = client.create_deployment({"name": args.name, **body})
            verb = "deployed"
        except ApiRefused as exc:
            if exc.status != 409 or not body:
                raise
            deployment = client.patch_deployment(args.name, {**body, "promote": not args.no_promote})
            verb = "updated"
    ctx.out.result(deployment, lambda: _say_deployed(ctx, verb, deployment))
    return 0


def _body(args: argparse.Namespace, client: Client) -> JSON:
    body: JSON = {}
    if args.model is not None:
        body["model_uri"] = model_uri(client, args.model)
    resources = {k: v for k, v in (("gpu_count", args.gpus),
                                   ("gpu_memory_gb", args.gpu_memory_gb)) if v is not None}
    scaling = {k: getattr(args, k) for k in (*SCALING_FLAGS, "prefetch") if getattr(args, k) is not None}
    engine = {k: _json_value(v) for k, v in parse_pairs(args.engine, "--engine").items()}
    body.update({k: v for k, v in (("resources", resources), ("scaling", scaling),
                                   ("engine", engine)) if v})
    if args.fallback is not None:
        body["fallbacks"] = [fallback_entry(text) for text in args.fallback if text]
    return body


def fallback_entry(text: str) -> JSON:
    """NAME[:ON[:WAIT_S]] as one `fallbacks` entry; the server checks the rest."""
    name, _, rest = text.partition(":")
    conditions, _, wait = rest.partition(":")
    entry: JSON = {"deployment": name}
    if conditions:
        entry["on"] = conditions.split(",")
    if wait:
        try:
            entry["cold_wait_s"] = float(wait)
        except ValueError:
            raise UsageError(f"--fallback {text}: the wait is seconds, a number") from None
    return entry


def model_uri(client: Client, model: str) -> str:
    """An s3:// URI as given; an uploaded model's name as its URI (a GGUF file's object)."""
    if model.startswith("s3://"):
        return model
    upload = find_upload(client, model)
    if upload["status"] != "complete":
        raise UsageError(f"model {model!r} is not fully uploaded; run `thawpool models push` "
                         "again to resume it")
    files = upload["files"]
    if len(files) == 1 and files[0]["path"].endswith(".gguf"):
        return f"{upload['model_uri']}{files[0]['path']}"
    return str(upload["model_uri"])


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text                    # a bare word: a string


def _say_deployed(ctx: Context, verb: str, deployment: JSON) -> None:
    newest = deployment["revisions"][-1] if deployment["revisions"] else {}
    ctx.out.say(f"{verb} {deployment['name']}: revision {newest.get('name')} "
                f"({newest.get('model_uri')}), traffic {_split(deployment['traffic'])}")
    ctx.out.say(f"it thaws on its first request: thawpool chat {deployment['name']}")


def _split(traffic: dict[str, Any]) -> str:
    return " ".join(f"{r}={p}%" for r, p in traffic.items()) or "-"


def cmd_ls(ctx: Context) -> int:
    with ctx.client() as client:
        listed = client.deployments()
        states = {d["name"]: _state_word(client, d["name"]) for d in listed}
    ctx.out.result(listed, lambda: ctx.out.table(
        ["name", "state", "traffic", "revisions", "model", "updated"],
        [(d["name"], states[d["name"]], _split(d["traffic"]), len(d["revisions"]),
          d["revisions"][-1]["model_uri"] if d["revisions"] else "", d["updated_at"][:19])
         for d in listed]))
    return 0


def _state_word(client: Client, name: str) -> Optional[str]:
    """The state of the revisions taking traffic, in a word or a few."""
    try:
        deployment = client.deployment(name)
    except ApiRefused:
        return None                    # deleted meanwhile
    status = deployment.get("status") or {}
    words = sorted({status[r]["state"] for r in deployment["traffic"] if r in status})
    return ",".join(words) or "-"


def cmd_traffic(ctx: Context) -> int:
    split = parse_pairs(ctx.args.split, "traffic")
    try:
        percents = {revision: int(value) for revision, value in split.items()}
    except ValueError:
        raise UsageError("traffic: percents are whole numbers (r1=90 r2=10)") from None
    with ctx.client() as client:
        deployment = client.set_traffic(ctx.args.name, percents)
    ctx.out.result(deployment, lambda: ctx.out.say(
        f"{deployment['name']}: traffic {_split(deployment['traffic'])}"))
    return 0


def cmd_rollback(ctx: Context) -> int:
    with ctx.client() as client:
        deployment = client.rollback(ctx.args.name)
    ctx.out.result(deployment, lambda: ctx.out.say(
        f"{deployment['name']}: rolled back, traffic {_split(deployment['traffic'])}"))
    return 0


def cmd_rm(ctx: Context) -> int:
    with ctx.client() as client:
        client.delete_deployment(ctx.args.name)
    ctx.out.result({"deleted": ctx.args.name}, lambda: ctx.out.say(f"deleted {ctx.args.name}"))
    return 0
