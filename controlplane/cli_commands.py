"""Every client command of `thawpool`, registered on the parser controlplane.cli builds
(`up`, `admin` and `models import` stay there)."""
from __future__ import annotations


from controlplane import (cli_deploy, cli_invoke, cli_login, cli_models, cli_status,
                          cli_tenants, cli_usage)
from controlplane.cli_output import Subcommands, common_flags


def register_all(commands: Subcommands,
                 model_actions: Subcommands) -> None:
    flags = common_flags()
    cli_login.register(commands, flags)
    cli_models.register(model_actions, flags)
    cli_deploy.register(commands, flags)
    cli_status.register(commands, flags)
    cli_invoke.register(commands, flags)
    cli_usage.register(commands, flags)
    cli_tenants.register(commands, flags)
