"""Several choices in one response: a completion's prompts, times n samples of each.

Choice `index` is prompt_i * n + j, as OpenAI numbers them. Each choice is one
`Generation` (one engine request); the samples of a prompt beyond the first share
its KV blocks, so their usage carries no prompt tokens and the response's usage,
the sum over the choices, counts every prompt once and every completion.
`merged` interleaves the choices' deltas as they come, for one SSE stream.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, AsyncIterator, Optional, Union

from wire.requests import GenerationRequest
from wire.responses import usage_dict

if TYPE_CHECKING:
    from runtime.serve.completions import Generation, TextDelta


@dataclass
class Choice:
    index: int
    generation: "Generation"
    echo: str = ""                          # the prompt's text, leading the choice's text

    async def close(self) -> None:
        await self.generation.close()


def per_prompt(request: GenerationRequest) -> list[GenerationRequest]:
    """One request per prompt of a completion's batch (a chat is one prompt)."""
    if request.kind != "completion" or len(request.prompts) < 2:
        return [request]
    return [replace(request, prompt=p, batch=[]) for p in request.prompts]


async def close_all(choices: list[Choice]) -> None:
    for choice in choices:
        await choice.close()


def total_usage(usages: list[Optional[dict[str, Any]]]) -> dict[str, Any]:
    """The sum of the choices' cumulative usages (a choice not heard from yet counts 0)."""
    given = [u for u in usages if u is not None]
    return usage_dict(sum(u["prompt_tokens"] for u in given),
                      sum(u["completion_tokens"] for u in given),
                      sum(u["prompt_tokens_details"]["cached_tokens"] for u in given))


_Item = Union["TextDelta", BaseException, None]


async def merged(choices: list[Choice]) -> AsyncIterator[tuple[Choice, "TextDelta"]]:
    """Every choice's deltas, in the order they arrive; an error of any choice is raised."""
    queue: asyncio.Queue[tuple[Choice, _Item]] = asyncio.Queue()

    async def pump(choice: Choice) -> None:
        try:
            async for delta in choice.generation.deltas():
                queue.put_nowait((choice, delta))
        except Exception as exc:   # noqa: BLE001 - handed to the reader, which raises it
            queue.put_nowait((choice, exc))
        queue.put_nowait((choice, None))

    tasks = [asyncio.create_task(pump(c)) for c in choices]
    try:
        remaining = len(choices)
        while remaining:
            choice, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield choice, item
    finally:
        for task in tasks:
            task.cancel()
