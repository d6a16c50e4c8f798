"""`thawpool budgets ls|set|rm`: spend budgets. An operator (admin key, `--tenant`) sets
tenant budgets and any other; a tenant sets budgets on its own keys and deployments.

    thawpool budgets set tenant --tenant acme --limit 500 --period month --soft-fraction 0.8
    thawpool budgets set deployment chat --limit 20 --period day --time-zone Europe/Berlin
    thawpool budgets set key tp_3f2a --limit 5
    thawpool budgets ls [--tenant acme]
    thawpool budgets rm <budget id>
"""
from __future__ import annotations

import argparse
import os
from dataclasses import replace

from controlplane.cli.client import JSON, Client
from controlplane.cli.output import Context, Subcommands, UsageError, add_command


def register(commands: Subcommands, flags: argparse.ArgumentParser) -> None:
    budgets = commands.add_parser("budgets", help="spend budgets: a tenant's, a key's, a deployment's")
    actions = budgets.add_subparsers(dest="action", required=True)
    add_command(actions, flags, "ls", cmd_ls, "budgets with this period's spend").add_argument(
        "--tenant", default=None, help="admin: this tenant's (default: every tenant's)")
    put = add_command(actions, flags, "set", cmd_set, "create or replace a budget", "scope")
    put.add_argument("target", nargs="?", default=None,
                     help="the key (id or prefix) or the deployment (name); none for a tenant budget")
    put.add_argument("--limit", required=True, help="money per period, e.g. 25.00")
    put.add_argument("--period", default="month", choices=("day", "month", "none"))
    put.add_argument("--time-zone", default="UTC", help="IANA name, e.g. Europe/Berlin")
    put.add_argument("--tenant", default=None, help="admin: whose budget")
    soft = put.add_mutually_exclusive_group()
    soft.add_argument("--soft-fraction", default=None, help="alert at this share of the limit, e.g. 0.8")
    soft.add_argument("--soft-amount", default=None, help="alert at this amount spent")
    add_command(actions, flags, "rm", cmd_rm, "delete a budget", "id")


def client_for(ctx: Context) -> Client:
    """The admin key from THAWPOOL_ADMIN_KEY when no --key is given (as `tenants`)."""
    admin_key = os.environ.get("THAWPOOL_ADMIN_KEY")
    if not ctx.args.key and admin_key:
        return replace(ctx, profile=replace(ctx.profile, key=admin_key)).client()
    return ctx.client()


def budget_body(args: argparse.Namespace) -> JSON:
    if args.scope not in ("tenant", "key", "deployment"):
        raise UsageError("budgets set: scope is tenant, key or deployment")
    if (args.scope == "tenant") != (args.target is None):
        raise UsageError("budgets set: a key or deployment budget names its target; a tenant budget none")
    body: JSON = {"scope": args.scope, "limit": args.limit, "period": args.period, "time_zone": args.time_zone}
    if args.target is not None:
        body[args.scope] = args.target
    for name in ("tenant", "soft_fraction", "soft_amount"):
        if getattr(args, name) is not None:
            body[name] = getattr(args, name)
    return body


def cmd_ls(ctx: Context) -> int:
    params = {"tenant": ctx.args.tenant} if ctx.args.tenant else None
    with client_for(ctx) as client:
        listed = list(client.call("GET", "/v1/budgets", params=params)["data"])
    ctx.out.result(listed, lambda: ctx.out.table(
        ["id", "scope", "on", "limit", "period", "spent", "reserved", "remaining", "alerts"],
        [(b["id"], b["scope"], b["scope_id"], b["limit"], b["period"], b["spent"], b["reserved"],
          b["remaining"], ",".join(a["kind"] for a in b["alerts"])) for b in listed]))
    return 0


def cmd_set(ctx: Context) -> int:
    body = budget_body(ctx.args)
    with client_for(ctx) as client:
        budget = dict(client.call("PUT", "/v1/budgets", body=body))
    ctx.out.result(budget, lambda: ctx.out.say(
        f"{budget['scope']} budget {budget['id']}: {budget['limit']} per {budget['period']}, "
        f"{budget['spent']} spent, {budget['remaining']} left"))
    return 0


def cmd_rm(ctx: Context) -> int:
    with client_for(ctx) as client:
        client.call("DELETE", f"/v1/budgets/{ctx.args.id}")
    ctx.out.result({"deleted": ctx.args.id}, lambda: ctx.out.say(f"deleted budget {ctx.args.id}"))
    return 0
