"""Serve the System One API over HTTP (POST /v1/systemone, GET /v1/models, /health, /metrics).

The server listens at once and loads the model in the background: GET /health/live answers
immediately, GET /health says 503 until the model is ready. Works unmodified with the official
typesafe-sdk client (base URL http://HOST:PORT, any API key unless --api-key is set) and with
`jevbench --url http://HOST:PORT/v1/systemone`.

Every flag also reads ONEPASS_<FLAG> from the environment (ONEPASS_PORT, ONEPASS_API_KEY,
ONEPASS_MAX_QUEUE, ...); precedence: flag > environment > default.

On SIGTERM/SIGINT the server stops accepting connections, answers new requests on open
connections with 503, lets in-flight requests finish for up to --drain-seconds, then exits and
logs how many requests were abandoned. A second SIGINT exits at once.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
from dataclasses import replace
from typing import Any

from onepass.commands.common import (
    add_model_arguments,
    apply_quality,
    apply_weights_file,
    backend_options,
    env_argument,
    non_negative_int,
    positive_int,
)
from onepass.generate.pace import DEFAULT_STREAM_SLOWDOWN
from onepass.server.served_models import (
    ModelsConfigError,
    ModelSpec,
    load_models_config,
    specs_from_flags,
)

HELP = "serve the System One HTTP API (compatible with the official typesafe-sdk client)"

log = logging.getLogger("onepass.server")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from onepass.server import settings as S

    g = parser.add_argument_group("server")
    env_argument(g, "--host", default=S.DEFAULT_HOST,
                 help=f"address to bind (default {S.DEFAULT_HOST}; binding a non-loopback "
                 "address without --api-key logs a warning)")
    env_argument(g, "--port", type=int, default=S.DEFAULT_PORT,
                 help=f"port to bind (default {S.DEFAULT_PORT})")
    env_argument(g, "--api-key",
                 help="require 'Authorization: Bearer <key>' on /v1/* (401 wrong key, 403 "
                 "missing); without it any bearer token (or none) is accepted. Prefer the "
                 "environment (ONEPASS_API_KEY) so the key stays out of process listings")
    env_argument(g, "--max-body-bytes", type=int, default=S.DEFAULT_MAX_BODY_BYTES,
                 help="largest request body, before and after Content-Encoding decoding "
                 f"(default {S.DEFAULT_MAX_BODY_BYTES}); 413 above it")
    env_argument(g, "--max-questions", type=int, default=S.DEFAULT_MAX_QUESTIONS,
                 help="most questions in one request; they share one forward pass "
                 f"(default {S.DEFAULT_MAX_QUESTIONS}); 413 above it")
    env_argument(g, "--max-generate-prompts", type=positive_int,
                 default=S.DEFAULT_MAX_GENERATE_PROMPTS,
                 help="POST /generate: most prompts in one batch (default "
                 f"{S.DEFAULT_MAX_GENERATE_PROMPTS}); 413 above it")
    env_argument(g, "--max-generate-tokens", type=positive_int,
                 default=S.DEFAULT_MAX_GENERATE_TOKENS,
                 help="POST /generate: most tokens one batch computes, its common prefix once "
                 f"and every rest (default {S.DEFAULT_MAX_GENERATE_TOKENS}); 413 above it")
    env_argument(g, "--max-generate-logits", type=positive_int,
                 default=S.DEFAULT_MAX_GENERATE_LOGITS,
                 help="POST /generate: most logits one batch answers with, prompts x candidate "
                 f"ids (default {S.DEFAULT_MAX_GENERATE_LOGITS}); 413 above it")
    env_argument(g, "--max-queue", type=int, default=S.DEFAULT_MAX_QUEUE,
                 help="requests waiting for the engine before new ones get 429 with "
                 f"retry-after (default {S.DEFAULT_MAX_QUEUE})")
    env_argument(g, "--request-deadline", type=float, default=S.DEFAULT_REQUEST_DEADLINE,
                 help="seconds a request may wait for the engine; one that cannot start in "
                 "time gets 429 with retry-after instead of a late answer (default "
                 f"{S.DEFAULT_REQUEST_DEADLINE:g}, well under the client's 10 s timeout)")
    env_argument(g, "--workers", type=int, default=S.DEFAULT_WORKERS,
                 help=f"decision requests prepared at once (default {S.DEFAULT_WORKERS}); their "
                 "forwards are packed into the model's shared steps")
    env_argument(g, "--threads", type=non_negative_int, default=0,
                 help="CPU threads for the model's forward passes (default 0: the torch "
                 "default, one per core). On a CPU shared with other busy processes, 1 avoids "
                 "thread oversubscription, which can make every forward several times slower")
    env_argument(g, "--drain-seconds", type=float, default=S.DEFAULT_DRAIN_SECONDS,
                 help="on SIGTERM/SIGINT, how long in-flight requests may finish "
                 f"(default {S.DEFAULT_DRAIN_SECONDS:g})")
    env_argument(g, "--header-timeout", type=float, default=S.DEFAULT_HEADER_TIMEOUT,
                 help="seconds a connection may take to send its request line and headers "
                 "(from opening, or from a kept-alive request's first byte); slower ones are "
                 f"closed (default {S.DEFAULT_HEADER_TIMEOUT:g})")
    env_argument(g, "--max-connections", type=positive_int, default=S.DEFAULT_MAX_CONNECTIONS,
                 help="open connections at most; past it the oldest connection still waiting "
                 "for a request head is closed, so idle connections cannot lock clients out "
                 f"(default {S.DEFAULT_MAX_CONNECTIONS}; keep it under the file limit, "
                 "ulimit -n)")
    env_argument(g, "--public-url",
                 help="the URL clients reach this server at (behind a proxy, or bound to "
                 "0.0.0.0), shown by GET /.skill; default http://HOST:PORT from --host/--port "
                 "(the request's Host header is never used)")
    env_argument(g, "--log-level", default=S.DEFAULT_LOG_LEVEL, choices=S.LOG_LEVELS,
                 help=f"log level (default {S.DEFAULT_LOG_LEVEL}); logs are JSON lines on "
                 "stderr, one per API request")
    env_argument(g, "--no-playground", action=_SwitchAction, type=_switch, default=False,
                 help="do not serve the playground page at GET / (it is public: the page "
                 "holds no data, and its API calls send the key you type)")
    add_model_arguments(parser, several=True)
    m = parser.add_argument_group("several models")
    m.add_argument("--served-model", action="append",
                   help="the name of the matching --model (repeat it, one per --model; default: "
                   "the model's own name); every route selects a model by this name")
    env_argument(m, "--models-config",
                 help="a JSON array of model entries (model, served_model, device, dtype, "
                 "adapter, context_path, max_input_tokens, max_concurrency, "
                 "default_max_output_tokens, task) served together; an entry's keys override the "
                 "model flags; instead of --model")
    env_argument(m, "--task", default="generate", choices=["generate", "embedding"],
                 help="per model: generate (default: decisions, generation, and embeddings "
                 "mean-pooled from the decoder) or embedding (a sentence-embedding checkpoint "
                 "such as all-minilm-l6-v2; it serves POST /v1/embeddings only)")
    env_argument(m, "--max-concurrency", type=positive_int, default=8,
                 help="per model: decision requests prepared at once and generations running "
                 "at once (default 8); each model has its own queue")
    env_argument(m, "--max-request-sequences", type=positive_int, default=None,
                 help="per model: the most sequences of one generation request (its n) running "
                 "at once; the rest follow as they end (default: half of --max-concurrency)")
    env_argument(m, "--stream-slowdown", type=stream_slowdown, default=DEFAULT_STREAM_SLOWDOWN,
                 help="while streams decode, a step carries only the other work (decisions, "
                 "prompt chunks, embeddings, scoring) that keeps it within this many times a "
                 "decode-only step, measured as it runs (default 1.5; 0: the whole step budget, "
                 "which favours the other work's latency over the streams' pace)")
    env_argument(m, "--default-max-output-tokens", type=positive_int, default=1024,
                 help="per model: the output limit of a generation that names none (default "
                 "1024, capped by the context left)")


def stream_slowdown(text: str) -> float:
    """A finite number > 1, or 0 for no bound."""
    try:
        value: float | None = float(text)
    except ValueError:
        value = None
    if value is None or not (value == 0 or 1 < value < math.inf):
        raise argparse.ArgumentTypeError(f"expected 0 or a finite number > 1, got {text!r}")
    return value


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def _switch(text: str) -> bool:
    """An on/off environment value (ONEPASS_NO_PLAYGROUND=1); anything else is an error."""
    value = text.strip().lower()
    if value in _TRUE or value in _FALSE:
        return value in _TRUE
    raise argparse.ArgumentTypeError(f"expected one of {', '.join(_TRUE + _FALSE[:-1])}, "
                                     f"got {text!r}")


class _SwitchAction(argparse.Action):
    """A flag without a value that can also come from the environment: ``store_true`` would
    take any environment text (even "0") as on; this one reads it through ``_switch``."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any):
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        # given on the command line: no values; from the environment: [parsed bool]
        setattr(namespace, self.dest, bool(values[0]) if values else True)


