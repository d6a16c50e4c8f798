"""Trace files: a requests file and a deployments file, read and written as streams.

Requests, one a line in arrival order, as JSON lines (`.jsonl`):

    {"at_s": 0.731, "deployment": "dep00017", "prompt_tokens": 1469, "output_tokens": 13}

or as CSV (`.csv`) with the same four columns, the header first:

    at_s,deployment,prompt_tokens,output_tokens
    0.731,dep00017,1469,13

at_s is seconds from the trace's start, finite, >= 0, never less than the
line before and at most the trace's duration; token counts are integers >= 1.
Either shape may be gzipped (`.jsonl.gz`, `.csv.gz`). Extra JSON keys and
blank lines are skipped.

Deployments, one JSON document with the trace's duration:

    {"duration_s": 86400.0, "deployments": [
      {"name": "dep00017", "tenant": "tenant0002", "model": "llama-3-70b", "parameters_b": 70.0,
       "weight_bytes": 140000000000, "gpu_count": 4, "kind": "chat", "mean_rate_per_s": 0.02}
    ]}

mean_rate_per_s is optional (0: unknown). Every request must name a listed
deployment. A file that breaks a rule raises TraceFileError naming the
file, the line (for requests) or the entry (for deployments), and the field.
Reading streams: a trace read back holds its deployments, and each call of
its requests() reads the file again from the top.
"""
from __future__ import annotations

import csv
import functools
import gzip
import json
import math
from pathlib import Path
from typing import IO, Any, Callable, Collection, Iterable, Iterator, Optional, Union, cast

from poolsim.workload import Deployment, ModelShape, Request, Trace

PathLike = Union[str, Path]
REQUEST_FIELDS = ("at_s", "deployment", "prompt_tokens", "output_tokens")
KINDS = ("chat", "code")


class TraceFileError(ValueError):
    """A trace file breaks its shape; says where: the file, the line or entry, the field."""

    def __init__(self, path: PathLike, line: Optional[int], field: str, problem: str) -> None:
        self.path, self.line, self.field = str(path), line, field
        where = self.path if line is None else f"{self.path}:{line}"
        super().__init__(f"{where}: {field}: {problem}")


def open_text(path: PathLike, mode: str = "r") -> IO[str]:
    """A text file, through gzip where the name ends in .gz."""
    if str(path).endswith(".gz"):
        # level 1: a day of requests writes in half the time of level 9, at a third more bytes
        return cast(IO[str], gzip.open(path, mode + "t", compresslevel=1, encoding="utf-8", newline=""))
    return open(path, mode, encoding="utf-8", newline="")


def _shape(path: PathLike) -> str:
    name = str(path).removesuffix(".gz")
    for shape in ("jsonl", "csv"):
        if name.endswith("." + shape):
            return shape
    raise ValueError(f"{path}: a requests file ends in .jsonl or .csv (optionally .gz)")


# --- checks shared by every reader ---------------------------------------------------------------

def from_text(text: str, kind: type, path: PathLike, line: int, field: str) -> Any:
    """A CSV field as an int or a float."""
    try:
        return kind(text)
    except ValueError:
        noun = "an integer" if kind is int else "a number"
        raise TraceFileError(path, line, field, f"not {noun}: {text!r}") from None


def tokens(value: Any, path: PathLike, line: int, field: str) -> int:
    """A token count: an integer >= 1."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TraceFileError(path, line, field, f"not an integer: {value!r}")
    if value < 1:
        raise TraceFileError(path, line, field, f"must be >= 1, is {value}")
    return value


def seconds(value: Any, path: PathLike, line: int, field: str) -> float:
    """A time in seconds: a finite number >= 0."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise TraceFileError(path, line, field, f"not a finite number: {value!r}")
    if value < 0:
        raise TraceFileError(path, line, field, f"must be >= 0, is {value}")
    return float(value)


