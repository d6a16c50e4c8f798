"""A pytest plugin that counts, per test file, the Triton kernel specializations the tests
launch under the interpreter: the (kernel, argument types, alignment and divisibility of
pointers and integers, constexprs, launch options) keys by which compiled Triton caches
its kernels, so one compile each on a GPU with a cold cache. scripts/gpu_check.py budgets
its compile phase by these counts (TRITON_TESTS); tests/test_gpu_check.py keeps them true.

    TRITON_INTERPRET=1 python -m pytest -p tests.support.triton_specializations FILES

prints `TRITON_SPECIALIZATIONS {"<file stem>": count, ...}` at the end."""
from __future__ import annotations

import inspect
import json
from typing import Any

import pytest
from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import BaseBackend
from triton.runtime.interpreter import InterpretedFunction

MARK = "TRITON_SPECIALIZATIONS "
_seen: dict[str, set[str]] = {}
_file = ["?"]
_launch = InterpretedFunction.run


def _key(fn: Any, args: tuple, kwargs: dict) -> str:
    signature = inspect.signature(fn)
    options = sorted((k, repr(v)) for k, v in kwargs.items() if k not in signature.parameters)
    bound = signature.bind(*args, **{k: v for k, v in kwargs.items() if k in signature.parameters})
    parts: list[Any] = [fn.__name__, options]
    for name, value in bound.arguments.items():
        if "constexpr" in str(signature.parameters[name].annotation):
            parts.append((name, repr(value)))
        else:
            parts.append((name, native_specialize_impl(BaseBackend, value, False, True, True)))
    return repr(parts)


def _counting_run(self: InterpretedFunction, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
    _seen.setdefault(_file[0], set()).add(_key(self.fn, args, kwargs))
    return _launch(self, *args, grid=grid, warmup=warmup, **kwargs)


InterpretedFunction.run = _counting_run


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    _file[0] = item.path.stem
    return (yield)


def pytest_sessionfinish(session: pytest.Session) -> None:
    print("\n" + MARK + json.dumps({name: len(keys) for name, keys in sorted(_seen.items())}))
