"""Connection bounds uvicorn lacks: a deadline for the request head, and a cap on open
connections that sheds idle ones first.

uvicorn (0.54, h11) closes a keep-alive connection that stays silent after a response, but
nothing bounds a connection that is opened and never sends a request, or that sends half its
headers and stops: each is held for as long as the client likes (slowloris). Its
``limit_concurrency`` answers 503 to *new requests* once that many connections are open, so
idle connections alone would lock every client out. :func:`protocol_class` returns uvicorn's
own h11 protocol with two additions:

- a connection whose request head (request line and headers) is not complete ``header_timeout``
  seconds after the connection opened, or after the first byte of a later request on a
  kept-alive connection, is closed;
- when a new connection makes more than ``max_connections`` open, the oldest connection that
  is waiting for a request head (not one with a request in flight) is closed to make room; only
  when every open connection has a request in flight is the new one closed instead.

The body is bounded separately, by the app (``body.BODY_READ_TIMEOUT``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from onepass.server.settings import DEFAULT_HEADER_TIMEOUT, DEFAULT_MAX_CONNECTIONS


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a request-head deadline and a connection cap (set on the
    subclass :func:`protocol_class` makes)."""

    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    max_connections: int = DEFAULT_MAX_CONNECTIONS

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._opened = 0.0

    # ------------------------------------------------------------------ state

    def awaiting_head(self) -> bool:
        """No request in flight: the connection is idle or its next request head is not
        complete yet."""
        in_flight = self.cycle is not None and not self.cycle.response_complete
        return not in_flight and self.conn.their_state is h11.IDLE

    def _arm(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout, self._head_expired)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_expired(self) -> None:
        self._head_timer = None
        if self.awaiting_head():
            self.close()

    def close(self) -> None:
        """Close without a response (no request head was received to answer)."""
        self._disarm()
        if not self.transport.is_closing():
            self.transport.close()

    # ------------------------------------------------------------------ protocol

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._opened = self.loop.time()
        self._arm()
        if len(self.connections) > self.max_connections:
            # a connection closed in this same burst of accepts is still listed until its
            # connection_lost runs: count (and pick) only those still open
            live = [c for c in self.connections if c.transport is not None
                    and not c.transport.is_closing()]
            if len(live) <= self.max_connections:
                return
            idle = [c for c in live if c is not self
                    and isinstance(c, BoundedH11Protocol) and c.awaiting_head()]
            if idle:
                min(idle, key=lambda c: c._opened).close()
            else:
                self.close()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.transport.is_closing():
            return
        if self.awaiting_head():
            self._arm()  # the first bytes of a head (after a keep-alive pause): its deadline
        else:
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # uvicorn's keep-alive timer now bounds the silence before the next request (or, with
        # a pipelined request already parsed, the request is in flight)
        self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


def protocol_class(header_timeout: float, max_connections: int) -> type[BoundedH11Protocol]:
    """The protocol for ``uvicorn.Config(http=...)`` with these bounds."""
    return type("OnepassH11Protocol", (BoundedH11Protocol,),
                {"header_timeout": header_timeout, "max_connections": max_connections})
