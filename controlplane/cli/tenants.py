"""`thawpool tenants ...` and `thawpool keys ...`: the operator's commands (admin key);
`keys ls` without `--tenant` and `keys revoke` also serve a tenant's own keys.

The admin key comes from `--key`, else `THAWPOOL_ADMIN_KEY`, else the profile's key,
so an operator either logs in with a profile of their own or keeps the key in the
environment.
"""
from __future__ import annotations

import argparse
import os
from dataclasses import replace
from typing import Any

from controlplane.cli.client import JSON, Client
from controlplane.cli.output import add_command, Context, Subcommands, UsageError, command, parse_pairs

QUOTA_LIMITS = ("max_gpus", "max_replicas_per_deployment", "max_deployments",
                "max_queued_requests", "max_upload_bytes", "requests_per_min", "tokens_per_min")


def register(commands: Subcommands, flags: argparse.ArgumentParser) -> None:
    tenants = commands.add_parser("tenants", help="tenants (admin)")
    actions = tenants.add_subparsers(dest="action", required=True)
    add_command(actions, flags, "create", cmd_tenant_create, "create a tenant", "name")
    add_command(actions, flags, "ls", cmd_tenant_ls, "list tenants")
    quota = add_command(actions, flags, "quota", cmd_tenant_quota, "show or set a tenant's quota",
                        "name")
    quota.add_argument("set", nargs="*", metavar="LIMIT=N|none",
                       help=f"limits to override: {', '.join(QUOTA_LIMITS)}")
    _register_keys(commands, flags)


def _register_keys(commands: Subcommands, flags: argparse.ArgumentParser) -> None:
    keys = commands.add_parser("keys", help="API keys: a tenant's (admin) or your own")
    actions = keys.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", parents=[flags], help="a new key (shown once)")
    create.add_argument("--tenant", required=True)
    create.add_argument("--scopes", default="invoke", help="comma list: invoke,deploy,billing:read")
    create.add_argument("--name", default=None)
    create.add_argument("--expires", default=None, help="ISO 8601 expiry time")
    create.add_argument("--requests-per-min", type=int, default=None)
    create.add_argument("--tokens-per-min", type=int, default=None)
    create.add_argument("--priority-min", type=int, default=None,
                        help="the most urgent priority its calls may ask for (lower runs first; default 0)")
    create.add_argument("--priority-max", type=int, default=None,
                        help="the least urgent priority its calls may ask for (default: any)")
    create.add_argument("--priority-default", type=int, default=None,
                        help="the priority of a call that names none (default 0)")
    create.set_defaults(func=command(cmd_key_create))
    add_command(actions, flags, "ls", cmd_key_ls, "keys (never their secrets)").add_argument(
        "--tenant", default=None, help="admin: this tenant's (default: your own tenant's)")
    add_command(actions, flags, "revoke", cmd_key_revoke, "revoke a key by its prefix", "prefix")


def admin_client(ctx: Context) -> Client:
    admin_key = os.environ.get("THAWPOOL_ADMIN_KEY")
    if not ctx.args.key and admin_key:
        return replace(ctx, profile=replace(ctx.profile, key=admin_key)).client()
    return ctx.client()


def cmd_tenant_create(ctx: Context) -> int:
    with admin_client(ctx) as client:
        tenant = client.create_tenant(ctx.args.name)
    ctx.out.result(tenant, lambda: ctx.out.say(f"created tenant {tenant['name']} ({tenant['id']})"))
    return 0


def cmd_tenant_ls(ctx: Context) -> int:
    with admin_client(ctx) as client:
        listed = client.tenants()
    ctx.out.result(listed, lambda: ctx.out.table(
        ["name", "id", "created"], [(t["name"], t["id"], t["created_at"][:19]) for t in listed]))
    return 0


def cmd_tenant_quota(ctx: Context) -> int:
    changes = {name: _limit(name, value) for name, value in parse_pairs(ctx.args.set, "quota").items()}
    with admin_client(ctx) as client:
        quota = (client.set_tenant_quota(ctx.args.name, changes) if changes
                 else client.tenant_quota(ctx.args.name))
    ctx.out.result(quota, lambda: ctx.out.json(quota))
    return 0


def _limit(name: str, value: str) -> Any:
    if name not in QUOTA_LIMITS:
        raise UsageError(f"quota: {name} is not a limit ({', '.join(QUOTA_LIMITS)})")
    if value.lower() == "none":
        return None
    try:
        return int(value)
    except ValueError:
        raise UsageError(f"quota: {name} takes a whole number or none") from None


def cmd_key_create(ctx: Context) -> int:
    args = ctx.args
    body: JSON = {"scopes": [s for s in args.scopes.split(",") if s], "name": args.name,
                  "expires_at": args.expires, "requests_per_min": args.requests_per_min,
                  "tokens_per_min": args.tokens_per_min, "priority_min": args.priority_min,
                  "priority_max": args.priority_max, "priority_default": args.priority_default}
    with admin_client(ctx) as client:
        key = client.create_key(args.tenant, {k: v for k, v in body.items() if v is not None})
    ctx.out.result(key, lambda: ctx.out.say(
        f"key: {key['key']}   (shown once; prefix {key['prefix']}, scopes "
        f"{','.join(key['scopes'])})"))
    return 0


def cmd_key_ls(ctx: Context) -> int:
    with admin_client(ctx) as client:
        listed = client.keys(ctx.args.tenant)
    ctx.out.result(listed, lambda: ctx.out.table(
        ["prefix", "name", "scopes", "expires", "revoked", "created"],
        [(k["prefix"], k["name"], ",".join(k["scopes"]), k["expires_at"], k["revoked_at"],
          k["created_at"][:19]) for k in listed]))
    return 0


def cmd_key_revoke(ctx: Context) -> int:
    with admin_client(ctx) as client:
        key = client.revoke_key(ctx.args.prefix)
    ctx.out.result(key, lambda: ctx.out.say(f"revoked {key['prefix']} at {key['revoked_at']}"))
    return 0
