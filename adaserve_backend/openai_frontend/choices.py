"""A request's choices (OpenAI's `n` of each prompt, a batched completion's prompts): each its own
generation in the engine, all running at once, their responses taken as they come. vLLM runs `n` the
same way (one sequence per choice, the prompt's KV shared through its prefix cache, as ours is). Each
choice of a prompt draws with its own seed (`choice_generation`), so sampled choices differ: choice j
of a request seeded s draws as a one-choice request seeded s + j."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from .params import Generation

log = logging.getLogger("adaserve.openai")
SEED_SPACE = 2**64  # the ensemble's seed input is a uint64


def choice_generation(gen: Generation, index: int) -> Generation:
    """Choice `index` of each of `gen`'s prompts: the request's own seed for the first, the next seeds
    for the others."""
    if index == 0 or gen.seed is None:
        return gen
    return dataclasses.replace(gen, seed=(gen.seed + index) % SEED_SPACE)


class Choices:
    """The backend streams of a request's choices, merged: `next()` gives (choice, text delta, extras)
    for the next response of any choice, (choice, None, {}) once that choice has ended, None once every
    one has. A choice's BackendError is raised from `next()`; `aclose()` then ends the others (closing
    a backend stream aborts its request, which frees its KV cache)."""

    def __init__(self, streams: list[AsyncIterator[tuple[str, dict]]],
                 guard: Callable[[Awaitable], Awaitable]) -> None:
        self.streams, self.guard = streams, guard  # guard: the drain's (a stopping server cuts a wait short)
        self.pending: dict[asyncio.Future, int] = {}  # each choice's awaited response, while it runs
        self.started = False
        self.ended = 0

    def _ask(self, index: int) -> None:
        self.pending[asyncio.ensure_future(self.guard(anext(self.streams[index])))] = index

    async def next(self) -> tuple[int, str | None, dict] | None:
        if self.ended == len(self.streams):
            return None
        if len(self.streams) == 1:  # no task per token where there is nothing to merge
            try:
                text, extra = await self.guard(anext(self.streams[0]))
            except StopAsyncIteration:
                self.ended = 1
                return 0, None, {}
            return 0, text, extra
        if not self.started:
            self.started = True
            for i in range(len(self.streams)):
                self._ask(i)
        done, _ = await asyncio.wait(self.pending, return_when=asyncio.FIRST_COMPLETED)
        task = min(done, key=self.pending.__getitem__)  # responses at once: the lower choice first
        index = self.pending.pop(task)
        try:
            text, extra = task.result()
        except StopAsyncIteration:
            self.ended += 1
            return index, None, {}
        self._ask(index)
        return index, text, extra

    async def aclose(self) -> None:
        """Ends every choice's stream, each whatever the others do; errors past the first one `next`
        raised (when a drain's grace runs out, every choice's at once) are only logged."""
        for task in self.pending:
            task.cancel()
        if self.pending:  # a stream still inside its step cannot be closed yet
            await asyncio.wait(self.pending)
        for task in self.pending:  # read, or asyncio reports them as never retrieved
            error = None if task.cancelled() else task.exception()
            if error is not None and not isinstance(error, StopAsyncIteration):
                log.debug("a choice ended with its request: %s", error)
        self.pending.clear()
        for stream in self.streams:
            try:
                await stream.aclose()
            except Exception:  # the others still get closed: closing is what aborts their requests
                log.exception("closing a choice's stream failed")
