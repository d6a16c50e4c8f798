"""The pool over a simulated clock: the pool's own decisions, replicas as formulas.

What decides is the pool's code, called as pool/manager.py calls it:
pool.autoscaler.policy (how many replicas a deployment wants), pool.admission.admit
with pool.placement.place (which waiting replica gets which slots, fair across
tenants, preferring nodes that cache its weights), pool.router.choose (which ready
replica takes a request) and pool.sleep_budget.make_room (which sleepers stop to make
room for a new one). What this module adds is the wiring the manager does with I/O:
a replica's states (pending, starting, ready, draining, asleep, waking, stopped),
the activator's queue, and the timers that stand for a cold start, a wake and a
request's decode (poolsim/replica_model.py).

The manager re-runs the autoscaler every tick (0.5 s) for every revision. Here a
deployment is reconciled on the next tick after anything happened to it (an arrival
queued, a request finished, a replica became ready) and at the next tick after the
deadlines that can change the autoscaler's answer with no event (the idle timeout,
the scale-down delay, a sleeper's timeout): the policy is a pure function of its
snapshot, so the ticks in between would decide the same.

A request's decode runs at the batch its replica has when it starts, on a GPU that
runs its busy replicas' steps in turn (the step takes as many times longer as there
are busy replicas on the slot); prefill goes first, at the same share. On CPU slots
(`Throughput.node_cores`) the share is the node's busy replicas over its cores. With
`Throughput.prefill_step_tokens` a replica prefills the prompts that reach it in steps,
as its engine schedules them: in arrival order up to that many tokens a step, one step
after another, so a prompt that arrives during a step waits for it, and a burst's first
tokens come together; without it (the GPU kinds) each prompt is prefilled at once,
apart from the others.
"""
from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Iterator, Optional

from pool.admission import Pending, admit
from pool.autoscaler import PolicyState, ScalingConfig, ScalingSnapshot, next_change_at, policy, victim_rank
from pool.keep_alive import IdleHistogram, learn
from pool.weights.prefetch import predicted_due
from pool.placement import Placed, PlacementRequest, never_fits, place
from pool.router import Candidate, choose
from pool.sleep_budget import Sleeper, make_room
from poolsim.cluster import Cluster, ClusterShape
from poolsim.events import EventLoop, Timer
from poolsim.outcome import DeploymentStats, Outcome, Tally, finish
from poolsim.policies import PoolPolicy
from poolsim.replica_model import GpuKind
from poolsim.workload import Deployment, Request, Trace

PENDING, STARTING, READY, DRAINING = "pending", "starting", "ready", "draining"
LOAD_WINDOW_S = 300.0                  # how far back a deployment's work predicts its load
ASLEEP, WAKING, STOPPED = "asleep", "waking", "stopped"


class NeverFitsPool(ValueError):
    """A deployment whose replica no node of the pool could hold, even empty."""


@dataclass(frozen=True)
class SimSettings:
    tick_s: float = 0.5                    # pool.settings.PoolSettings.tick_s
    queue_limit: int = 64                  # requests waiting per deployment (PoolSettings.queue_limit)
    wait_timeout_s: float = 600.0          # a client gives up after this (the openai client's default)
    kv_cache_tokens: int = 32768           # each replica's KV cache
    memory_overhead_fraction: float = 0.10
    target_queued_prompt_tokens: int = 8192
    # The pool has run before (or prefetched on deploy, pool/weights/prefetch.py): each
    # deployment's weights start in one node's cache, round robin, as the budget allows.
    # Off, the day starts from empty caches and every deployment's first start is from S3.
    warm_caches: bool = True
    prefetch_lead_s: float = 60.0          # PoolSettings.prefetch_lead_s: weights pulled this long before a window


def kv_bytes_per_token(parameters_b: float) -> float:
    """About 12 KB for 0.5B, 113 KB for 8B (GQA), 335 KB for 70B: bf16 K and V over the
    layers; a fit to Qwen2-0.5B, Llama-3-8B and Llama-3-70B's configs."""
    return 40_000.0 * math.sqrt(parameters_b)


WARMABLE_B = 8.0                       # models under this many billion parameters...
WARM_TARGET_S = 2.0                    # ...answer within this; larger ones within their floor + 1 s


