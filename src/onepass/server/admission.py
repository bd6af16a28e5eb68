"""A bounded queue in front of the engine, with a deadline per request.

Why not just call the engine from every request? Forward passes are serialised by the backend
anyway, so unbounded concurrency only builds an invisible queue whose requests outlive their
clients: the official client gives up after 10 s and sends the request again, doubling the
load exactly when the server is saturated. Here the queue is explicit and bounded:

* a request is admitted only if the queue has room and the expected wait (queue length times
  the recent service time) fits in the deadline; otherwise it is refused at once with a
  ``retry-after`` estimate (429), instead of hanging;
* a request that could not start before its deadline is dropped without computing (429);
* a request whose client has gone is dropped without computing (:meth:`AdmissionQueue.cancel`);
* the deadline holds after a worker takes the job, too: model work the job queues in the
  model's step scheduler waits through :func:`wait_for_model`, which withdraws it when the
  deadline passes (429) or the client leaves before the model took it (a busy model never
  turns a bounded wait into a hang, and a worker never waits for a client that is gone);
* worker threads take jobs in arrival order. Requests about the same state share their prefix
  through the backend's prefix cache: the first computes it, the ones behind it reuse it.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import TimeoutError as FutureTimeout
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("onepass.server")


class Overloaded(Exception):
    """The request was not (or will not be) computed in time: come back after ``retry_after``."""

    def __init__(self, reason: str, retry_after: float, message: str):
        super().__init__(message)
        self.reason = reason
        self.retry_after = retry_after
        self.message = message


class Closed(Exception):
    """The queue is shutting down."""


class Cancelled(Exception):
    """The client went away before its request started; nothing was computed."""


@dataclass(eq=False)
class Job:
    work: Callable[[], Any]
    enqueued: float
    deadline: float
    future: Future = field(default_factory=Future)
    cancelled: bool = False
    started: float | None = None
    finished: float | None = None
    cache: str | None = None  # hit / partial / miss, when the backend reports cache stats
    # until when the job may wait for model work (wait_for_model): its deadline, then, after
    # each piece of model work it got, one more request deadline from that moment
    model_deadline: float = 0.0

    @property
    def queue_seconds(self) -> float:
        return ((self.started or self.finished or time.monotonic()) - self.enqueued)

    @property
    def compute_seconds(self) -> float:
        if self.started is None:
            return 0.0
        return (self.finished or time.monotonic()) - self.started


class AdmissionQueue:
    """Runs ``job.work()`` on ``workers`` threads, bounded by ``max_queue`` and ``deadline``."""

    def __init__(
        self,
        *,
        max_queue: int,
        deadline: float,
        workers: int = 1,
        cache_stats: Callable[[], Any] | None = None,
        initial_service_seconds: float = 0.25,
    ):
        self.max_queue = max_queue
        self.deadline = deadline
        self.workers = workers
        self._cache_stats = cache_stats
        self._queue: deque[Job] = deque()
        self._cond = threading.Condition()
        self._busy = 0
        self._closed = False
        self._threads: list[threading.Thread] = []
        self._service = initial_service_seconds  # EWMA of compute seconds per job
        self.completed = 0

    # ------------------------------------------------------------------ state

    @property
    def depth(self) -> int:
        return len(self._queue)

    @property
    def busy(self) -> int:
        return self._busy

    @property
    def service_seconds(self) -> float:
        return self._service

    def expected_wait(self, extra: int = 0) -> float:
        """Seconds a request arriving now would wait before it starts (an estimate)."""
        ahead = len(self._queue) + self._busy + extra
        return max(0, ahead - self.workers + 1) * self._service / self.workers

    def retry_after(self, wait: float) -> float:
        """When to come back: long enough for part of the queue to drain, jittered so the
        refused clients do not all return at the same instant."""
        base = max(self._service, min(wait, 10.0) / 2)
        return min(10.0, base * random.uniform(1.0, 1.5))

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        with self._cond:
            if self._threads or self._closed:
                return
            for i in range(self.workers):
                t = threading.Thread(target=self._run, name=f"onepass-worker-{i}", daemon=True)
                t.start()
                self._threads.append(t)

    def close(self) -> int:
        """Stop taking jobs; fail the queued ones. Returns how many queued jobs were dropped."""
        with self._cond:
            self._closed = True
            dropped = list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        for job in dropped:
            _settle(job.future, exc=Closed("the server is shutting down"))
        return len(dropped)

    # ------------------------------------------------------------------ submit / cancel

    def submit(self, work: Callable[[], Any]) -> Job:
        """Queue ``work``; raises :class:`Overloaded` or :class:`Closed` instead of waiting."""
        if not self._threads:
            self.start()
        now = time.monotonic()
        with self._cond:
            if self._closed:
                raise Closed("the server is shutting down")
            if len(self._queue) >= self.max_queue:
                wait = self.expected_wait()
                raise Overloaded(
                    "queue_full",
                    self.retry_after(wait),
                    f"the server is at capacity ({len(self._queue)} requests queued, "
                    f"max_queue={self.max_queue}); retry later",
                )
            wait = self.expected_wait()
            if self._queue and wait + self._service > self.deadline:
                raise Overloaded(
                    "overloaded",
                    self.retry_after(wait),
                    f"the server is saturated: a new request would wait about {wait:.1f} s, "
                    f"over the {self.deadline:g} s request deadline; retry later",
                )
            job = Job(work, now, now + self.deadline, model_deadline=now + self.deadline)
            self._queue.append(job)
            self._cond.notify()
        return job

    def cancel(self, job: Job, *, gone: bool = True) -> bool:
        """The client is gone: drop ``job`` if it has not started. True if it was dropped.
        A running job is marked, so model work it still waits for is withdrawn
        (:func:`wait_for_model`); ``gone=False`` (its deadline passed, the client is still
        there) drops it only if it has not started."""
        with self._cond:
            try:
                self._queue.remove(job)
            except ValueError:
                job.cancelled = job.cancelled or gone
                return False
            job.cancelled = True
        _settle(job.future, exc=Cancelled("the client disconnected"))
        return True

    # ------------------------------------------------------------------ worker

    def _next(self) -> Job | None:
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            if not self._queue:
                return None
            job = self._queue.popleft()
            self._busy += 1
            return job

    def _run(self) -> None:
        while True:
            job = self._next()
            if job is None:
                return
            try:
                self._execute(job)
            finally:
                with self._cond:
                    self._busy -= 1

    def _execute(self, job: Job) -> None:
        now = time.monotonic()
        if job.future.done():
            return
        if job.cancelled:
            _settle(job.future, exc=Cancelled("the client disconnected"))
            return
        if now > job.deadline:
            job.finished = now
            _settle(job.future, exc=Overloaded(
                "deadline",
                self.retry_after(self.expected_wait()),
                f"the request waited {now - job.enqueued:.1f} s without reaching a worker "
                f"(request deadline {self.deadline:g} s); the server is saturated, retry later",
            ))
            return
        if not job.future.set_running_or_notify_cancel():
            return
        job.started = now
        before = self._cache_stats() if self._cache_stats else None
        token = _RUNNING.set((self, job))
        try:
            result = job.work()
        except BaseException as exc:  # handed to the request, which maps it to a status
            job.finished = time.monotonic()
            _settle(job.future, exc=exc)
            return
        finally:
            _RUNNING.reset(token)
        job.finished = time.monotonic()
        if before is not None:
            job.cache = _cache_outcome(before, self._cache_stats())
        elapsed = job.finished - job.started
        with self._cond:
            self._service = 0.8 * self._service + 0.2 * elapsed
            self.completed += 1
        _settle(job.future, result=result)


_RUNNING: ContextVar[tuple[AdmissionQueue, Job] | None] = ContextVar("onepass_job", default=None)
_POLL = 0.05  # seconds between looks at the client and the deadline while model work waits


def wait_for_model(future: Future, withdraw: Callable[[], bool]) -> Any:
    """The result of model work queued by the job running on this thread (the model's step
    scheduler calls this), within that job's deadline.

    ``withdraw()`` takes the work out of the model's line if the model has not taken it yet
    (True) or says it is already running (False: it ends within a step or two, so it is
    awaited). Withdrawn work raises :class:`Overloaded` (deadline) or :class:`Cancelled`
    (client gone). Outside a job (the CLI, Python callers) this simply waits."""
    running = _RUNNING.get()
    if running is None:
        return future.result()
    queue, job = running
    while True:
        try:
            result = future.result(timeout=_POLL)
        except FutureTimeout:
            if (job.cancelled or time.monotonic() > job.model_deadline) and withdraw():
                if job.cancelled:
                    raise Cancelled("the client disconnected") from None
                raise Overloaded(
                    "deadline",
                    queue.retry_after(queue.expected_wait()),
                    f"the request waited {time.monotonic() - job.enqueued:.1f} s without the "
                    f"model taking its work (request deadline {queue.deadline:g} s); the "
                    "server is saturated, retry later",
                ) from None
            continue
        job.model_deadline = max(job.model_deadline, time.monotonic() + queue.deadline)
        return result


def _settle(future: Future, result: Any = None, exc: BaseException | None = None) -> None:
    """Complete ``future`` unless someone already did (a cancel racing the worker)."""
    try:
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)
    except InvalidStateError:
        pass


def _cache_outcome(before: Any, after: Any) -> str | None:
    """hit / partial / miss from the change in the backend's counters (exact with 1 worker)."""
    if after.hits > before.hits:
        return "hit"
    if after.partial_hits > before.partial_hits:
        return "partial"
    if after.misses > before.misses:
        return "miss"
    return None