def _switch_value(value: Any) -> bool:
    """The environment path stores the converted list ([bool]); the flag stores a bool."""
    return bool(value[0]) if isinstance(value, list) else bool(value)


def settings_from_args(args: argparse.Namespace) -> Any:
    from onepass.server.settings import ServerSettings

    try:
        return ServerSettings(
            host=args.host,
            port=args.port,
            api_key=args.api_key or None,
            max_body_bytes=args.max_body_bytes,
            max_questions=args.max_questions,
            max_generate_prompts=args.max_generate_prompts,
            max_generate_tokens=args.max_generate_tokens,
            max_generate_logits=args.max_generate_logits,
            max_queue=args.max_queue,
            request_deadline=args.request_deadline,
            workers=args.workers,
            drain_seconds=args.drain_seconds,
            log_level=args.log_level,
            served_model_name=args.served_model_name,
            playground=not _switch_value(args.no_playground),
            header_timeout=args.header_timeout,
            max_connections=args.max_connections,
            public_url=args.public_url or None,
        )
    except ValueError as exc:
        raise SystemExit(f"onepass serve: error: {exc}") from None


def model_specs(args: argparse.Namespace) -> list[Any]:
    """The models to keep resident: from --models-config, else one per --model."""
    base = ModelSpec(
        model=None, served_model=args.served_model_name, device=args.device, dtype=args.dtype,
        adapter=args.adapter, context_path=args.context_path,
        max_input_tokens=args.max_input_tokens, max_concurrency=args.max_concurrency,
        default_max_output_tokens=args.default_max_output_tokens, task=args.task,
        backend=args.backend, engine=args.engine, engine_url=args.engine_url,
        engine_api_key=args.engine_api_key or None,
    )
    if args.models_config:
        if args.model or args.served_model or args.weights_file:
            raise ModelsConfigError("--models-config replaces --model/--served-model/"
                                    "--weights-file: give one or the other")
        return load_models_config(args.models_config, base)
    backend_options(args)  # --backend remote without --engine/--engine-url: the flags' message
    apply_weights_file(args)
    return specs_from_flags(args.model, args.served_model, base)


