"""Server settings: one dataclass, filled from flags (which default to ``ONEPASS_<FLAG>``).

Model settings (model, device, dtype, caches, ...) live with the engine; these are the knobs of
the HTTP layer: where to listen, what to accept, how much to queue and for how long.
"""

from __future__ import annotations

import ipaddress
import math
import re
from dataclasses import dataclass

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
DEFAULT_MAX_BODY_BYTES = 2 * 1024 * 1024
DEFAULT_MAX_QUESTIONS = 64
DEFAULT_MAX_GENERATE_PROMPTS = 512
DEFAULT_MAX_GENERATE_TOKENS = 16384
DEFAULT_MAX_GENERATE_LOGITS = 131072
DEFAULT_MAX_QUEUE = 64
DEFAULT_REQUEST_DEADLINE = 5.0
DEFAULT_DRAIN_SECONDS = 15.0
DEFAULT_WORKERS = 8
DEFAULT_HEADER_TIMEOUT = 10.0
DEFAULT_MAX_CONNECTIONS = 512
LOG_LEVELS = ("debug", "info", "warning", "error")
DEFAULT_LOG_LEVEL = "info"


@dataclass(frozen=True)
class ServerSettings:
    """Everything the HTTP layer needs; see ``onepass serve --help`` for each field."""

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    api_key: str | None = None
    # Cap on the request body, checked on the bytes received and again on the decoded bytes
    # while decoding (a compression bomb stops at the cap, it is never inflated in full).
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    # The engine packs every question of a request into one forward pass: this bounds the
    # work (and memory) one request can ask for. 413 above it.
    max_questions: int = DEFAULT_MAX_QUESTIONS
    # POST /generate (SGLang's scoring shape) packs a batch into one forward the same way:
    # prompts per call, tokens it computes (the common prefix once, then every rest) and
    # logits it returns (prompts x candidate ids) are bounded; 413 above each.
    max_generate_prompts: int = DEFAULT_MAX_GENERATE_PROMPTS
    max_generate_tokens: int = DEFAULT_MAX_GENERATE_TOKENS
    max_generate_logits: int = DEFAULT_MAX_GENERATE_LOGITS
    # Bounded queue in front of the engine; a full queue answers 429 with retry-after.
    max_queue: int = DEFAULT_MAX_QUEUE
    # A request that cannot start within this many seconds of arriving is shed with 429, well
    # before the official client's 10 s read timeout (which would re-send it). It holds until
    # the answer: a decision whose model work the model has not taken by then, and a
    # generation none of whose sequences got a slot by then, are shed the same way.
    request_deadline: float = DEFAULT_REQUEST_DEADLINE
    # Decision requests prepared at once. Their forwards run in the model's shared steps, so
    # concurrent requests are packed into the same forwards; this bounds how many join a step.
    workers: int = DEFAULT_WORKERS
    # On SIGTERM/SIGINT: seconds in-flight requests get to finish before they are abandoned.
    drain_seconds: float = DEFAULT_DRAIN_SECONDS
    log_level: str = DEFAULT_LOG_LEVEL
    # Shown by /v1/models before the model has loaded (the engine's name wins afterwards).
    served_model_name: str | None = None
    # GET / serves the playground page (``--no-playground`` turns it off).
    playground: bool = True
    # A connection whose request head (request line + headers) is not complete this many
    # seconds after it opened (or after a kept-alive request's first byte) is closed.
    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    # Open connections at most; past it the oldest one waiting for a request head is closed.
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    # The address clients use (behind a proxy, or when bound to 0.0.0.0): GET /.skill shows
    # it; None: http://host:port from the two settings above. Never the request's Host header.
    public_url: str | None = None

    def __post_init__(self) -> None:
        # every comparison is False for nan; infinities are refused explicitly (an infinite
        # drain or deadline is no bound, and rounding one for uvicorn raises)
        checks = (
            ("port", 0 <= self.port <= 65535, "an integer from 0 to 65535"),
            ("max_body_bytes", self.max_body_bytes > 0, "an integer > 0"),
            ("max_questions", self.max_questions > 0, "an integer > 0"),
            ("max_generate_prompts", self.max_generate_prompts > 0, "an integer > 0"),
            ("max_generate_tokens", self.max_generate_tokens > 0, "an integer > 0"),
            ("max_generate_logits", self.max_generate_logits > 0, "an integer > 0"),
            ("max_queue", self.max_queue > 0, "an integer > 0"),
            ("request_deadline", 0 < self.request_deadline < math.inf, "a finite number > 0"),
            ("workers", self.workers > 0, "an integer > 0"),
            ("drain_seconds", 0 <= self.drain_seconds < math.inf, "a finite number >= 0"),
            ("header_timeout", 0 < self.header_timeout < math.inf, "a finite number > 0"),
            ("max_connections", self.max_connections > 0, "an integer > 0"),
            ("log_level", self.log_level in LOG_LEVELS, f"one of {', '.join(LOG_LEVELS)}"),
        )
        bad = [f"{name}: expected {what}, got {getattr(self, name)!r}"
               for name, ok, what in checks if not ok]
        if bad:
            raise ValueError(f"invalid server settings: {'; '.join(bad)}")
        if self.public_url is not None and not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?",
                                                            self.public_url):
            raise ValueError(f"public_url: expected http(s)://host[:port][/path], got "
                             f"{self.public_url!r}")
        if self.api_key is not None and (not self.api_key.strip() or " " in self.api_key.strip()):
            raise ValueError("api_key must be a non-empty token without spaces")

    @property
    def base_url(self) -> str:
        """Where clients reach this server: ``public_url``, else ``http://host:port``."""
        if self.public_url is not None:
            return self.public_url.rstrip("/")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def is_loopback(self) -> bool:
        """True when only this machine can reach the server (auth off is then acceptable)."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False
