"""`thawpool usage`: the billing report as a table with totals (or CSV, or JSON); with
`--margin`, the operator's margin report (admin key: revenue against the platform's GPU
cost, with what drives it; docs/margin.md)."""
from __future__ import annotations

import argparse
import sys
from typing import Any

from controlplane.cli.output import Context, Subcommands, UsageError, command
from controlplane.cli.tenants import admin_client

GROUPS = ("day", "deployment", "model", "api_key", "revision", "adapter")  # the API's group_by
MARGIN_GROUPS = ("deployment", "tenant")                                  # the margin's
# "fn GPU s": function calls' share of their batches' compute (reported, not billed);
# "GPU s": the replicas' held GPU time, billed as "GPU cost"
SHOWN = (("requests", "requests"), ("prompt_tokens", "prompt"), ("cached_tokens", "cached"),
         ("completion_tokens", "completion"), ("items", "items"),
         ("function_gpu_seconds", "fn GPU s"), ("token_cost", "token cost"),
         ("gpu_seconds", "GPU s"), ("gpu_cost", "GPU cost"), ("cost", "cost"))
# the margin's columns: money and GPU time, then the drivers of the cost per 1k tokens
MARGIN_SHOWN = (("revenue", "revenue"), ("gpu_cost", "GPU cost"), ("margin", "margin"),
                ("margin_pct", "margin %"), ("gpu_seconds", "GPU s"),
                ("idle_gpu_seconds", "idle GPU s"), ("tokens", "tokens"),
                ("cost_per_1k_tokens", "cost/1k tok"), ("cache_hit_rate", "cache hit"),
                ("mean_batch_size", "batch"), ("quantization", "quant"),
                ("sleep_share", "sleep share"))


def register(commands: Subcommands, flags: argparse.ArgumentParser) -> None:
    usage = commands.add_parser("usage", parents=[flags],
                                help="usage and cost over [--from, --to), grouped")
    usage.add_argument("--from", dest="start", default=None,
                       help="ISO date or time, inclusive (default 30 days before --to)")
    usage.add_argument("--to", dest="end", default=None, help="ISO date or time, exclusive")
    usage.add_argument("--group-by", choices=sorted({*GROUPS, *MARGIN_GROUPS}), default=None,
                       help="default: day (with --margin: deployment; it takes deployment "
                            "or tenant)")
    usage.add_argument("--csv", action="store_true", help="the report's CSV, with a TOTAL line")
    usage.add_argument("--tenant", default=None, help="admin keys: another tenant's report")
    usage.add_argument("--margin", action="store_true",
                       help="admin: every tenant's revenue, GPU cost and margin, and what "
                            "drives the cost (THAWPOOL_ADMIN_KEY or --key)")
    usage.set_defaults(func=command(cmd_usage))


def cmd_usage(ctx: Context) -> int:
    return _margin(ctx) if ctx.args.margin else _report(ctx)


def _report(ctx: Context) -> int:
    args = ctx.args
    group_by = _group(args.group_by, GROUPS, "day")
    params = {k: v for k, v in (("from", args.start), ("to", args.end),
                                ("group_by", group_by), ("tenant", args.tenant)) if v}
    with ctx.client() as client:
        if args.csv:
            sys.stdout.write(client.report({**params, "format": "csv"}))
            return 0
        report = client.report(params)
    _show(ctx, report, group_by, SHOWN, "usage")
    return 0


def _margin(ctx: Context) -> int:
    args = ctx.args
    if args.tenant:
        raise UsageError("--margin covers every tenant; --tenant is for the billing report")
    group_by = _group(args.group_by, MARGIN_GROUPS, "deployment")
    params = {k: v for k, v in (("from", args.start), ("to", args.end),
                                ("group_by", group_by)) if v}
    with admin_client(ctx) as client:
        if args.csv:
            sys.stdout.write(client.margin({**params, "format": "csv"}))
            return 0
        report = client.margin(params)
    _show(ctx, report, group_by, MARGIN_SHOWN, "margin")
    return 0


def _show(ctx: Context, report: dict[str, Any], group_by: str,
          shown: tuple[tuple[str, str], ...], what: str) -> None:
    """A report's rows and its TOTAL, the columns `shown` (field, title)."""
    ctx.out.result(report, lambda: ctx.out.table(
        [group_by, *(title for _, title in shown)],
        [*([row["key"], *(_cell(row[c]) for c, _ in shown)] for row in report["rows"]),
         ["TOTAL", *(_cell(report["totals"][c]) for c, _ in shown)]],
        title=f"{what} by {group_by}"))


def _group(chosen: str | None, groups: tuple[str, ...], default: str) -> str:
    if chosen is None:
        return default
    if chosen not in groups:
        raise UsageError(f"--group-by {chosen}: here one of {', '.join(groups)}")
    return chosen


def _cell(value: Any) -> Any:
    """A list (quantizations) joined with '+', as in the CSV; no ratio (no base) is '-'."""
    if isinstance(value, list):
        return "+".join(value)
    return "-" if value is None else value
