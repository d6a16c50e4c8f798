"""A call's first answer, from the deployment it named or from one of that deployment's
fallbacks (controlplane.deploy.fallback_spec), as controlplane.gateway.fallback_policy
decides: the acquire and send steps of `routes/gateway.invoke`, repeated per attempt.

A call moves on only before any byte reached the client: when its deployment stayed
cold past the wait, the pool refused it with a 429, its cold start failed, its replica
could not be reached, or the replica's answer began with a 5xx. A streamed answer that
breaks later is the stream's to report, as without fallbacks.

The call holds one rate-limit reservation throughout (the key's and tenant's, made at
admission for the deployment it named): attempts hold none of their own, the one that
answers is given it, and it is given back when none answers. Only the deployment that
answered bills the call, at its own price; an attempt whose replica answered 5xx leaves
an `error` row that bills nothing. Calls on an adapter or on another tenant's shared base
take no fallbacks: the list is the owner's, of the owner's deployments.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

from controlplane.budgets.ledger import Hold
from controlplane.deploy.fallback_spec import Condition, Fallback
from controlplane.errors import ApiError
from controlplane.gateway.fallback_policy import (PRIMARY, answer_condition, next_attempt,
                                                  pool_condition, replica_wait_s)
from controlplane.gateway.llm import Gateway, Invocation, ReplicaCall, ReplicaUnreachable, RouteTarget
from controlplane.gateway.ratelimit import RateReservation
from controlplane.gateway.upstream import UpstreamResponse
from controlplane.store import deployments
from controlplane.store.errors import NotFound
from controlplane.store.tenants import Principal
from pool.api import PoolError
from wire.errors import ProtocolError
from wire.priority import INTERACTIVE_PRIORITY


@dataclass(frozen=True)
class ClientRequest:
    """One request as the gateway steps see it, the same for every attempt: `body` is what
    the replica is sent, `validate` checks it against each deployment tried, `endpoint`
    names the usage row and `replica_endpoint` the replica's path when that differs (a
    Responses API call is served as a chat completion)."""
    principal: Principal
    body: dict[str, Any]
    request_id: str
    endpoint: str
    log_fields: dict[str, Any]
    validate: Callable[[RouteTarget], Invocation]
    replica_endpoint: Optional[str] = None
    priority: int = INTERACTIVE_PRIORITY      # the same for every attempt: the key's, resolved once


@dataclass(frozen=True)
class Answer:
    """The attempt that answered: its call (holding the reservation), the replica's
    response, still streaming, and the request as validated for its deployment."""
    call: ReplicaCall
    upstream: UpstreamResponse
    invocation: Invocation


@dataclass(frozen=True)
class Attempt:
    number: int                 # 0: the deployment the call named; k: fallbacks[k - 1]
    target: RouteTarget
    invocation: Invocation
    reason: Optional[Condition] = None     # why the call came to it


@dataclass(frozen=True)
class Failed:
    """An attempt that failed with a condition some later fallback lists, and the refusal
    the client gets if none of them takes the call."""
    condition: Condition
    refusal: Exception


async def first_answer(gateway: Gateway, client: ClientRequest, primary: RouteTarget,
                       invocation: Invocation, admission: RateReservation, hold: Hold) -> Answer:
    """The first attempt that answers; the last failure's refusal when none does (the rate
    reservation and the budgets' hold given back). Every attempt carries the hold's
    invocation id; one that fails takes another for its own row (Gateway.give_back_id), so
    the row of the one that answers settles the hold."""
    fallbacks = fallbacks_for(primary)
    attempt = Attempt(PRIMARY, primary, invocation)
    try:
        while True:
            result = await _try(gateway, client, fallbacks, attempt, hold)
            if isinstance(result, Answer):
                result.call.admission = admission      # the one that answers settles it
                return result
            following = await _next(gateway, client, fallbacks, attempt.number, result.condition)
            if following is None:
                raise result.refusal
            attempt = following
    except BaseException:
        gateway.limiter.settle(admission, 0, gateway.clock())
        await gateway.release_budgets(hold)
        raise


async def _try(gateway: Gateway, client: ClientRequest, fallbacks: tuple[Fallback, ...],
               attempt: Attempt, hold: Hold) -> Union[Answer, Failed]:
    """One attempt, holding no reservation of its own. A failure that no later fallback
    lists is raised as it is; a 5xx no fallback lists is the Answer (relayed as a 502)."""
    target = attempt.target
    wait_s = replica_wait_s(fallbacks, attempt.number, gateway.ready(target),
                            gateway.settings.acquire_timeout_s)
    try:
        replica = await gateway.acquire(client.principal, target, attempt.invocation, client.request_id,
                                        client.endpoint, RateReservation(), client.log_fields,
                                        replica_endpoint=client.replica_endpoint, timeout_s=wait_s,
                                        priority=client.priority, invocation_id=hold.invocation_id)
        replica.fallback_reason = attempt.reason
        upstream = await gateway.send(replica, client.body)
    except PoolError as refusal:
        return _failed(fallbacks, attempt, pool_condition(refusal), refusal)
    except ReplicaUnreachable as refusal:
        return _failed(fallbacks, attempt, "error", refusal)
    condition = answer_condition(upstream.status_code)
    if condition is None or next_attempt(fallbacks, attempt.number, condition) is None:
        return Answer(replica, upstream, attempt.invocation)
    await gateway.drop(replica, upstream)
    return Failed(condition, ApiError(502, f"the replica failed ({upstream.status_code})",
                                      code="upstream_error"))


def _failed(fallbacks: tuple[Fallback, ...], attempt: Attempt, condition: Optional[Condition],
            refusal: Exception) -> Failed:
    if condition is None or next_attempt(fallbacks, attempt.number, condition) is None:
        raise refusal
    return Failed(condition, refusal)


async def _next(gateway: Gateway, client: ClientRequest, fallbacks: tuple[Fallback, ...], after: int,
                condition: Condition) -> Optional[Attempt]:
    """The next fallback listing `condition` that can take the call: one deleted since,
    no longer a model, or refusing the request (its vocabulary, its context) is passed over."""
    number = next_attempt(fallbacks, after, condition)
    while number is not None:
        try:
            target = await gateway.target(client.principal, fallbacks[number - 1].deployment,
                                          client.request_id)
            if deployments.kind_of(target.revision) == "model":
                return Attempt(number, target, client.validate(target),
                               condition)
        except (NotFound, ProtocolError, ApiError):
            pass
        number = next_attempt(fallbacks, number, condition)
    return None


def fallbacks_for(target: RouteTarget) -> tuple[Fallback, ...]:
    """The named deployment's fallbacks, where the caller owns it and calls it bare."""
    if target.adapter is not None or target.owner_quota is not None:
        return ()
    return deployments.fallbacks_of(target.deployment)