def in_order(requests: Iterable[tuple[int, Request]], path: PathLike, known: Optional[Collection[str]],
             duration_s: Optional[float]) -> Iterator[Request]:
    """(line, request) pairs checked for time order, known deployments and the trace's end."""
    previous = 0.0
    for line, request in requests:
        if request.at_s < previous:
            raise TraceFileError(path, line, "at_s", f"goes back in time: {request.at_s} after {previous}")
        if duration_s is not None and request.at_s > duration_s:
            raise TraceFileError(path, line, "at_s", f"{request.at_s} is past the trace's end, {duration_s}")
        if known is not None and request.deployment not in known:
            raise TraceFileError(path, line, "deployment", f"unknown deployment {request.deployment!r}")
        previous = request.at_s
        yield request


# --- requests --------------------------------------------------------------------------------------

def read_requests(path: PathLike, known: Optional[Collection[str]] = None,
                  duration_s: Optional[float] = None) -> Iterator[Request]:
    """The requests of a .jsonl or .csv file, checked line by line as they stream."""
    parse = _jsonl_rows if _shape(path) == "jsonl" else _csv_rows
    with open_text(path) as f:
        yield from in_order(parse(f, path), path, known, duration_s)


def _jsonl_rows(f: IO[str], path: PathLike) -> Iterator[tuple[int, Request]]:
    for line, text in enumerate(f, start=1):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as e:
            raise TraceFileError(path, line, "json", e.msg) from None
        if not isinstance(row, dict):
            raise TraceFileError(path, line, "json", "not an object")
        yield line, _request(path, line, [_key(row, name, path, line) for name in REQUEST_FIELDS])


def _key(row: dict[str, Any], name: str, path: PathLike, line: int) -> Any:
    if name not in row:
        raise TraceFileError(path, line, name, "missing")
    return row[name]


def _csv_rows(f: IO[str], path: PathLike) -> Iterator[tuple[int, Request]]:
    reader = csv.reader(f)
    header = next(reader, None)
    if header is None or sorted(header) != sorted(REQUEST_FIELDS):
        raise TraceFileError(path, 1, "header", f"must be {','.join(REQUEST_FIELDS)}, is {header}")
    columns = [header.index(name) for name in REQUEST_FIELDS]
    for row in reader:
        if not row:
            continue
        if len(row) != len(header):
            raise TraceFileError(path, reader.line_num, "row", f"{len(row)} fields, the header has {len(header)}")
        at, deployment, prompt, output = (row[c] for c in columns)
        line = reader.line_num
        yield line, _request(path, line, [from_text(at, float, path, line, "at_s"), deployment,
                                          from_text(prompt, int, path, line, "prompt_tokens"),
                                          from_text(output, int, path, line, "output_tokens")])


def _request(path: PathLike, line: int, values: list[Any]) -> Request:
    at, deployment, prompt, output = values
    if not isinstance(deployment, str) or not deployment:
        raise TraceFileError(path, line, "deployment", f"not a name: {deployment!r}")
    return Request(seconds(at, path, line, "at_s"), deployment,
                   tokens(prompt, path, line, "prompt_tokens"), tokens(output, path, line, "output_tokens"))


def write_requests(requests: Iterable[Request], path: PathLike) -> int:
    """Writes the requests as .jsonl or .csv (by the name) and returns how many."""
    count = 0
    with open_text(path, "w") as f:
        write = _csv_writer(f) if _shape(path) == "csv" else _jsonl_writer(f)
        for request in requests:
            write(request)
            count += 1
    return count


def _csv_writer(f: IO[str]) -> Callable[[Request], None]:
    writer = csv.writer(f, lineterminator="\n")
    writer.writerow(REQUEST_FIELDS)
    return lambda r: writer.writerow((repr(r.at_s), r.deployment, r.prompt_tokens, r.output_tokens))


def _jsonl_writer(f: IO[str]) -> Callable[[Request], None]:
    names: dict[str, str] = {}              # each name's JSON, encoded once

    def write(r: Request) -> None:
        name = names.get(r.deployment) or names.setdefault(r.deployment, json.dumps(r.deployment))
        f.write(f'{{"at_s": {r.at_s!r}, "deployment": {name}, '
                f'"prompt_tokens": {r.prompt_tokens}, "output_tokens": {r.output_tokens}}}\n')
    return write