def ttft_target(dep: Deployment, kind: GpuKind) -> float:
    """Issue 34's SLO: 2 s for models under 8B; for larger ones, their cold-start floor
    (the weights from host memory to the device, the fastest start there is) plus 1 s."""
    model = dep.model
    if model.parameters_b < WARMABLE_B:
        return WARM_TARGET_S
    return kind.cold_starts.wake.seconds(model.weight_bytes / model.gpu_count) + 1.0


def size_class(dep: Deployment) -> str:
    b = dep.model.parameters_b
    return "small (<4B)" if b < 4 else "medium (4-20B)" if b <= 20 else "large (>20B)"


@dataclass(eq=False)
class Waiting:
    """A request in its deployment's queue (the activator's), and when its client gives up."""
    req: Request
    timeout: Optional[Timer] = None


@dataclass(eq=False)
class Prompt:
    """A request at its replica (Throughput.prefill_step_tokens) with `left` prompt tokens
    still to prefill."""
    req: Request
    tier: str
    left: int


@dataclass(eq=False)
class Replica:
    rid: str
    dep: "DeploymentState"
    created: float
    state: str = PENDING
    placed: Optional[Placed] = None
    placed_at: float = 0.0
    in_flight: int = 0
    running: int = 0
    backlog: deque[tuple[Request, str]] = field(default_factory=deque)   # past max_batch: (request, tier)
    prefills: deque[Prompt] = field(default_factory=deque)    # at the replica, in arrival order
    prefilling: bool = False
    timer: Optional[Timer] = None
    tier: str = "s3"
    to_sleep: bool = False
    asleep: Optional[tuple[Placed, float]] = None      # its slots, and since when
    load: float = 0.0                                   # expected share of each GPU, told placement
    node: Optional[str] = None
    busy_since: float = 0.0
    cache_user: bool = False                          # counted as a user of its node's cached weights


@dataclass(eq=False)
class DeploymentState:
    dep: Deployment
    config: ScalingConfig
    bytes_per_slot: int
    size_class: str
    slo_s: float                       # its TTFT target (ttft_target)
    replicas: list[Replica] = field(default_factory=list)
    queue: deque[Waiting] = field(default_factory=deque)
    policy_state: PolicyState = PolicyState()
    last_activity: Optional[float] = None
    timer: Optional[Timer] = None
    in_flight: int = 0
    idle_times: IdleHistogram = field(default_factory=IdleHistogram)
    work_rate: float = 0.0            # GPU-seconds of work a second, decayed over LOAD_WINDOW_S
    work_at: float = 0.0
    prefetched_spell: Optional[float] = None    # the idle spell a predicted prefetch was made for
    stats: DeploymentStats = field(default_factory=DeploymentStats)

    def in_state(self, *states: str) -> list[Replica]:
        return [r for r in self.replicas if r.state in states]


