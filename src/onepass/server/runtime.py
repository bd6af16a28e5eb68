"""What the routes share: settings, the engine once loaded (in the background), the bounded
queue in front of it, metrics, and the bookkeeping of a graceful drain."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import threading
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

from fastapi import Request

from onepass.contract import resolves_to
from onepass.server.admission import AdmissionQueue, Cancelled, Closed, Job, Overloaded
from onepass.server.context import log_fields
from onepass.server.errors import ApiError, ClientGone, retry_headers
from onepass.server.metrics import Metrics
from onepass.server.settings import ServerSettings

log = logging.getLogger("onepass.server")



class Runtime:
    """What the routes share: settings, the engine once loaded, the queue, the metrics."""

    def __init__(self, source: Any, settings: ServerSettings):
        self.settings = settings
        self.metrics = Metrics()
        self.created = time.monotonic()
        # served name -> engine (a DecisionEngine, or an EmbeddingEngine for task embedding);
        # the first generation model is the default
        self.engines: dict[str, Any] = {}
        self.queues: dict[str, AdmissionQueue] = {}
        self.loader: Callable[[], Any] | None = None
        self.load_error: str | None = None
        self.startup_seconds: float | None = None
        self.release_date = "unknown"
        self.draining = False
        self.in_flight_ids: set[str] = set()
        self.abandoned_ids: set[str] = set()
        self.on_load_failure: Callable[[], None] | None = None
        self._load_thread: threading.Thread | None = None
        self.queue = self._new_queue(settings.workers, self._cache_stats)
        self.metrics.bind(
            queue_depth=lambda: sum(s.depth for s in self._all_queues()),
            busy=lambda: sum(s.busy for s in self._all_queues()),
            ready=lambda: 1.0 if self.ready else 0.0,
            cache_stats=self._cache_stats,
        )
        if _is_model(source) or _is_engine_list(source):
            self._set_engines(source)
        elif callable(source):
            self.loader = source
        else:
            raise TypeError("create_app needs a DecisionEngine (or a list of them) or a "
                            "function that builds them")

    # ------------------------------------------------------------------ model

    @property
    def engine(self) -> Any:
        """The default model (the first generation model served; the first model when all
        are embedding models): what a request without a model gets."""
        return next((e for e in self.engines.values() if not is_embedding(e)),
                    next(iter(self.engines.values()), None))

    @property
    def ready(self) -> bool:
        return self.engine is not None and not self.draining

    def _new_queue(self, workers: int, cache_stats: Callable[[], Any]) -> AdmissionQueue:
        return AdmissionQueue(max_queue=self.settings.max_queue,
                         deadline=self.settings.request_deadline,
                         workers=workers, cache_stats=cache_stats)

    def _all_queues(self) -> list[AdmissionQueue]:
        return list(self.queues.values()) or [self.queue]

    def queue_for(self, engine: Any) -> AdmissionQueue:
        """Each model has its own decision queue: one busy model never blocks another."""
        return self.queues.get(getattr(engine, "served_name", None), self.queue)

    def _cache_stats(self) -> Any:
        return _engine_cache_stats(self.engine)

    def _set_engines(self, engines: Any) -> None:
        engines = list(engines) if _is_engine_list(engines) else [engines]
        names = [e.served_name for e in engines]
        if len(set(names)) != len(names):
            raise ValueError(f"two models are served under the same name: {names}")
        self.release_date = _release_date(engines[0])
        self.startup_seconds = round(time.monotonic() - self.created, 3)
        self.metrics.startup.set(self.startup_seconds)
        total = 0
        for i, engine in enumerate(engines):
            share = getattr(engine, "share_steps", None)
            if share is not None:  # concurrent decisions packed into the same forwards
                share()
            if i == 0:
                queue = self.queue
            else:
                queue = self._new_queue(
                    getattr(engine, "max_concurrency", self.settings.workers),
                    lambda e=engine: _engine_cache_stats(e),
                )
            self.queues[engine.served_name] = queue
            queue.start()
            backend = getattr(engine, "backend", None)
            total += getattr(backend, "weight_bytes", 0) or 0
            log.info(
                "model ready",
                extra={"fields": {"model": engine.served_name,
                                  "startup_seconds": self.startup_seconds,
                                  "quantization": getattr(backend, "quantization", None),
                                  "weight_bytes": getattr(backend, "weight_bytes", None),
                                  "resident_bytes": resident_bytes()}},
            )
        if total:
            self.metrics.weight_bytes.set(total)
        self.engines = {e.served_name: e for e in engines}
        # the loaded models' objects never become garbage: out of the collector's sight, a
        # full collection walks only what requests made (it walked them all: 0.25-0.45 s
        # with every thread stopped, /health/live too, whenever a big body was parsed)
        gc.freeze()

    def start_loading(self) -> None:
        """Load the model on a background thread: the server listens (and /health/live
        answers) while it loads."""
        if self.loader is None or self._load_thread is not None:
            return

        def load() -> None:
            try:
                engine = self.loader()
            except BaseException as exc:  # reported on /health and in the log
                self.load_error = f"{exc.__class__.__name__}: {exc}"
                log.error("model failed to load", exc_info=True,
                          extra={"fields": {"error": self.load_error}})
                if self.on_load_failure:
                    self.on_load_failure()
                return
            self._set_engines(engine)

        self._load_thread = threading.Thread(target=load, name="onepass-load", daemon=True)
        self._load_thread.start()

    def require_engine(self, model: str | None = None, *, task: str | None = "generate") -> Any:
        """The engine serving ``model`` (the default one when None or a ``jev-*`` alias of
        it); an unknown name is a 404 before any work, and so is one while loading. ``task``
        as in :meth:`engine_for`."""
        if self.draining:
            self.metrics.shed.labels("shutting_down").inc()
            raise ApiError.of(
                "shutting_down", "the server is shutting down; retry on another instance",
                headers=retry_headers(1.0),
            )
        if self.engine is None:
            self.metrics.shed.labels("loading").inc()
            if self.load_error:
                raise ApiError.of("model_loading", f"the model failed to load: {self.load_error}")
            raise ApiError.of(
                "model_loading",
                f"the model is still loading ({time.monotonic() - self.created:.0f} s so far); "
                "retry shortly",
                headers=retry_headers(2.0),
            )
        return self.engine_for(model, task=task)

    def engine_for(self, model: str | None, *, task: str | None = "generate") -> Any:
        """The engine serving ``model``, by name only: for a request already admitted (its
        readiness was checked when it arrived; a drain since then must not refuse it).

        ``task="generate"`` (decisions, generation) refuses an embedding model with a 400
        naming ``model``; ``task="embedding"`` takes any model (a decoder embeds by pooling)
        and, without a name, the first embedding model; ``None`` takes any model."""
        if model is None:
            engine = self.engine
            if task == "embedding":
                engine = next((e for e in self.engines.values() if is_embedding(e)), engine)
        elif model in self.engines:
            engine = self.engines[model]
        elif resolves_to(model, self.engine.served_name):
            engine = self.engine
        else:
            raise ApiError.of(
                "model_not_found",
                f"model: unknown model {model!r}: this server serves "
                f"{', '.join(repr(n) for n in self.engines)} (the default, "
                f"{self.engine.served_name!r}, also as 'jev-latest', 'typed-lm' or any 'jev-*' "
                "name)",
                field="model",
            )
        if task == "generate" and is_embedding(engine):
            others = [n for n, e in self.engines.items() if not is_embedding(e)]
            raise ApiError.of(
                "invalid_request_error",
                f"model: model {engine.served_name!r} is an embedding model; it serves only "
                "POST /v1/embeddings. " + (
                    f"Name a generation model: {', '.join(repr(n) for n in others)}" if others
                    else "This server serves no generation model"),
                field="model",
            )
        return engine

    # ------------------------------------------------------------------ lifecycle

    @property
    def in_flight(self) -> int:
        return len(self.in_flight_ids)

    @property
    def abandoned(self) -> int:
        return len(self.abandoned_ids)

    def begin_drain(self, reason: str = "signal") -> None:
        if not self.draining:
            self.draining = True
            log.info(
                "draining: refusing new requests, letting in-flight ones finish",
                extra={"fields": {"reason": reason, "in_flight": self.in_flight,
                                  "queued": sum(s.depth for s in self._all_queues()),
                                  "drain_seconds": self.settings.drain_seconds}},
            )

    def shutdown(self) -> None:
        dropped = sum(s.close() for s in self._all_queues())
        # Requests still in flight now are abandoned too (their cancellation may not have
        # been processed yet); a set, so none is counted twice.
        abandoned = self.abandoned_ids | self.in_flight_ids
        log.info(
            "shutdown complete",
            extra={"fields": {"abandoned": len(abandoned),
                              "dropped_queued": dropped,
                              "answered": sum(s.completed for s in self._all_queues())}},
        )

    # ------------------------------------------------------------------ running work

    async def run(self, request: Request, work: Callable[[], Any], engine: Any = None) -> Any:
        """Queue ``work`` on ``engine``'s queue (the default model's when None), wait for it,
        and give up (cheaply) if the client disconnects."""
        queue = self.queue_for(engine) if engine is not None else self.queue
        try:
            job = queue.submit(work)
        except Overloaded as exc:
            self.metrics.shed.labels(exc.reason).inc()
            raise ApiError.of(
                "overloaded", exc.message, headers=retry_headers(exc.retry_after)
            ) from None
        except Closed:
            self.metrics.shed.labels("shutting_down").inc()
            raise ApiError.of("shutting_down", "the server is shutting down",
                              headers=retry_headers(1.0)) from None
        info = log_fields(request)
        future = asyncio.wrap_future(job.future)
        future.add_done_callback(_consume)
        gone = asyncio.ensure_future(wait_disconnect(request))
        try:
            try:
                # Wait until the deadline for the job to start; once it runs, until it ends.
                done, _ = await asyncio.wait(
                    {future, gone}, timeout=max(0.0, job.deadline - time.monotonic()),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if not done and queue.cancel(job, gone=False):
                    self.metrics.shed.labels("deadline").inc()
                    wait = queue.expected_wait()
                    raise ApiError.of(
                        "overloaded",
                        f"the request waited {job.queue_seconds:.1f} s without reaching the "
                        f"engine (request deadline {self.settings.request_deadline:g} s); the "
                        "server is saturated, retry later",
                        headers=retry_headers(queue.retry_after(wait)),
                    )
                if not done:
                    done, _ = await asyncio.wait(
                        {future, gone}, return_when=asyncio.FIRST_COMPLETED
                    )
            except asyncio.CancelledError:  # shutdown past the drain deadline
                queue.cancel(job)
                raise
            if future not in done:
                dropped = queue.cancel(job)
                if dropped:
                    self.metrics.shed.labels("disconnected").inc()
                info["disconnected"] = "before_start" if dropped else "while_computing"
                raise ClientGone()
            try:
                result = future.result()
            except Overloaded as exc:
                self.metrics.shed.labels(exc.reason).inc()
                raise ApiError.of(
                    "overloaded", exc.message, headers=retry_headers(exc.retry_after)
                ) from None
            except Cancelled:
                raise ClientGone() from None
            except Closed:
                raise ApiError.of("shutting_down", "the server is shutting down",
                                  headers=retry_headers(1.0)) from None
        finally:
            gone.cancel()
            _timing(info, job)
        return result


def is_embedding(engine: Any) -> bool:
    """A model served with ``task: embedding`` (a sentence encoder: /v1/embeddings only)."""
    return getattr(engine, "task", "generate") == "embedding"


def _is_model(source: Any) -> bool:
    return hasattr(source, "answer") or (is_embedding(source) and hasattr(source, "backend"))


def _is_engine_list(source: Any) -> bool:
    return isinstance(source, (list, tuple)) and bool(source) and all(
        _is_model(e) for e in source)


def _engine_cache_stats(engine: Any) -> Any:
    stats = getattr(getattr(engine, "backend", None), "cache_stats", None)
    return stats() if stats else None


def _consume(future: asyncio.Future) -> None:
    """Mark a dropped job's outcome as seen (no "exception was never retrieved" noise)."""
    if not future.cancelled():
        future.exception()


def _timing(info: dict[str, Any], job: Job) -> None:
    info["queue_ms"] = round(job.queue_seconds * 1000, 1)
    info["compute_ms"] = round(job.compute_seconds * 1000, 1)
    if job.cache:
        info["cache"] = job.cache


async def wait_disconnect(request: Request) -> None:
    """Returns when the client closes the connection (the body has been read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _release_date(engine: Any) -> str:
    """The checkpoint's date (YYYY-MM-DD) when it can be found, else "unknown"."""
    model = getattr(getattr(engine, "backend", None), "model", None)
    path = getattr(model, "name_or_path", None) or getattr(
        getattr(model, "config", None), "_name_or_path", None
    )
    try:
        if path and Path(path).exists():
            return date.fromtimestamp(Path(path).stat().st_mtime).isoformat()
    except OSError:
        pass
    return "unknown"


def resident_bytes() -> int | None:
    """This process's resident memory (Linux /proc; None elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
