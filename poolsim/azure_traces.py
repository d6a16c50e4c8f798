"""Readers of the two public Azure traces, so a simulation can replay them.

Azure LLM inference traces (github.com/Azure/AzurePublicDataset,
AzureLLMInferenceTrace_{code,conv}.csv of 2023, the 2024 week in the same
shape): one service's requests, a header and then

    TIMESTAMP,ContextTokens,GeneratedTokens
    2023-11-16 18:15:46.6805900,374,44

TIMESTAMP is a date and time (ISO 8601 with a space; seven fractional
digits, which Python keeps to six). read_azure_llm maps the file onto one
deployment the caller names; at_s counts from the first request.

Azure Functions trace 2019 (invocations_per_function_md.anon.dNN.csv): one
function a line, its invocations in each minute of a day,

    HashOwner,HashApp,HashFunction,Trigger,1,2,...,1440
    a1b2...,c3d4...,e5f6...,http,0,3,...,1

read_azure_functions makes each function a deployment (named by
HashFunction, owned by HashOwner as its tenant), spreads each minute's count
uniformly at random within the minute, and draws lengths for the
deployment's kind. Its model and kind come from the generator's plan for
that many deployments (the config's seed, catalogue, size mix and code
fraction); the rest of the config does not apply. The file is read once,
checked, and kept as each function's non-zero minutes: the requests come out
in time order across functions, and a file with one function a row offers
no order but to read it all; the counts are a small fraction of its text.
"""
from __future__ import annotations

import contextlib
import csv
import dataclasses
import functools
from dataclasses import dataclass
from datetime import datetime
from typing import Generator, Iterator, Optional

import numpy as np

from poolsim.lengths import draw_lengths
from poolsim.streams import Chunk, merge
from poolsim.trace_files import PathLike, TraceFileError, from_text, in_order, open_text, tokens
from poolsim.traffic import TrafficConfig, plan
from poolsim.workload import Deployment, Request, Trace

LLM_FIELDS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
FUNCTION_FIELDS = ("HashOwner", "HashApp", "HashFunction", "Trigger")
_SPREAD = 2                          # the second word of a function's seed: its times in each minute
_DEFAULT = TrafficConfig()


# --- LLM inference ---------------------------------------------------------------------------------

def read_azure_llm(path: PathLike, deployment: Deployment, duration_s: Optional[float] = None) -> Trace:
    """One deployment's trace from an Azure LLM inference CSV. Without duration_s, the time of the
    last request: the file is read through once for it (and checked), nothing kept."""
    with contextlib.closing(_llm_rows(path)) as rows:
        first = next(rows, None)
    if first is None:
        raise TraceFileError(path, 2, "TIMESTAMP", "no requests in the file")
    start = first[1]
    if duration_s is None:
        duration_s = max((r.at_s for r in _llm_requests(path, deployment.name, start, None)), default=0.0)
    return Trace((deployment,), duration_s,
                 functools.partial(_llm_requests, path, deployment.name, start, duration_s))


def _llm_requests(path: PathLike, name: str, start: datetime, duration_s: Optional[float]) -> Iterator[Request]:
    rows = ((line, Request(_since(start, at, path, line), name, prompt, output))
            for line, at, prompt, output in _llm_rows(path))
    return in_order(rows, path, None, duration_s)


def _llm_rows(path: PathLike) -> Generator[tuple[int, datetime, int, int], None, None]:
    with open_text(path) as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None or any(name not in header for name in LLM_FIELDS):
            raise TraceFileError(path, 1, "header", f"must name {','.join(LLM_FIELDS)}, is {header}")
        at, prompt, output = (header.index(name) for name in LLM_FIELDS)
        for row in reader:
            line = reader.line_num
            if not row:
                continue
            if len(row) != len(header):
                raise TraceFileError(path, line, "row", f"{len(row)} fields, the header has {len(header)}")
            yield (line, _timestamp(row[at], path, line),
                   tokens(from_text(row[prompt], int, path, line, "ContextTokens"), path, line, "ContextTokens"),
                   tokens(from_text(row[output], int, path, line, "GeneratedTokens"), path, line, "GeneratedTokens"))


def _timestamp(text: str, path: PathLike, line: int) -> datetime:
    try:
        return datetime.fromisoformat(text.strip())
    except ValueError:
        raise TraceFileError(path, line, "TIMESTAMP", f"not a date and time: {text!r}") from None


