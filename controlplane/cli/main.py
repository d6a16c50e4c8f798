"""The `thawpool` command's parser: `up` (controlplane/cli/up.py) runs the control plane
and the pool, `admin reconcile` checks the bill, `models import FILE.gguf OUT_DIR` turns
a GGUF file into a model folder, `plan` sizes a pool for a trace by simulation
(controlplane/cli/plan.py). The client commands (login, models push, deploy, adapters,
status, chat, usage, keys, tenants, ...) are registered from controlplane.cli.commands;
docs/cli.md describes them.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from typing import Optional, Sequence

from controlplane.cli.plan import add_plan
from controlplane.cli.up import add_up

GGUF_IMPORTER = "runtime.gguf.importer"     # run as a module, never imported here


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="thawpool", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    add_up(commands)
    add_plan(commands)

    admin = commands.add_parser("admin", help="the operator's commands on the database itself")
    actions = admin.add_subparsers(dest="action", required=True)
    from controlplane.billing import reconcile      # reads Postgres itself: works with the server down

    drift = actions.add_parser("reconcile", help="replicas' own token counters against the bill")
    reconcile.add_arguments(drift)
    drift.set_defaults(func=reconcile.run)

    models = commands.add_parser("models", help="models: push, ls, rm, import")
    model_actions = models.add_subparsers(dest="action", required=True)
    gguf = model_actions.add_parser("import", help="a GGUF file into a model folder")
    gguf.add_argument("gguf", help="the .gguf file")
    gguf.add_argument("out_dir", help="the model folder to write (created)")
    gguf.add_argument("--dtype", default=None, help="of the weights written (default float32; "
                                                    f"python -m {GGUF_IMPORTER} --help lists the others)")
    gguf.set_defaults(func=cmd_import_gguf)

    from controlplane.cli.commands import register_all      # login, models push, deploy, ...

    register_all(commands, model_actions)
    return parser


def cmd_import_gguf(args: argparse.Namespace) -> int:
    """The runtime's importer in a process of its own, as the pool runs it on a node
    (pool/weights/gguf.py): the control plane imports no runtime module, and the importer
    checks its own arguments."""
    dtype = ["--dtype", args.dtype] if args.dtype else []
    command = [sys.executable, "-m", GGUF_IMPORTER, args.gguf, args.out_dir, *dtype]
    return subprocess.run(command).returncode


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
