"""How many replicas a revision wants: policy(snapshot, state) -> (decision, state).

The snapshot carries the current time, so the policy reads no clock and
calls nothing; tests step fake time through it. Steps:

  1. load      in-flight + queued requests over target_concurrency,
               queued prompt tokens over a per-replica token target, and the
               LoRA adapters in use at once over the adapter slots of a replica
  2. idle      no load and no activity for idle_timeout_s -> zero; no load but
               recent activity keeps one replica. With a window learned from the
               revision's own idle times (pool/keep_alive.py) instead: none before
               the window's pre-warm, one (started ahead of the likely call) until
               its end, none after
  3. waiting   while requests wait, replicas that are starting are kept
  4. bounds    [min_replicas, max_replicas]
  5. delay     scale up at once; scale down only after the lower number has
               held for scale_down_delay_s (scale to zero is timed by idle)
  6. sleep     with a sleep tier (sleep_timeout_s > 0) replicas scaled down for
               idleness go to sleep instead of stopping (with a learned window:
               only ahead of it, not past it), and sleepers that have
               slept sleep_timeout_s are stopped (`expired`), or once the learned
               window has passed

`next_change_at` is when the answer could change with nothing happening (an idle
timeout, a window's edge, the scale-down delay, a sleeper's timeout): a caller that
reconciles on events needs to come back then, and no sooner.

`desired` counts awake replicas (starting, waking, ready): the manager meets a
higher number by waking sleepers before it starts new replicas.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional

from pool.keep_alive import IdleWindow, next_edge, wants_replica


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
    idle_window: Optional[IdleWindow] = None     # learned from its idle times; None: idle_timeout_s

    @property
    def idle_for(self) -> Optional[float]:
        return None if self.last_activity_at is None else self.now - self.last_activity_at

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
    if snap.idle_window is not None and not has_load(snap):
        if is_idle(snap):
            return 0, "outside its learned keep-alive window"
        return 1, "within its learned keep-alive window"
    if is_idle(snap):
        return 0, f"idle for {snap.config.idle_timeout_s:g}s"
    return min(1, snap.current), "no load, not idle yet"


def has_load(snap: ScalingSnapshot) -> bool:
    return bool(sum(snap.in_flight) or snap.queued_requests)


def is_idle(snap: ScalingSnapshot) -> bool:
    if has_load(snap):
        return False
    idle_for = snap.idle_for
    if idle_for is None:
        return True
    if snap.idle_window is not None:
        return not wants_replica(snap.idle_window, idle_for)
    return idle_for >= snap.config.idle_timeout_s


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
    """Replicas scaled down now go to sleep: the revision has a sleep tier and is idle. With
    a learned window, sleep only ahead of it (the likely call wakes the sleeper); scaled
    down past the window, the next call is unlikely soon and the replica stops: a sleeper
    would only hold host memory another revision's sleeper could use."""
    if snap.config.sleep_timeout_s <= 0 or not is_idle(snap):
        return False
    window, idle_for = snap.idle_window, snap.idle_for
    return window is None or idle_for is None or idle_for < window.until_s


def expired_sleepers(snap: ScalingSnapshot) -> tuple[str, ...]:
    """Sleepers that have slept sleep_timeout_s, or outlived the learned window: stopped
    for good (all of them once the revision has no sleep tier any more)."""
    timeout_s = snap.config.sleep_timeout_s
    window, idle_for = snap.idle_window, snap.idle_for
    past_window = window is not None and idle_for is not None and idle_for >= window.until_s \
        and not has_load(snap)
    return tuple(replica_id for replica_id, since in snap.asleep
                 if timeout_s <= 0 or past_window or snap.now - since >= timeout_s)


def next_change_at(snap: ScalingSnapshot, state: PolicyState) -> Optional[float]:
    """The earliest time after `now` at which `policy` could answer otherwise for the same
    snapshot with only the clock moved; None: not before something happens."""
    times = [since + snap.config.sleep_timeout_s for _, since in snap.asleep if snap.config.sleep_timeout_s > 0]
    if state.lower_since is not None:
        times.append(state.lower_since + snap.config.scale_down_delay_s)
    idle_for = snap.idle_for
    if idle_for is not None and snap.last_activity_at is not None and not has_load(snap):
        if snap.idle_window is not None:
            edge = next_edge(snap.idle_window, idle_for)
            if edge is not None:
                times.append(snap.last_activity_at + edge)
        elif snap.current:
            times.append(snap.last_activity_at + snap.config.idle_timeout_s)
    future = [t for t in times if t > snap.now]
    return min(future) if future else None


def victim_rank(unplaced: bool, starting: bool, in_flight: int, created: float) -> tuple[float, ...]:
    """The order replicas go in on a scale-down, lowest first: those not yet placed, then
    those starting (newest first: they have cost the least), then the ready by load."""
    if unplaced:
        return (0, -created)
    if starting:
        return (1, -created)
    return (2, in_flight, -created)