def engine_from_spec(spec: Any, args: argparse.Namespace) -> Any:
    if spec.task == "embedding":
        from onepass.backends.encoder import EmbeddingEngine

        return EmbeddingEngine.from_pretrained(
            spec.model, served_name=spec.served_model, device=spec.device,
            max_input_tokens=spec.max_input_tokens, max_concurrency=spec.max_concurrency)
    from onepass.engine import DecisionEngine, EngineConfig

    shared = EngineConfig(  # the flags every resident model shares
        session_cache_entries=args.session_cache_entries,
        session_cache_tokens=args.session_cache_tokens, temperature=args.temperature,
        compute=getattr(args, "compute", None), n_ctx=args.n_ctx, n_threads=args.n_threads)
    engine = DecisionEngine.from_config(spec.model, replace(
        shared, device=spec.device, dtype=spec.dtype, context_path=spec.context_path,
        adapter=spec.adapter, max_input_tokens=spec.max_input_tokens,
        served_name=spec.served_model, backend=spec.backend, engine=spec.engine,
        engine_url=spec.engine_url, engine_api_key=spec.engine_api_key))
    apply_quality(engine, args)
    engine.max_concurrency = spec.max_concurrency
    engine.generation_options = {"max_sequences": spec.max_concurrency,
                                 "default_max_output_tokens": spec.default_max_output_tokens,
                                 "max_request_sequences": args.max_request_sequences,
                                 "stream_slowdown": args.stream_slowdown or None}
    return engine


