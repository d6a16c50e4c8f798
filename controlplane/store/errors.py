"""What the control plane refuses, in its own words: no HTTP here.

The data layer and the validation of deployment bodies and traffic splits raise
these; `controlplane.errors.api_error_for` maps each to a status (NotFound 404,
AlreadyExists 409, InvalidField 422) in one place.
"""
from __future__ import annotations


class DomainError(Exception):
    """Base of the refusals below."""


class NotFound(DomainError):
    """`kind` names what was looked for: "tenant", "key", "deployment"."""

    def __init__(self, kind: str, name: str):
        super().__init__(f"{kind} {name!r} not found")
        self.kind = kind
        self.name = name


class AlreadyExists(DomainError):
    def __init__(self, kind: str, name: str):
        super().__init__(f"{kind} {name!r} already exists")
        self.kind = kind
        self.name = name


class InvalidField(DomainError):
    """A value refused by name: `scaling.min_replicas: must not exceed ...`."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
