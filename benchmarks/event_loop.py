"""The simulator's clock against simpy's: why poolsim/events.py is a heap of callbacks.

Each of N timed events runs one callback; three ways: our EventLoop (a heap of
callbacks), simpy with a callback on a timeout event, and simpy with a process per
event (how simpy models are usually written). Printed: microseconds an event, the
median of rounds, and each against ours.

    .venv/bin/python -m benchmarks.event_loop [--events 200000] [--rounds 5]
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

from poolsim.events import EventLoop


def ours(n: int) -> int:
    loop, count = EventLoop(), [0]

    def tick() -> None:
        count[0] += 1
    for i in range(n):
        loop.at(i * 1e-3, tick)
    loop.run(float("inf"))
    return count[0]


def simpy_callbacks(n: int) -> int:
    import simpy
    env, count = simpy.Environment(), [0]

    def tick(_event: object) -> None:
        count[0] += 1
    for i in range(n):
        env.timeout(i * 1e-3).callbacks.append(tick)
    env.run()
    return count[0]


def simpy_processes(n: int) -> int:
    import simpy
    env, count = simpy.Environment(), [0]

    def proc(delay: float):
        yield env.timeout(delay)
        count[0] += 1
    for i in range(n):
        env.process(proc(i * 1e-3))
    env.run()
    return count[0]


def per_event_us(fn: Callable[[int], int], n: int) -> float:
    started = time.perf_counter()
    assert fn(n) == n
    return (time.perf_counter() - started) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    ways = {"poolsim EventLoop": ours, "simpy, callbacks": simpy_callbacks, "simpy, processes": simpy_processes}
    rounds: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, fn in ways.items():           # interleaved: the machine's noise hits all alike
            rounds[name].append(per_event_us(fn, args.events))
    base = statistics.median(rounds["poolsim EventLoop"])
    for name, values in rounds.items():
        med = statistics.median(values)
        shown = ", ".join(f"{v:.2f}" for v in values)
        print(f"{name:20s} {med:6.2f} us/event ({med / base:.2f}x ours)   rounds: {shown}")


if __name__ == "__main__":
    from benchmarks.results import recorded
    with recorded(__file__):
        main()
