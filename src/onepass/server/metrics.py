"""Prometheus metrics, on a registry per app (two apps in one process never collide).

Counters and histograms are updated on the request path; the prefix-cache numbers, queue depth
and readiness are read at scrape time from their owners, so they can never drift.

Every label takes its value from a fixed set: a label fed by the client (any token parses as an
HTTP method, any path reaches the router, and 404/405 happen before the key check) would let
anyone create time series without bound.
"""

from __future__ import annotations

from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
ITL_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
STEP_TOKEN_BUCKETS = (1, 4, 16, 64, 128, 256, 512, 1024, 2048)
FINISH_REASONS = frozenset({"stop", "length", "cancelled", "error"})

OTHER = "other"  # the one label value everything outside a fixed set collapses to
UNMATCHED = "unmatched"  # the route label of a request no route matched
HTTP_METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"}
)
# the registered status codes, plus 499 (the client went away before its answer)
HTTP_STATUSES = frozenset({int(s) for s in HTTPStatus} | {499})
QUESTION_TYPES = frozenset({"noul", "choice", "score"})


def method_label(method: str) -> str:
    return method if method in HTTP_METHODS else OTHER


def status_label(status: int) -> str:
    return str(status) if status in HTTP_STATUSES else OTHER


class _CacheCollector(Collector):
    """Prefix-cache statistics straight from the backend at scrape time."""

    def __init__(self, stats: Callable[[], Any | None]):
        self._stats = stats

    def collect(self):
        s = self._stats()
        if s is None:
            return
        for name, value, doc in (
            ("hits", s.hits, "requests whose whole prefix was cached"),
            ("partial_hits", s.partial_hits, "requests that reused a cached leading part"),
            ("misses", s.misses, "requests that computed their prefix from scratch"),
            ("evictions", s.evictions, "prefixes evicted to respect the cache bounds"),
        ):
            c = CounterMetricFamily(f"onepass_prefix_cache_{name}", f"Prefix cache: {doc}.")
            c.add_metric([], value)
            yield c
        g = GaugeMetricFamily("onepass_prefix_cache_entries", "Prefix cache: entries resident.")
        g.add_metric([], s.entries)
        yield g
        g = GaugeMetricFamily(
            "onepass_prefix_cache_resident_tokens", "Prefix cache: tokens resident."
        )
        g.add_metric([], s.resident_tokens)
        yield g


