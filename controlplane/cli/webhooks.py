"""`thawpool webhooks ...`: a tenant's webhook endpoints, or with an admin key any
tenant's (`--tenant`) and the platform's.

    thawpool webhooks create https://hooks.example.com/thawpool --events budget.threshold
    thawpool webhooks ls | get ID | rm ID | test ID | deliveries ID [--limit N]
    thawpool webhooks disable ID | enable ID     (a disabled endpoint's deliveries wait)

`create` prints the endpoint's signing secret, shown this once.
"""
from __future__ import annotations

import argparse
from typing import Any

from controlplane.cli.client import JSON
from controlplane.cli.output import Context, Subcommands, add_command


def register(commands: Subcommands, flags: argparse.ArgumentParser) -> None:
    hooks = commands.add_parser("webhooks", help="webhook endpoints and their deliveries")
    actions = hooks.add_subparsers(dest="action", required=True)
    create = add_command(actions, flags, "create", cmd_create,
                         "register an endpoint (its secret is shown once)")
    # not `url`: that is the common flag's --url (the server's), which would overwrite it
    create.add_argument("endpoint_url", metavar="URL", help="where deliveries are POSTed")
    create.add_argument("--events", default="*",
                        help="comma list of event types (budget.threshold), or * for all")
    create.add_argument("--tenant", default=None,
                        help="admin: this tenant's events (default: every event)")
    create.add_argument("--description", default=None)
    create.add_argument("--disabled", action="store_true", help="registered, not delivered to")
    add_command(actions, flags, "ls", cmd_ls, "list endpoints").add_argument(
        "--tenant", default=None, help="admin: this tenant's only")
    add_command(actions, flags, "get", cmd_get, "one endpoint", "id")
    add_command(actions, flags, "rm", cmd_rm, "delete an endpoint", "id")
    add_command(actions, flags, "enable", cmd_enable, "deliver to it again", "id")
    add_command(actions, flags, "disable", cmd_disable,
                "stop delivering to it (pending deliveries wait)", "id")
    add_command(actions, flags, "test", cmd_test, "send a webhook.test event", "id")
    add_command(actions, flags, "deliveries", cmd_deliveries,
                "an endpoint's latest deliveries and attempts", "id").add_argument(
        "--limit", type=int, default=20)


def cmd_create(ctx: Context) -> int:
    args = ctx.args
    body: JSON = {"url": args.endpoint_url, "event_types": [e for e in args.events.split(",") if e],
                  "enabled": not args.disabled}
    if args.tenant:
        body["tenant"] = args.tenant
    if args.description:
        body["description"] = args.description
    with ctx.client() as client:
        made = client.create_webhook(body)
    ctx.out.result(made, lambda: ctx.out.say(
        f"webhook {made['id']} -> {made['url']}\nsecret: {made['secret']}   "
        f"(shown once: verify each delivery's Thawpool-Signature with it)"))
    return 0


def cmd_ls(ctx: Context) -> int:
    with ctx.client() as client:
        listed = client.webhooks(ctx.args.tenant)
    ctx.out.result(listed, lambda: ctx.out.table(
        ["id", "url", "events", "enabled", "tenant", "created"],
        [_row(e) for e in listed]))
    return 0


def _row(e: dict[str, Any]) -> tuple[str, ...]:
    tenant = e["tenant_id"] or "(every event)"
    return (e["id"], e["url"], ",".join(e["event_types"]), str(e["enabled"]).lower(),
            f"{tenant} (operator)" if e["operator"] else tenant, e["created_at"][:19])


def cmd_get(ctx: Context) -> int:
    with ctx.client() as client:
        endpoint = client.webhook(ctx.args.id)
    ctx.out.result(endpoint, lambda: ctx.out.json(endpoint))
    return 0


def cmd_enable(ctx: Context) -> int:
    return _set_enabled(ctx, True)


def cmd_disable(ctx: Context) -> int:
    return _set_enabled(ctx, False)


def _set_enabled(ctx: Context, enabled: bool) -> int:
    with ctx.client() as client:
        endpoint = client.update_webhook(ctx.args.id, {"enabled": enabled})
    ctx.out.result(endpoint, lambda: ctx.out.say(
        f"{endpoint['id']} {'enabled' if endpoint['enabled'] else 'disabled'}"))
    return 0


def cmd_rm(ctx: Context) -> int:
    with ctx.client() as client:
        client.delete_webhook(ctx.args.id)
    ctx.out.result({"deleted": ctx.args.id}, lambda: ctx.out.say(f"deleted {ctx.args.id}"))
    return 0


def cmd_test(ctx: Context) -> int:
    with ctx.client() as client:
        sent = client.test_webhook(ctx.args.id)
    ctx.out.result(sent, lambda: ctx.out.say(
        f"queued {sent['event_id']} (delivery {sent['delivery_id']}); "
        f"`thawpool webhooks deliveries {ctx.args.id}` shows how it went"))
    return 0


def cmd_deliveries(ctx: Context) -> int:
    with ctx.client() as client:
        listed = client.webhook_deliveries(ctx.args.id, ctx.args.limit)
    ctx.out.result(listed, lambda: ctx.out.table(
        ["delivery", "event", "type", "status", "attempts", "last", "next", "created"],
        [(d["id"], d["event_id"], d["event_type"], d["status"], str(d["attempts"]),
          _last(d), (d["next_attempt_at"] or "")[:19], d["created_at"][:19]) for d in listed]))
    return 0


def _last(d: dict[str, Any]) -> str:
    if d["last_status_code"] is not None:
        return str(d["last_status_code"])
    return (d["last_error"] or "")[:40]
