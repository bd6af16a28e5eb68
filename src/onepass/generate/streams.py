"""What a generation consumer reads: the events of one sequence (:class:`Delta` then one
:class:`Finish`) and the errors a scheduler raises. Pure (no torch), so the server's protocol
layer imports it without loading a model runtime (generate/scheduler.py produces them)."""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol


def _resolve(future: Future, error: BaseException | None, result: Callable[[], Any]) -> None:
    """Hand a retired task's result (or its error) to the caller waiting on ``future``, once."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result())


class Saturated(Exception):
    """The waiting line is full: come back later (the server answers 429)."""


class SchedulerClosed(Exception):
    """The scheduler is shutting down."""


class ReadCancelled(Exception):
    """A reading was cancelled (its client went away); its remaining chunks never ran."""


class Reader(Protocol):
    """What a reading task feeds (embeddings pooling, prompt scoring: backends/torch.py):
    ``take`` gets each chunk's final hidden states in order, ``result`` the answer."""

    inputs: list[list[int]]

    def take(self, i: int, start: int, hidden: Any) -> None: ...

    def result(self) -> Any: ...


@dataclass(frozen=True)
class TokenInfo:
    """One generated token as the OpenAI logprobs fields describe it."""

    id: int
    text: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Delta:
    text: str
    tokens: tuple[TokenInfo, ...] = ()


@dataclass(frozen=True)
class Finish:
    """``reason``: stop (EOS or a stop string), length, cancelled, error, or deadline (its
    request did not get a slot before its queue deadline; ``error`` is a :class:`Saturated`
    saying so)."""

    reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    error: BaseException | None = None
    token_ids: tuple[int, ...] = ()  # the generated ids (an EOS that ended it is not one)


class GenerationStream:
    """The events of one sequence, readable from a thread or from asyncio."""

    def __init__(self) -> None:
        self._events: deque[Delta | Finish] = deque()
        self._cond = threading.Condition()
        self._wakers: list[Callable[[], None]] = []
        self.cancelled = False
        self.first_token_at: float | None = None
        self.finished: Future = Future()  # its Finish, for a caller that wants only the end

    def push(self, event: Delta | Finish) -> None:
        if isinstance(event, Finish):
            _resolve(self.finished, None, lambda: event)
        with self._cond:
            self._events.append(event)
            self._cond.notify_all()
            wakers = list(self._wakers)
        for wake in wakers:
            wake()

    def cancel(self) -> None:
        """Stop at the next step boundary and free the sequence's rows (client gone)."""
        self.cancelled = True

    def __iter__(self) -> Iterator[Delta | Finish]:
        while True:
            with self._cond:
                while not self._events:
                    self._cond.wait()
                event = self._events.popleft()
            yield event
            if isinstance(event, Finish):
                return

    async def events(self) -> AsyncIterator[Delta | Finish]:
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()

        def wake() -> None:
            loop.call_soon_threadsafe(ready.set)

        with self._cond:
            self._wakers.append(wake)
        try:
            while True:
                with self._cond:
                    event = self._events.popleft() if self._events else None
                if event is None:
                    await ready.wait()
                    ready.clear()
                    continue
                yield event
                if isinstance(event, Finish):
                    return
        finally:
            with self._cond:
                self._wakers.remove(wake)
