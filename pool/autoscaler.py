"""How many replicas a revision wants: policy(snapshot, state) -> (decision, state).

The snapshot carries the current time, so the policy reads no clock and
calls nothing; tests step fake time through it. Steps:

  1. load      in-flight + queued requests over target_concurrency,
               queued prompt tokens over a per-replica token target, and the
               LoRA adapters in use at once over the adapter slots of a replica
  2. idle      no load and no activity for idle_timeout_s -> zero; no load but
               recent activity keeps one replica
  3. waiting   while requests wait, replicas that are starting are kept
  4. bounds    [min_replicas, max_replicas]
  5. delay     scale up at once; scale down only after the lower number has
               held for scale_down_delay_s (scale to zero is timed by idle)
  6. sleep     with a sleep tier (sleep_timeout_s > 0) replicas scaled down for
               idleness go to sleep instead of stopping, and sleepers that have
               slept sleep_timeout_s are stopped (`expired`)

`desired` counts awake replicas (starting, waking, ready): the manager meets a
higher number by waking sleepers before it starts new replicas.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional


@dataclass(frozen=True)
class ScalingConfig:
    min_replicas: int = 0
    max_replicas: int = 1
    target_concurrency: int = 8
    idle_timeout_s: float = 300.0
    scale_down_delay_s: float = 30.0
    target_queued_prompt_tokens: int = 8192
    sleep_timeout_s: float = 0.0             # 0: no sleep tier, idle replicas stop
    adapter_slots: int = 0                   # a replica's engine max_loras (0: no adapters)


@dataclass(frozen=True)
class ScalingSnapshot:
    now: float
    config: ScalingConfig
    in_flight: tuple[int, ...] = ()          # per ready replica
    queued_requests: int = 0
    queued_prompt_tokens: int = 0
    last_activity_at: Optional[float] = None   # last request arrival or finish
    ready: int = 0
    starting: int = 0                        # pending, pulling, loading, waking
    asleep: tuple[tuple[str, float], ...] = ()   # (replica id, when it fell asleep) per sleeper
    adapters_in_use: int = 0                 # distinct adapters requests hold leases for now

    @property
    def current(self) -> int:
        return self.ready + self.starting


@dataclass(frozen=True)
class PolicyState:
    lower_since: Optional[float] = None      # when a lower desired count first appeared


@dataclass(frozen=True)
class Decision:
    desired: int
    reason: str
    sleep: bool = False                      # replicas scaled down go to sleep, not to zero
    expired: tuple[str, ...] = ()            # sleepers to stop: asleep for sleep_timeout_s


def policy(snap: ScalingSnapshot, state: PolicyState = PolicyState()) -> tuple[Decision, PolicyState]:
    wanted, why = load_target(snap)
    wanted, why = apply_idle(snap, wanted, why)
    wanted = max(wanted, keep_starting(snap))
    wanted = clamp(snap.config, wanted)
    decision, state = apply_delay(snap, state, wanted, why)
    return replace(decision, sleep=sleeps(snap), expired=expired_sleepers(snap)), state


def load_target(snap: ScalingSnapshot) -> tuple[int, str]:
    cfg = snap.config
    load = sum(snap.in_flight) + snap.queued_requests
    by_requests = math.ceil(load / max(1, cfg.target_concurrency))
    by_tokens = 0
    if cfg.target_queued_prompt_tokens > 0:
        by_tokens = math.ceil(snap.queued_prompt_tokens / cfg.target_queued_prompt_tokens)
    # more adapters at once than a replica's slots: requests wait for a slot to free
    by_adapters = math.ceil(snap.adapters_in_use / cfg.adapter_slots) if cfg.adapter_slots else 0
    if by_adapters > max(by_requests, by_tokens):
        return by_adapters, f"{snap.adapters_in_use} adapters in use ({cfg.adapter_slots} slots a replica)"
    if by_tokens > by_requests:
        return by_tokens, f"{snap.queued_prompt_tokens} queued prompt tokens"
    return by_requests, f"{load} requests in flight or queued"


def apply_idle(snap: ScalingSnapshot, wanted: int, why: str) -> tuple[int, str]:
    if wanted > 0:
        return wanted, why
    if is_idle(snap):
        return 0, f"idle for {snap.config.idle_timeout_s:g}s"
    return min(1, snap.current), "no load, not idle yet"


def is_idle(snap: ScalingSnapshot) -> bool:
    if sum(snap.in_flight) or snap.queued_requests:
        return False
    if snap.last_activity_at is None:
        return True
    return snap.now - snap.last_activity_at >= snap.config.idle_timeout_s


def keep_starting(snap: ScalingSnapshot) -> int:
    """A replica that is starting while requests wait for it is never scaled down."""
    return snap.starting if snap.queued_requests else 0


def clamp(cfg: ScalingConfig, wanted: int) -> int:
    return max(cfg.min_replicas, min(cfg.max_replicas, wanted))


def apply_delay(snap: ScalingSnapshot, state: PolicyState, wanted: int, why: str) -> tuple[Decision, PolicyState]:
    current = snap.current
    if wanted >= current:
        return Decision(wanted, why), replace(state, lower_since=None)
    if wanted == 0 and is_idle(snap):
        return Decision(0, why), replace(state, lower_since=None)
    since = snap.now if state.lower_since is None else state.lower_since
    if snap.now - since >= snap.config.scale_down_delay_s:
        return Decision(wanted, why), replace(state, lower_since=None)
    return Decision(current, f"scale-down delay ({why})"), replace(state, lower_since=since)


def sleeps(snap: ScalingSnapshot) -> bool:
    """Replicas scaled down now go to sleep: the revision has a sleep tier and is idle."""
    return snap.config.sleep_timeout_s > 0 and is_idle(snap)


def expired_sleepers(snap: ScalingSnapshot) -> tuple[str, ...]:
    """Sleepers that have slept sleep_timeout_s: stopped for good (all of them once the
    revision has no sleep tier any more)."""
    timeout_s = snap.config.sleep_timeout_s
    return tuple(replica_id for replica_id, since in snap.asleep
                 if timeout_s <= 0 or snap.now - since >= timeout_s)


def victim_rank(unplaced: bool, starting: bool, in_flight: int, created: float) -> tuple[float, ...]:
    """The order replicas go in on a scale-down, lowest first: those not yet placed, then
    those starting (newest first: they have cost the least), then the ready by load."""
    if unplaced:
        return (0, -created)
    if starting:
        return (1, -created)
    return (2, in_flight, -created)
