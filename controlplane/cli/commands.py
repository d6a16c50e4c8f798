"""Every client command of `thawpool`, registered on the parser controlplane.cli.main builds
(`up`, `admin` and `models import` stay there)."""
from __future__ import annotations

from controlplane.cli import (adapters, budgets, deploy, invoke, login, models, status, tenants, usage,
                              webhooks)
from controlplane.cli.output import Subcommands, common_flags


def register_all(commands: Subcommands,
                 model_actions: Subcommands) -> None:
    flags = common_flags()
    login.register(commands, flags)
    models.register(model_actions, flags)
    deploy.register(commands, flags)
    adapters.register(commands, flags)
    status.register(commands, flags)
    invoke.register(commands, flags)
    usage.register(commands, flags)
    tenants.register(commands, flags)
    budgets.register(commands, flags)
    webhooks.register(commands, flags)