class Metrics:
    """Everything ``GET /metrics`` reports."""

    def __init__(self) -> None:
        disable_created_metrics()  # the *_created series only add noise to every scrape
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "onepass_http_requests", "HTTP requests by route, method and status.",
            ["route", "method", "status"], registry=r,
        )
        self.latency = Histogram(
            "onepass_http_request_duration_seconds", "HTTP request latency by route.",
            ["route"], buckets=LATENCY_BUCKETS, registry=r,
        )
        self.queue_wait = Histogram(
            "onepass_queue_wait_seconds", "Time an answered request waited for a worker.",
            buckets=LATENCY_BUCKETS, registry=r,
        )
        self.compute = Histogram(
            "onepass_compute_seconds", "Engine time of an answered request.",
            buckets=LATENCY_BUCKETS, registry=r,
        )
        self.questions = Counter(
            "onepass_questions_answered", "Questions answered, by type.", ["type"], registry=r
        )
        self.input_tokens = Counter(
            "onepass_input_tokens", "Prompt tokens of answered requests.", registry=r
        )
        self.cached_tokens = Counter(
            "onepass_cached_tokens", "Prompt tokens served from the prefix cache.", registry=r
        )
        self.shed = Counter(
            "onepass_requests_shed",
            "Requests refused or dropped without an answer, by reason "
            "(queue_full, overloaded, deadline, disconnected, loading, shutting_down).",
            ["reason"], registry=r,
        )
        self.in_flight = Gauge(
            "onepass_in_flight_requests", "API requests being handled (queued or computing).",
            registry=r,
        )
        self.queue_depth = Gauge(
            "onepass_queue_depth", "Requests waiting for an engine worker.", registry=r
        )
        self.busy = Gauge("onepass_workers_busy", "Engine workers computing.", registry=r)
        self.ready = Gauge("onepass_ready", "1 once the model is loaded and serving.", registry=r)
        self.startup = Gauge(
            "onepass_startup_seconds", "Seconds from start to the model being ready.", registry=r
        )
        self.weight_bytes = Gauge(
            "onepass_model_weight_bytes",
            "Bytes of model weights resident in memory (quantized layers count their codes).",
            registry=r,
        )

        # generation (OpenAI routes): tokens, latency, and the scheduler's occupancy
        self.gen_prompt_tokens = Counter(
            "onepass_generation_prompt_tokens", "Prompt tokens of finished generations "
            "(a prompt shared by n choices counts once).", registry=r,
        )
        self.gen_cached_tokens = Counter(
            "onepass_generation_cached_tokens",
            "Prompt tokens of finished generations served from the prefix cache.", registry=r,
        )
        self.gen_completion_tokens = Counter(
            "onepass_generation_completion_tokens",
            "Tokens generated (EOS included) by finished generations.", registry=r,
        )
        self.gen_finished = Counter(
            "onepass_generation_sequences", "Finished sequences by finish reason "
            "(stop, length, cancelled, error).", ["reason"], registry=r,
        )
        self.ttft = Histogram(
            "onepass_generation_time_to_first_token_seconds",
            "From a sequence's submission to the scheduler until its first token is sampled.",
            buckets=LATENCY_BUCKETS, registry=r,
        )
        self.itl = Histogram(
            "onepass_generation_inter_token_latency_seconds",
            "Mean time between consecutive tokens of one finished sequence.",
            buckets=ITL_BUCKETS, registry=r,
        )
        self.active_sequences = Gauge(
            "onepass_generation_active_sequences",
            "Sequences holding a generation slot (prefilling or decoding).", registry=r,
        )
        self.waiting_sequences = Gauge(
            "onepass_generation_waiting_sequences",
            "Sequences waiting for a generation slot.", registry=r,
        )
        self.batch_rows = Histogram(
            "onepass_generation_batch_size", "Sequences in one scheduler forward step.",
            buckets=BATCH_BUCKETS, registry=r,
        )
        self.step_tokens = Histogram(
            "onepass_generation_step_tokens",
            "Tokens (decode tokens + prompt chunks) in one scheduler forward step.",
            buckets=STEP_TOKEN_BUCKETS, registry=r,
        )

    def bind(
        self,
        *,
        queue_depth: Callable[[], float],
        busy: Callable[[], float],
        ready: Callable[[], float],
        cache_stats: Callable[[], Any | None],
    ) -> None:
        """Read live values from their owners at scrape time."""
        self.queue_depth.set_function(queue_depth)
        self.busy.set_function(busy)
        self.ready.set_function(ready)
        self.registry.register(_CacheCollector(cache_stats))

    def bind_generation(
        self, *, active: Callable[[], float], waiting: Callable[[], float]
    ) -> None:
        """Read the generation scheduler's occupancy at scrape time (once it exists)."""
        self.active_sequences.set_function(active)
        self.waiting_sequences.set_function(waiting)

    def observe_step(self, rows: int, tokens: int) -> None:
        """One scheduler forward (called on the scheduler's thread)."""
        self.batch_rows.observe(rows)
        self.step_tokens.observe(tokens)

    def observe_sequence(
        self, reason: str, completion_tokens: int, ttft: float | None, itl: float | None
    ) -> None:
        """One finished sequence: its finish reason, tokens and latencies."""
        self.gen_finished.labels(reason if reason in FINISH_REASONS else OTHER).inc()
        self.gen_completion_tokens.inc(completion_tokens)
        if ttft is not None:
            self.ttft.observe(ttft)
        if itl is not None:
            self.itl.observe(itl)

    def observe_prompt(self, prompt_tokens: int, cached_tokens: int) -> None:
        self.gen_prompt_tokens.inc(prompt_tokens)
        self.gen_cached_tokens.inc(cached_tokens)

    def observe_http(self, route: str, method: str, status: int, seconds: float) -> None:
        """Count one HTTP request. ``route`` must be a route's path template (or
        ``UNMATCHED``), never the raw path: the app's route table bounds it."""
        self.requests.labels(route, method_label(method), status_label(status)).inc()
        self.latency.labels(route).observe(seconds)

    def observe_answer(
        self, response: dict[str, Any], queue_seconds: float, compute_seconds: float
    ) -> None:
        self.queue_wait.observe(queue_seconds)
        self.compute.observe(compute_seconds)
        for answer in (response.get("answers") or {}).values():
            if isinstance(answer, dict):
                kind = answer.get("type")
                self.questions.labels(kind if kind in QUESTION_TYPES else OTHER).inc()
        usage = response.get("usage") or {}
        self.input_tokens.inc(usage.get("input_tokens") or 0)
        self.cached_tokens.inc(usage.get("cached_tokens") or 0)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
