"""What a call's OpenAI `model` names: a deployment, or an adapter on its base.

`base:adapter` names the caller's adapter on the deployment `base` (the caller's own,
or a shared catalogue base); a bare name is the caller's deployment, else the caller's
adapter of that name (on whichever base it is attached to), else a shared deployment.
An adapter is only ever the caller's: another tenant's is not found, whatever base
both share (controlplane.lookups.service.Lookups.model reads them).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from controlplane.store.tables import Adapter, Deployment, Revision


@dataclass(frozen=True)
class ModelName:
    base: str
    adapter: Optional[str] = None     # given as `base:adapter`

    @classmethod
    def parse(cls, name: str) -> "ModelName":
        base, sep, adapter = name.partition(":")
        return cls(base, adapter) if sep else cls(name)


@dataclass(frozen=True)
class Resolved:
    deployment: Deployment
    revisions: list[Revision]
    adapter: Optional[Adapter] = None

    def visible_to(self, tenant_id: str) -> bool:
        """The caller's own base, or a shared one; an adapter only its owner's and on this base."""
        base_ok = self.deployment.tenant_id == tenant_id or self.deployment.shared
        adapter_ok = self.adapter is None or (self.adapter.tenant_id == tenant_id and
                                              self.adapter.deployment_id == self.deployment.id)
        return base_ok and adapter_ok
