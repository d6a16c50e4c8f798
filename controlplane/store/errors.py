"""What the control plane refuses, in its own words: no HTTP here.

The data layer and the validation of bodies, model sources, quotas and traffic
splits raise these; `controlplane.errors.api_error_for` maps each to a status
(NotFound 404, AlreadyExists 409, Conflict 409, InvalidField 422, QuotaExceeded
422, Forbidden 403, Unavailable and DatabaseUnavailable 503) in one place.
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


class Conflict(DomainError):
    """The resource is in a state that refuses the change (`code` says which)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


class InvalidField(DomainError):
    """A value refused by name: `scaling.min_replicas: must not exceed ...`."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class StaticQuotaExceeded(DomainError):
    """A request beyond one of the tenant's static limits, named: `max_deployments: ...`."""

    def __init__(self, limit: str, message: str):
        super().__init__(f"{limit}: {message}")
        self.limit = limit


class Forbidden(DomainError):
    """A field the caller may not set or a source it may not read (`code` says which);
    the message never depends on anything the caller may not see."""

    def __init__(self, field: str, message: str, code: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.code = code


class Unavailable(DomainError):
    """A service the control plane needs (object storage) did not answer; retry later."""


class DatabaseUnavailable(Unavailable):
    """Postgres did not answer, and memory does not hold the answer (an unknown key, a
    deploy, a report); retry later."""