def warn_if_open(settings: Any) -> None:
    """Auth off is fine on loopback; anywhere else it deserves a loud warning."""
    if settings.api_key is not None:
        log.info("auth on: /v1/* requires 'Authorization: Bearer <key>'")
    elif settings.is_loopback:
        log.info("auth off: any bearer token is accepted (loopback only)")
    else:
        log.warning(
            "!!! SECURITY WARNING: listening on %s without --api-key: anyone who can reach "
            "this address can use the model. Set ONEPASS_API_KEY or bind 127.0.0.1 !!!",
            settings.host,
        )


def run(args: argparse.Namespace) -> int:
    try:  # the server extra; a first-party import error below is a bug, never hidden here
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn
        import zstandard  # noqa: F401
    except ImportError as exc:
        raise SystemExit(
            f"onepass serve needs the server extra ({exc.name} is missing): "
            "pip install 'onepass[server]'"
        ) from None
    from onepass.server import logs
    from onepass.server.app import create_app
    from onepass.server.connections import protocol_class

    settings = settings_from_args(args)
    logs.configure(settings.log_level)
    warn_if_open(settings)
    shown = {k: v for k, v in vars(settings).items() if k != "api_key"}
    shown["auth"] = settings.api_key is not None
    log.info("starting", extra={"fields": {"settings": shown, "model": args.model,
                                           "threads": args.threads or "default"}})
    try:
        specs = model_specs(args)
    except ModelsConfigError as exc:
        raise SystemExit(f"onepass serve: {exc}") from None

    def load() -> Any:
        if args.threads > 0:
            import torch

            torch.set_num_threads(args.threads)
        return [engine_from_spec(spec, args) for spec in specs]

    app = create_app(load, settings)
    runtime = app.state.runtime
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=max(1, round(settings.drain_seconds)),
        # longer than the official client's 30 s keep-alive, so the server never closes a
        # connection the client is about to reuse
        timeout_keep_alive=75,
        server_header=False,
        # uvicorn's h11 protocol plus a request-head deadline and a connection cap
        http=protocol_class(settings.header_timeout, settings.max_connections),
    )
    server = _draining_server(config, runtime)

    def load_failed() -> None:
        server.should_exit = True

    runtime.on_load_failure = load_failed
    server.run()
    code = 1 if runtime.load_error else 0
    if runtime.queue.busy:
        # A forward pass abandoned at the drain deadline is still running on a worker thread;
        # interpreter teardown under a running torch op aborts the process, so leave now.
        log.info("exiting with a forward pass still running", extra={"fields": {"code": code}})
        logging.shutdown()
        os._exit(code)
    return code


def _draining_server(config: Any, runtime: Any) -> Any:
    """uvicorn's graceful shutdown, plus: new requests get 503 and /health turns 503 as soon
    as the signal arrives, and the process exits with a status instead of re-raising it."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            runtime.begin_drain(signal.Signals(sig).name)
            super().handle_exit(sig, frame)
            self._captured_signals.clear()

    return DrainingServer(config)