# --- deployments -----------------------------------------------------------------------------------

def read_deployments(path: PathLike) -> tuple[tuple[Deployment, ...], float]:
    """(deployments, duration_s) of a deployments file."""
    with open_text(path) as f:
        try:
            document = json.load(f)
        except json.JSONDecodeError as e:
            raise TraceFileError(path, e.lineno, "json", e.msg) from None
    if not isinstance(document, dict) or not isinstance(document.get("deployments"), list):
        raise TraceFileError(path, None, "deployments", "missing: the file is "
                             '{"duration_s": ..., "deployments": [...]}')
    duration = _positive(document, "duration_s", float, path, "")
    deployments = tuple(_deployment(entry, path, f"deployments[{i}].")
                        for i, entry in enumerate(document["deployments"]))
    seen: set[str] = set()
    for i, d in enumerate(deployments):
        if d.name in seen:
            raise TraceFileError(path, None, f"deployments[{i}].name", f"{d.name!r} is listed twice")
        seen.add(d.name)
    return deployments, duration


def _deployment(entry: Any, path: PathLike, where: str) -> Deployment:
    if not isinstance(entry, dict):
        raise TraceFileError(path, None, where.rstrip("."), "not an object")
    kind = _text(entry, "kind", path, where)
    if kind not in KINDS:
        raise TraceFileError(path, None, where + "kind", f"must be one of {KINDS}, is {kind!r}")
    rate = entry.get("mean_rate_per_s", 0.0)
    if not _is_number(rate) or not math.isfinite(rate) or rate < 0:
        raise TraceFileError(path, None, where + "mean_rate_per_s", f"not a rate >= 0: {rate!r}")
    model = ModelShape(_text(entry, "model", path, where), _positive(entry, "parameters_b", float, path, where),
                       int(_positive(entry, "weight_bytes", int, path, where)),
                       int(_positive(entry, "gpu_count", int, path, where)))
    return Deployment(_text(entry, "name", path, where), _text(entry, "tenant", path, where), model,
                      "code" if kind == "code" else "chat", float(rate))


def _text(entry: dict[str, Any], name: str, path: PathLike, where: str) -> str:
    value = entry.get(name)
    if not isinstance(value, str) or not value:
        raise TraceFileError(path, None, where + name, f"missing or not a non-empty string: {value!r}")
    return value


def _positive(entry: dict[str, Any], name: str, kind: type, path: PathLike, where: str) -> float:
    value: Any = entry.get(name)
    if not _is_number(value) or (kind is int and not isinstance(value, int)) or not math.isfinite(value) \
            or value <= 0:
        raise TraceFileError(path, None, where + name, f"missing or not a positive {kind.__name__}: {value!r}")
    return float(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def write_deployments(deployments: Iterable[Deployment], duration_s: float, path: PathLike) -> None:
    entries = [json.dumps({"name": d.name, "tenant": d.tenant, "model": d.model.name,
                           "parameters_b": d.model.parameters_b, "weight_bytes": d.model.weight_bytes,
                           "gpu_count": d.model.gpu_count, "kind": d.kind, "mean_rate_per_s": d.mean_rate_per_s})
               for d in deployments]
    with open_text(path, "w") as f:
        f.write(f'{{"duration_s": {float(duration_s)!r}, "deployments": [\n  ' + ",\n  ".join(entries) + "\n]}\n")


# --- traces ----------------------------------------------------------------------------------------

def write_trace(trace: Trace, requests_path: PathLike, deployments_path: PathLike) -> int:
    """Writes both files; returns the number of requests."""
    write_deployments(trace.deployments, trace.duration_s, deployments_path)
    return write_requests(trace.requests(), requests_path)


def read_trace(requests_path: PathLike, deployments_path: PathLike) -> Trace:
    """The trace of two files; the requests are checked as they stream, on each call."""
    deployments, duration = read_deployments(deployments_path)
    _shape(requests_path)
    known = frozenset(d.name for d in deployments)
    return Trace(deployments, duration, functools.partial(read_requests, requests_path, known, duration))