class Simulation:
    def __init__(self, trace: Trace, cluster: ClusterShape, pool_policy: PoolPolicy,
                 settings: SimSettings = SimSettings()):
        self.trace = trace
        self.shape = cluster
        self.policy = pool_policy
        self.settings = settings
        self.loop = EventLoop()
        self.cluster = Cluster(cluster)
        self.tally = Tally()
        self.deps = {d.name: self._state_for(d) for d in trace.deployments}     # NeverFitsPool
        self.pending: dict[str, Replica] = {}
        self._ids = 0
        self._requests = 0
        self._holding_gpus = 0
        self._gateway_free_at = 0.0               # Throughput.gateway_s: when its last request's work ends
        self._running_on: dict[str, int] = {}     # node -> requests begun on its replicas, not done

    # ------------------------------------------------------------------ running

    def run(self) -> Outcome:
        started = time.perf_counter()
        for node in self.cluster.nodes:
            self.cluster.standbys[node] = self.policy.standbys_per_node
        if self.settings.warm_caches and self.policy.node_cache:
            self._warm_caches()
        for st in self.deps.values():
            if st.config.min_replicas:
                self._reconcile(st)
        self._feed(self.trace.requests())
        self.loop.run(self.trace.duration_s)
        self._close_books()
        return finish(self.tally, policy=self.policy.name, duration_s=self.trace.duration_s,
                      gpus=self.shape.gpus, price=self.shape.gpu.price_per_hour, requests=self._requests,
                      events=self.loop.events_run, wall_s=time.perf_counter() - started)

    def _warm_caches(self) -> None:
        nodes = self.cluster.nodes
        for i, dep in enumerate(self.trace.deployments):
            cache = self.cluster.caches[nodes[i % len(nodes)]]
            cache.use(dep.name, dep.model.weight_bytes)
            cache.done(dep.name)

    def _feed(self, stream: Iterator[Request]) -> None:
        """Arrivals enter the heap one at a time: the next is scheduled as one arrives."""
        nxt = next(stream, None)
        if nxt is not None:
            self.loop.at(nxt.at_s, self._arrive, nxt, stream)

    def _arrive(self, req: Request, stream: Iterator[Request]) -> None:
        self._feed(stream)
        self._requests += 1
        st = self.deps[req.deployment]
        st.stats.requests += 1
        self._count_work(st, req)
        if st.last_activity is not None and not st.in_flight and not st.queue:
            st.idle_times.add(self.loop.now - st.last_activity)     # as pool.registry.arrived
        st.last_activity = self.loop.now
        picked = self._route(st)
        if picked is not None:
            self._serve(picked, req, "warm")
            self._poke(st)
            return
        if len(st.queue) >= self.settings.queue_limit:
            self.tally.rejected += 1
            return
        entry = Waiting(req)
        entry.timeout = self.loop.after(self.settings.wait_timeout_s, self._give_up, st, entry)
        st.queue.append(entry)
        self._reconcile(st)

    def _count_work(self, st: DeploymentState, req: Request) -> None:
        """The deployment's work (GPU-seconds at its target batch) as a decayed rate."""
        if not self.policy.pack_by_load:
            return
        model, tp = st.dep.model, self.shape.gpu.throughput
        batch = max(1, st.config.target_concurrency)
        seconds = tp.prefill_s(model.parameters_b * 1e9, model.gpu_count, req.prompt_tokens) \
            + req.output_tokens * tp.step_s(model.weight_bytes, model.gpu_count, batch)
        now = self.loop.now
        st.work_rate = st.work_rate * math.exp(-(now - st.work_at) / LOAD_WINDOW_S) \
            + seconds * model.gpu_count / batch / LOAD_WINDOW_S
        st.work_at = now

    def _expected_load(self, st: DeploymentState) -> float:
        """The share of each of its GPUs one more replica of the deployment is expected to use."""
        if not self.policy.pack_by_load:
            return 0.0
        decayed = st.work_rate * math.exp(-(self.loop.now - st.work_at) / LOAD_WINDOW_S)
        replicas = sum(1 for r in st.replicas if r.state != ASLEEP)
        return min(1.0, decayed / st.dep.model.gpu_count / max(1, replicas))

    def _give_up(self, st: DeploymentState, entry: Waiting) -> None:
        st.queue.remove(entry)
        self.tally.timed_out += 1

    def _route(self, st: DeploymentState) -> Optional[Replica]:
        ready = st.in_state(READY)
        if not ready:
            return None
        if len(ready) == 1:
            return ready[0]
        by_id = {r.rid: r for r in ready}
        picked = choose([Candidate(r.rid, r.in_flight) for r in ready])
        return by_id[picked] if picked is not None else None

    # ------------------------------------------------------------------ serving

    def _serve(self, r: Replica, req: Request, tier: str) -> None:
        r.in_flight += 1
        r.dep.in_flight += 1
        if r.running >= self.shape.gpu.throughput.max_batch:
            r.backlog.append((req, tier))
            return
        self._begin(r, req, tier)

    def _begin(self, r: Replica, req: Request, tier: str) -> None:
        r.running += 1
        if r.running == 1:
            self._busy(r, +1)
        self._count_running(r, +1)
        tp = self.shape.gpu.throughput
        if tp.prefill_step_tokens:
            self.loop.after(self._to_replica(r), self._reach, r, Prompt(req, tier, req.prompt_tokens))
            return
        model = r.dep.dep.model                # each prompt prefilled at once, apart from the others
        share = self._share(r)
        step = tp.step_s(model.weight_bytes, model.gpu_count, r.running) * share
        prefill = tp.prefill_s(model.parameters_b * 1e9, model.gpu_count, req.prompt_tokens) * share
        first = self._to_replica(r) + prefill + step
        self.tally.answered(self.loop.now + first - req.at_s, r.dep.size_class, tier, r.dep.slo_s)
        self.tally.output_tokens += req.output_tokens
        self.loop.after(first + max(0, req.output_tokens - 1) * step, self._done, r)

    def _to_replica(self, r: Replica) -> float:
        """How long a request served now takes to reach its replica: the gateway's work for
        it, one request at a time after those before it, then the hop, slowed on CPU slots
        by the other requests in flight on the node (Throughput.stream_s)."""
        tp = self.shape.gpu.throughput
        hop = tp.request_overhead_s
        if tp.stream_s and r.placed is not None:
            hop += tp.stream_s * (self._running_on[r.placed.node] - 1)
        if tp.gateway_s:
            self._gateway_free_at = max(self.loop.now, self._gateway_free_at) + tp.gateway_s
            return self._gateway_free_at - self.loop.now + hop
        return hop

    def _count_running(self, r: Replica, delta: int) -> None:
        if r.placed is not None:
            node = r.placed.node
            self._running_on[node] = self._running_on.get(node, 0) + delta

    def _reach(self, r: Replica, prompt: Prompt) -> None:
        """At the replica, a prompt waits for the prefill steps before it."""
        r.prefills.append(prompt)
        if not r.prefilling:
            self._prefill(r)

    def _prefill(self, r: Replica) -> None:
        """One step of the engine's: prompts in arrival order, up to its token budget (the
        last one cut short, finished in the next); their first tokens come at its end."""
        model, tp = r.dep.dep.model, self.shape.gpu.throughput
        finished, tokens = [], 0
        while r.prefills and tokens < tp.prefill_step_tokens:
            head = r.prefills[0]
            taken = min(head.left, tp.prefill_step_tokens - tokens)
            head.left, tokens = head.left - taken, tokens + taken
            if head.left:
                break
            finished.append(r.prefills.popleft())
        share = self._share(r)
        step = tp.step_s(model.weight_bytes, model.gpu_count, r.running) * share
        took = tp.prefill_s(model.parameters_b * 1e9, model.gpu_count, tokens) * share + step
        r.prefilling = True
        self.loop.after(took, self._first_tokens, r, finished, step)

    def _first_tokens(self, r: Replica, finished: list[Prompt], step: float) -> None:
        for prompt in finished:
            self.tally.answered(self.loop.now - prompt.req.at_s, r.dep.size_class, prompt.tier, r.dep.slo_s)
            self.tally.output_tokens += prompt.req.output_tokens
            self.loop.after(max(0, prompt.req.output_tokens - 1) * step, self._done, r)
        r.prefilling = False
        if r.prefills:
            self._prefill(r)

    def _share(self, r: Replica) -> float:
        """How many times longer its steps take for the replicas it shares compute with."""
        if r.placed is None:
            return 1.0
        cores = self.shape.gpu.throughput.node_cores
        if cores:                               # CPU slots: one node's cores, whatever the slot
            node = r.placed.node
            busy = sum(n for slot, n in self.cluster.busy.items() if self.cluster.node_of[slot] == node)
            return max(1.0, busy / cores)
        return max(self.cluster.busy[s] for s in r.placed.slot_ids)

    def _done(self, r: Replica) -> None:
        r.running -= 1
        self._count_running(r, -1)
        r.in_flight -= 1
        st = r.dep
        st.in_flight -= 1
        st.last_activity = self.loop.now
        if r.backlog:
            req, tier = r.backlog.popleft()
            self._begin(r, req, tier)
        elif r.running == 0:
            self._busy(r, -1)
        if r.state == DRAINING and r.in_flight == 0:
            self._finish_drain(r)
        self._poke(st)

    def _busy(self, r: Replica, delta: int) -> None:
        if r.placed is None:
            return
        now = self.loop.now
        for slot in r.placed.slot_ids:
            self.cluster.busy[slot] += delta
        if delta > 0:
            r.busy_since = now
        else:
            self.tally.busy_gpu_seconds += (now - r.busy_since) * len(r.placed.slot_ids)

    def _dispatch(self, st: DeploymentState) -> None:
        while st.queue:
            picked = self._route(st)
            if picked is None:
                return
            entry = st.queue.popleft()
            if entry.timeout is not None:
                entry.timeout.cancel()
            self._serve(picked, entry.req, picked.tier)      # it waited for this replica's start

    # ------------------------------------------------------------------ scaling

    def _poke(self, st: DeploymentState) -> None:
        """Reconcile on the next tick."""
        self._schedule(st, self._next_tick(self.loop.now))

    def _next_tick(self, t: float) -> float:
        tick = self.settings.tick_s
        return max(self.loop.now, math.ceil(t / tick) * tick)

    def _schedule(self, st: DeploymentState, when: float) -> None:
        if st.timer is not None and not st.timer.cancelled and st.timer.at <= when:
            return
        if st.timer is not None:
            st.timer.cancel()
        st.timer = self.loop.at(when, self._tick, st)

    def _tick(self, st: DeploymentState) -> None:
        st.timer = None
        self._reconcile(st)

    def _snapshot(self, st: DeploymentState) -> ScalingSnapshot:
        ready = st.in_state(READY)
        return ScalingSnapshot(
            now=self.loop.now, config=st.config, in_flight=tuple(r.in_flight for r in ready),
            queued_requests=len(st.queue), queued_prompt_tokens=sum(e.req.prompt_tokens for e in st.queue),
            last_activity_at=st.last_activity, ready=len(ready),
            starting=len(st.in_state(PENDING, STARTING, WAKING)),
            asleep=tuple((r.rid, r.asleep[1]) for r in st.in_state(ASLEEP) if r.asleep),
            idle_window=learn(st.idle_times) if self.policy.learned_keep_alive else None)

    def _reconcile(self, st: DeploymentState) -> None:
        snap = self._snapshot(st)
        decision, st.policy_state = policy(snap, st.policy_state)
        live = st.in_state(PENDING, STARTING, WAKING, READY)
        if decision.desired > len(live):
            for _ in range(decision.desired - len(live)):
                self._wake_or_start(st)
        elif decision.desired < len(live):
            to_sleep = decision.sleep and st.config.sleep_timeout_s > 0
            for r in _scale_down_order(live)[:len(live) - decision.desired]:
                self._scale_down(r, to_sleep)
        for rid in decision.expired:
            sleeper = next((r for r in st.replicas if r.rid == rid), None)
            if sleeper is not None:
                self._stop(sleeper)
        self._prefetch_if_predicted(st, snap)
        self._next_deadline(st, self._snapshot(st))

    def _next_deadline(self, st: DeploymentState, snap: ScalingSnapshot) -> None:
        """Come back on the tick at which the autoscaler could answer otherwise, or a
        predicted prefetch is due."""
        times = [next_change_at(snap, st.policy_state)]
        window = snap.idle_window
        if window is not None and st.last_activity is not None and self.policy.node_cache:
            times.append(st.last_activity + window.prewarm_s - self.settings.prefetch_lead_s)
        future = [t for t in times if t is not None and t > self.loop.now]
        if future:
            self._schedule(st, self._next_tick(min(future)))

    def _prefetch_if_predicted(self, st: DeploymentState, snap: ScalingSnapshot) -> None:
        """pool.weights.prefetch.predicted_due: the weights into the node with the most room,
        once per idle spell, when no node's cache holds them."""
        if not self.policy.node_cache or st.prefetched_spell == st.last_activity:
            return
        if not predicted_due(snap.idle_window, snap.idle_for, self.settings.prefetch_lead_s):
            return
        st.prefetched_spell = st.last_activity
        if self.cluster.nodes_holding(st.dep.name):
            return
        free: dict[str, int] = {}
        for slot in self.cluster.slot_ids:
            node = self.cluster.node_of[slot]
            free[node] = free.get(node, 0) + self.shape.gpu.memory_bytes - self.cluster.reserved[slot]
        node = max(sorted(free), key=lambda n: free[n])
        model = st.dep.model
        self.tally.prefetches += 1
        self.loop.after(self.shape.gpu.cold_starts.s3.seconds(model.weight_bytes), self._prefetched, st, node)

    def _prefetched(self, st: DeploymentState, node: str) -> None:
        cache = self.cluster.caches[node]
        cache.use(st.dep.name, st.dep.model.weight_bytes)
        cache.done(st.dep.name)

    def _wake_or_start(self, st: DeploymentState) -> None:
        sleepers = [r for r in st.in_state(ASLEEP) if r.asleep]
        if sleepers:
            sleeper = max(sleepers, key=lambda r: r.asleep[1] if r.asleep else 0.0)
            if self._claim(sleeper):
                return
            self._stop(sleeper)
        elif any(r.state == DRAINING and r.to_sleep for r in st.replicas):
            return                                  # woken once it is asleep
        self._new_replica(st)

    def _new_replica(self, st: DeploymentState) -> None:
        self._ids += 1
        r = Replica(f"r{self._ids}", st, self.loop.now)
        st.replicas.append(r)
        self.pending[r.rid] = r
        self._admit()

    def _scale_down(self, r: Replica, to_sleep: bool) -> None:
        if r.state in (PENDING, STARTING, WAKING):
            self._stop(r)
        elif r.state == READY:
            r.state, r.to_sleep = DRAINING, to_sleep
            if r.in_flight == 0:
                self._finish_drain(r)

    # ------------------------------------------------------------------ slots

    def _admit(self) -> None:
        if not self.pending or not self._may_fit():
            return
        waiting = []
        for r in self.pending.values():
            r.load = self._expected_load(r.dep)
            request = PlacementRequest(r.dep.bytes_per_slot, r.dep.dep.model.gpu_count, load=r.load)
            prefer = self.cluster.nodes_holding(r.dep.dep.name) if self.policy.node_cache else frozenset()
            waiting.append(Pending(r.rid, r.dep.dep.tenant, request, int(r.created * 1e6), prefer))
        grants = admit(waiting, self.cluster.slot_states(), self._held(), {})
        for rid, where in grants.placed:
            self._start(self.pending.pop(rid), where)

    def _may_fit(self) -> bool:
        """Some slot has room for the smallest waiting replica: else admit() would place
        nothing, and a full pool with many waiting would ask it on every release."""
        smallest = min(r.dep.bytes_per_slot for r in self.pending.values())
        memory = self.shape.gpu.memory_bytes
        return any(memory - used >= smallest for used in self.cluster.reserved.values())

    def _held(self) -> dict[str, int]:
        held: dict[str, int] = {}
        for st in self.deps.values():
            for r in st.replicas:
                if r.placed is not None:
                    held[st.dep.tenant] = held.get(st.dep.tenant, 0) + len(r.placed.slot_ids)
        return held

    def _hold(self, r: Replica, where: Placed) -> None:
        self.cluster.reserve(where, self.loop.now, r.load)
        r.placed, r.placed_at, r.node = where, self.loop.now, where.node
        self._holding_gpus += len(where.slot_ids)
        self.tally.peak_gpus = max(self.tally.peak_gpus, self.cluster.gpus_in_use())
        stats = r.dep.stats
        stats.cold_starts += 1
        stats.peak_replicas = max(stats.peak_replicas, sum(1 for x in r.dep.replicas if x.placed is not None))

    def _let_go(self, r: Replica) -> None:
        if r.placed is None:
            return
        if r.running:
            self._busy(r, -1)
            self._count_running(r, -r.running)
        self.cluster.release(r.placed, self.loop.now, r.load)
        held = (self.loop.now - r.placed_at) * len(r.placed.slot_ids)
        self.tally.gpu_seconds += held
        r.dep.stats.gpu_seconds += held
        self._holding_gpus -= len(r.placed.slot_ids)
        r.placed = None

    def _start(self, r: Replica, where: Placed) -> None:
        self._hold(r, where)
        r.state = STARTING
        model, cold = r.dep.dep.model, self.shape.gpu.cold_starts
        cache = self.cluster.caches[where.node]
        key = r.dep.dep.name
        cached = cache.holds(key)
        standby = self.cluster.standbys[where.node] > 0
        if standby:
            self.cluster.standbys[where.node] -= 1
            self.loop.after(cold.standby_refill_s, self._refill, where.node)
        load = (cold.standby if standby else cold.cache).seconds(model.weight_bytes)
        seconds = load if cached else cold.s3.seconds(model.weight_bytes) + load
        r.tier = ("standby" if standby else "cache") if cached else "s3"
        cache.use(key, model.weight_bytes)
        r.cache_user = True
        self.tally.cold_starts[r.tier] += 1
        r.timer = self.loop.after(seconds, self._ready, r)

    def _refill(self, node: str) -> None:
        self.cluster.standbys[node] = min(self.cluster.standbys[node] + 1, self.policy.standbys_per_node)

    def _ready(self, r: Replica) -> None:
        r.timer, r.state = None, READY
        self._dispatch(r.dep)
        self._poke(r.dep)

    # ------------------------------------------------------------------ the sleep tier

    def _finish_drain(self, r: Replica) -> None:
        if not r.to_sleep or r.placed is None:
            self._stop(r)
            return
        model = r.dep.dep.model
        budget = int(self.shape.sleep_host_memory_gb * 1e9)
        room = make_room(self._sleepers(), r.placed.node, model.weight_bytes, budget)
        if room is None:
            self._stop(r)
            return
        for rid in room:
            victim = next(x for st in self.deps.values() for x in st.replicas if x.rid == rid)
            self._stop(victim)
        r.state = "falling-asleep"
        r.timer = self.loop.after(self.shape.gpu.cold_starts.sleep.seconds(model.weight_bytes / model.gpu_count),
                                  self._asleep, r)

    def _asleep(self, r: Replica) -> None:
        where = r.placed
        if where is None:
            return
        self._let_go(r)
        r.timer, r.state, r.asleep = None, ASLEEP, (where, self.loop.now)
        self._admit()
        self._reconcile(r.dep)                 # a request that came meanwhile wakes it now

    def _sleepers(self) -> list[Sleeper]:
        return [Sleeper(r.rid, r.asleep[0].node, r.dep.dep.model.weight_bytes, r.asleep[1])
                for st in self.deps.values() for r in st.in_state(ASLEEP) if r.asleep]

    def _claim(self, r: Replica) -> bool:
        """Awake again on its own slots, if they have room now."""
        if r.asleep is None:
            return False
        where, _ = r.asleep
        r.load = self._expected_load(r.dep)
        request = PlacementRequest(where.bytes_per_slot, len(where.slot_ids), on_slots=where.slot_ids, load=r.load)
        placed = place(request, self.cluster.slot_states())
        if not isinstance(placed, Placed):
            return False
        self._hold(r, placed)
        model = r.dep.dep.model
        r.asleep, r.state, r.tier = None, WAKING, "wake"
        self.tally.cold_starts["wake"] += 1
        r.timer = self.loop.after(self.shape.gpu.cold_starts.wake.seconds(model.weight_bytes / model.gpu_count),
                                  self._ready, r)
        return True

    # ------------------------------------------------------------------ stopping

    def _stop(self, r: Replica) -> None:
        if r.timer is not None:
            r.timer.cancel()
            r.timer = None
        self.pending.pop(r.rid, None)
        had_slots = r.placed is not None
        if r.cache_user and r.node is not None:
            cache = self.cluster.caches[r.node]
            cache.done(r.dep.dep.name)
            if not self.policy.node_cache:
                cache.forget(r.dep.dep.name)
            r.cache_user = False
        self._let_go(r)
        r.state, r.asleep = STOPPED, None
        r.dep.replicas.remove(r)
        if had_slots:
            self._admit()

    def _close_books(self) -> None:
        self.cluster._occupy(self.loop.now, 0)
        self.tally.occupied_gpu_seconds = self.cluster.occupied_seconds
        for st in self.deps.values():
            for r in list(st.replicas):
                self._let_go(r)
            window = learn(st.idle_times)
            if window is not None:
                st.stats.prewarm_s, st.stats.until_s = window.prewarm_s, window.until_s
            self.tally.deployments[st.dep.name] = st.stats

    # ------------------------------------------------------------------ setup

    def _state_for(self, dep: Deployment) -> DeploymentState:
        s = self.settings
        config = self.policy.scaling(dep)
        config = ScalingConfig(**{**config.__dict__, "target_queued_prompt_tokens": s.target_queued_prompt_tokens})
        model = dep.model
        need = (model.weight_bytes + s.kv_cache_tokens * kv_bytes_per_token(model.parameters_b)) \
            * (1.0 + s.memory_overhead_fraction)
        per_slot = math.ceil(need / model.gpu_count)
        if self.policy.exclusive_gpus:          # one replica a GPU, as vLLM takes 90% of one
            per_slot = max(per_slot, self.shape.gpu.memory_bytes)
        why = never_fits(PlacementRequest(per_slot, model.gpu_count), self.cluster.slot_states())
        if why is not None:                     # the pool refuses such a deploy (NeverFits)
            raise NeverFitsPool(f"deployment {dep.name} ({model.name}) never fits this pool: {why}")
        return DeploymentState(dep, config, per_slot, size_class(dep), ttft_target(dep, self.shape.gpu))


def _scale_down_order(live: list[Replica]) -> list[Replica]:
    """pool.registry.scale_down_order's order."""
    return sorted(live, key=lambda r: victim_rank(r.state == PENDING, r.state in (STARTING, WAKING),
                                                  r.in_flight, r.created))


def simulate(trace: Trace, cluster: ClusterShape, pool_policy: PoolPolicy,
             settings: SimSettings = SimSettings()) -> Outcome:
    return Simulation(trace, cluster, pool_policy, settings).run()