def _since(start: datetime, at: datetime, path: PathLike, line: int) -> float:
    try:
        return (at - start).total_seconds()
    except TypeError:
        raise TraceFileError(path, line, "TIMESTAMP", "mixes times with and without a time zone") from None


# --- Functions -------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False, slots=True)
class _Function:
    """One row of the invocations file: who owns the function, and its non-zero minutes."""
    name: str
    tenant: str
    minutes: np.ndarray              # int64 [k], ascending, 0-based
    counts: np.ndarray               # int64 [k], > 0


def read_azure_functions(path: PathLike, config: TrafficConfig = _DEFAULT) -> Trace:
    """A day of the Azure Functions 2019 trace: each function a deployment (module docstring)."""
    functions, minutes = _function_rows(path)
    duration = minutes * 60.0
    planned = plan(dataclasses.replace(config, deployments=max(1, len(functions)), duration_s=duration))
    deployments = tuple(dataclasses.replace(p.deployment, name=f.name, tenant=f.tenant,
                                            mean_rate_per_s=float(f.counts.sum()) / duration)
                        for p, f in zip(planned, functions))
    return Trace(deployments, duration, functools.partial(_function_requests, config, deployments, functions))


def _function_requests(config: TrafficConfig, deployments: tuple[Deployment, ...],
                       functions: list[_Function]) -> Iterator[Request]:
    sources = [_spread(config, i, d, f) for i, (d, f) in enumerate(zip(deployments, functions))]
    return merge([d.name for d in deployments], sources)


def _spread(config: TrafficConfig, index: int, deployment: Deployment, function: _Function) -> Iterator[Chunk]:
    """The function's invocations, uniform within their minutes, an hour of the day a chunk."""
    rng = np.random.default_rng((config.seed, _SPREAD, index))
    hours = function.minutes // 60
    for hour in np.unique(hours):
        minutes, counts = function.minutes[hours == hour], function.counts[hours == hour]
        times = np.sort(np.repeat(minutes * 60.0, counts) + rng.random(int(counts.sum())) * 60.0)
        yield Chunk(times, *draw_lengths(rng, config.lengths(deployment.kind), len(times)))


def _function_rows(path: PathLike) -> tuple[list[_Function], int]:
    """The file's functions and its number of minutes."""
    with open_text(path) as f:
        reader = csv.reader(f)
        header = next(reader, None) or []
        minutes = len(header) - len(FUNCTION_FIELDS)
        if tuple(header[:len(FUNCTION_FIELDS)]) != FUNCTION_FIELDS or minutes < 1 \
                or header[len(FUNCTION_FIELDS):] != [str(m) for m in range(1, minutes + 1)]:
            raise TraceFileError(path, 1, "header", f"must be {','.join(FUNCTION_FIELDS)},1,2,...,N")
        functions, seen = [], set()
        for row in reader:
            if not row:
                continue
            function = _function(row, header, path, reader.line_num)
            if function.name in seen:
                raise TraceFileError(path, reader.line_num, "HashFunction", f"{function.name!r} is listed twice")
            seen.add(function.name)
            functions.append(function)
    return functions, minutes


def _function(row: list[str], header: list[str], path: PathLike, line: int) -> _Function:
    if len(row) != len(header):
        raise TraceFileError(path, line, "row", f"{len(row)} fields, the header has {len(header)}")
    owner, _, name, _ = row[:len(FUNCTION_FIELDS)]
    for field, value in (("HashOwner", owner), ("HashFunction", name)):
        if not value:
            raise TraceFileError(path, line, field, "empty")
    counts = _counts(row, header, path, line)
    minutes = np.flatnonzero(counts)
    return _Function(name, owner, minutes, counts[minutes])


def _counts(row: list[str], header: list[str], path: PathLike, line: int) -> np.ndarray:
    """The row's per-minute counts, int64; the first bad field is named."""
    first = len(FUNCTION_FIELDS)
    try:
        counts = np.array(row[first:], dtype=np.int64)
        if (counts >= 0).all():
            return counts
    except (ValueError, OverflowError):
        pass
    bad = next((c for c in range(first, len(row)) if not _is_count(row[c])), first)
    raise TraceFileError(path, line, header[bad], f"not a count >= 0: {row[bad]!r}")


def _is_count(text: str) -> bool:
    text = text.strip()
    return text.isascii() and text.isdigit() and int(text) < 2 ** 63
