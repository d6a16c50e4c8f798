"""`thawpool usage`: the billing report as a table with totals (or CSV, or JSON)."""
from __future__ import annotations

import argparse
import sys

from controlplane.cli.output import Context, Subcommands, command

GROUPS = ("day", "deployment", "model", "api_key", "revision", "adapter")  # the API's group_by
# "fn GPU s": function calls' share of their batches' compute (reported, not billed);
# "GPU s": the replicas' held GPU time, billed as "GPU cost"
SHOWN = (("requests", "requests"), ("prompt_tokens", "prompt"), ("cached_tokens", "cached"),
         ("completion_tokens", "completion"), ("items", "items"),
         ("function_gpu_seconds", "fn GPU s"), ("token_cost", "token cost"),
         ("gpu_seconds", "GPU s"), ("gpu_cost", "GPU cost"), ("cost", "cost"))


def register(commands: Subcommands, flags: argparse.ArgumentParser) -> None:
    usage = commands.add_parser("usage", parents=[flags],
                                help="usage and cost over [--from, --to), grouped")
    usage.add_argument("--from", dest="start", default=None,
                       help="ISO date or time, inclusive (default 30 days before --to)")
    usage.add_argument("--to", dest="end", default=None, help="ISO date or time, exclusive")
    usage.add_argument("--group-by", choices=GROUPS, default="day")
    usage.add_argument("--csv", action="store_true", help="the report's CSV, with a TOTAL line")
    usage.add_argument("--tenant", default=None, help="admin keys: another tenant's report")
    usage.set_defaults(func=command(cmd_usage))


def cmd_usage(ctx: Context) -> int:
    args = ctx.args
    params = {k: v for k, v in (("from", args.start), ("to", args.end),
                                ("group_by", args.group_by), ("tenant", args.tenant)) if v}
    with ctx.client() as client:
        if args.csv:
            sys.stdout.write(client.report({**params, "format": "csv"}))
            return 0
        report = client.report(params)
    ctx.out.result(report, lambda: ctx.out.table(
        [args.group_by, *(title for _, title in SHOWN)],
        [*([row["key"], *(row[c] for c, _ in SHOWN)] for row in report["rows"]),
         ["TOTAL", *(report["totals"][c] for c, _ in SHOWN)]],
        title=f"usage by {args.group_by}"))
    return 0
