"""Decisions computed by a remote engine (SGLang, vLLM, llama-server, onepass).

The prompt is rendered here, by the engine's own checkpoint tokenizer and chat template (one
renderer for every backend, so answers agree), and sent as token ids; the engine returns the
log-probabilities of exactly the candidate label ids (:mod:`.dialects`). At start-up the local
tokenizer is checked against the engine's: a mismatch refuses to start, naming the first
differing token. Engine faults become :class:`EngineError` — an HTTP 502 (the engine answered
badly), 503 (unreachable; retry-after) or 504 (too slow) in the server's error envelope.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from onepass.backends.base import ScoreResult
from onepass.backends.remote import dialects as D
from onepass.cache import CacheStats
from onepass.server.errors import ApiError, retry_headers
from onepass.server.served_models import ENGINES

PROBE_TEXTS = (
    "Answer with one letter.\nA. yes\nB. no\nAnswer: A",
    "  Hello, world! 123 {\"key\": [1, 2.5, null]} — café naïve 日本語\n\tend",
)


class EngineError(ApiError):
    """A remote engine failure, rendered by the server as 502/503/504 (never a 500)."""

    def __init__(self, status: int, message: str, *, retry_after: float | None = None,
                 upstream: int | None = None):
        kind = {503: "engine_unavailable", 504: "engine_timeout"}.get(status, "engine_error")
        headers = retry_headers(retry_after) if retry_after else None
        super().__init__(status, message, kind, headers=headers)
        self.upstream = upstream  # the engine's own HTTP status, when it answered one


class RemoteBackend:
    """The backend protocol over HTTP: tokenizer local, forward passes remote."""

    def __init__(self, engine: str, url: str, tokenizer: Any, *, name: str,
                 model: str | None = None, timeout: float = 60.0, client: Any = None,
                 parallel: int = 8, verify: bool = True, api_key: str | None = None):
        import httpx

        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
        self.engine = engine
        self.url = url.rstrip("/")
        self.tokenizer = tokenizer
        self.name = name
        self.model = model or name  # the name the engine knows the model by (vLLM's "model")
        self.timeout = timeout
        # the key lives in the client's headers only: never an attribute, a log or a message
        headers = {"authorization": f"Bearer {api_key}"} if api_key else None
        self.client = client or httpx.Client(base_url=self.url, timeout=timeout, headers=headers)
        self.chat_template = getattr(tokenizer, "chat_template", None)
        specials = {str(t) for t in tokenizer.all_special_tokens}
        specials |= {t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values()
                     if getattr(t, "special", False)}
        self.special_tokens = tuple(sorted(specials))
        probe = tokenizer("a", add_special_tokens=True)["input_ids"]
        bos = tokenizer.bos_token_id
        self.bos_id = bos if bos is not None and probe and probe[0] == bos else None
        self._pool = ThreadPoolExecutor(max(1, parallel), thread_name_prefix="onepass-remote")
        self._tokenizer_lock = threading.Lock()
        self._stats = CacheStats()
        self.requests = 0
        self._vllm_labels: bool | None = None  # label reads: unknown until the first answer
        if verify:
            if model is None and engine in ("vllm", "onepass"):
                self.model = self.served_model(name)
            try:
                self.verify_tokenizer()
            except EngineError as exc:
                # a router's placeholder listing (sglang-router lists "unknown" for workers
                # without SGLang's model-info route): the checkpoint's own name, tried once
                if exc.upstream != 404 or self.model == name:
                    raise
                self.model = name
                self.verify_tokenizer()

    @classmethod
    def connect(cls, engine: str, url: str, model: str | None, **kwargs: Any) -> RemoteBackend:
        """Tokenizer and chat template of checkpoint ``model`` (resolved like any model)."""
        from transformers import AutoTokenizer

        from onepass.models import resolve

        resolved = resolve(model)
        tokenizer = AutoTokenizer.from_pretrained(resolved.path)
        return cls(engine, url, tokenizer, name=resolved.name, **kwargs)

    # ------------------------------------------------------------------ HTTP

    def _post(self, path: str, body: dict[str, Any] | None) -> Any:
        """``body`` sent to ``path`` (None: a GET), the engine's JSON answer returned; every
        fault an :class:`EngineError`."""
        import httpx

        try:
            response = (self.client.get(path) if body is None
                        else self.client.post(path, json=body))
        except httpx.TransportError as exc:
            raise self._unreachable(path, exc) from None
        if response.status_code >= 400:
            raise self._refusal(path, response)
        try:
            return response.json()
        except ValueError:
            raise EngineError(502, f"the {self.engine} engine answered {path} with a body "
                              f"that is not JSON: {_excerpt(response)}") from None

    def _unreachable(self, path: str, exc: Exception) -> EngineError:
        """A transport fault: a timeout is a 504; anything else (refused, reset) a 503."""
        import httpx

        if isinstance(exc, httpx.TimeoutException):
            return EngineError(504, f"the {self.engine} engine at {self.url} did not answer "
                               f"{path} within {self.timeout:g} s")
        return EngineError(503, f"the {self.engine} engine at {self.url} is unreachable "
                           f"({exc.__class__.__name__}: {exc}); retry when it is back",
                           retry_after=5.0)

    def _refusal(self, path: str, response: Any, *, client_body: bool = False) -> ApiError:
        """The error for an engine's HTTP error ``response`` to ``path``. A 4xx to a body the
        client wrote (``client_body``: a forwarded generation request) is the client's 400,
        with the engine's words; to a body onepass built, the engine's fault (502)."""
        status = response.status_code
        if status in (401, 403):
            return EngineError(502, f"the {self.engine} engine refused {path} with HTTP "
                               f"{status}: it needs an API key (--engine-api-key / "
                               "ONEPASS_ENGINE_API_KEY / the models-config key "
                               "engine_api_key), or the key sent is wrong", upstream=status)
        if status == 503:
            return EngineError(503, f"the {self.engine} engine is not ready "
                               f"({_excerpt(response)})", retry_after=5.0)
        if client_body and 400 <= status < 500:
            return ApiError(400, f"the {self.engine} engine refused the request ({path}, HTTP "
                            f"{status}): {_excerpt(response)}", "invalid_request_error")
        return EngineError(502, f"the {self.engine} engine answered {path} with HTTP "
                           f"{status}: {_excerpt(response)}", upstream=status)

    @contextlib.asynccontextmanager
    async def forward_openai(self, path: str, body: dict[str, Any]) -> AsyncIterator[Any]:
        """A client's OpenAI generation request (``path``: /v1/chat/completions,
        /v1/completions, /v1/responses), sent on to the engine as written, under the engine's
        own model name; yields the engine's answer (status 200, body still streaming). A
        refusal of the engine's is raised before anything is yielded (:meth:`_refusal`); a
        fault while streaming is an :class:`EngineError`. Leaving the block closes the
        connection, which tells the engine to stop."""
        import httpx

        client = httpx.AsyncClient(base_url=self.url, timeout=self.timeout,
                                   headers=self.client.headers)
        try:
            async with client.stream("POST", path, json={**body, "model": self.model}) as answer:
                if answer.status_code >= 400:
                    await answer.aread()
                    raise self._refusal(path, answer, client_body=True)
                yield answer
        except httpx.TransportError as exc:
            raise self._unreachable(path, exc) from None
        finally:
            await client.aclose()

    def served_model(self, name: str) -> str:
        """The name the engine serves the checkpoint under (vLLM's ``--served-model-name``,
        a onepass worker's ``--served-model``), from its ``/v1/models``: ``name`` when it is
        listed, else the one model listed; an engine listing several others is refused
        naming them (a request there would be a 404 per call, not one start-up error)."""
        try:
            body = self._post("/v1/models", None)
        except EngineError as exc:
            if exc.upstream == 404:
                return name  # no model list: the engine takes any name (or none)
            raise
        listed = body.get("data") if isinstance(body, dict) else None
        ids = [m["id"] for m in listed or ()
               if isinstance(m, dict) and isinstance(m.get("id"), str)]
        if name in ids or not ids:
            return name
        if len(ids) == 1:
            return ids[0]
        raise EngineError(502, f"the {self.engine} engine at {self.url} serves "
                          f"{', '.join(map(repr, ids))} and none of them is {name!r}: start it "
                          "with one model, or name the checkpoint it serves")

    def health(self) -> tuple[bool, str]:
        """(ok, detail): whether the engine answers its health route now. SGLang and onepass
        engines may sit behind sglang-router, whose ``/health`` is 200 while no worker is
        healthy: its ``/readiness`` (503 then) is asked first; 404 there means no router."""
        paths = ("/readiness", "/health") if self.engine in ("sglang", "onepass") else (
            "/health",)
        for path in paths:
            try:
                response = self.client.get(path, timeout=min(5.0, self.timeout))
            except Exception as exc:  # any transport fault means "not healthy now"
                return False, f"{exc.__class__.__name__}: {exc}"
            if response.status_code != 404:
                break  # a router's readiness, or the engine's own health
        return response.status_code == 200, f"{path}: HTTP {response.status_code}"

    # ------------------------------------------------------------------ tokenizer

    def encode(self, text: str, *, bos: bool = True) -> list[int]:
        with self._tokenizer_lock:
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if bos and self.bos_id is not None and (not ids or ids[0] != self.bos_id):
            ids = [self.bos_id, *ids]
        return list(ids)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids))

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                  add_generation_prompt=True)

    def remote_tokens(self, text: str) -> list[int] | list[str]:
        """The engine's tokenization of ``text`` (ids; token texts for onepass)."""
        if self.engine == "sglang":
            try:
                body = self._post("/tokenize", D.sglang_tokenize_body(text))
                return list(D._need(body, "tokens"))
            except EngineError as exc:
                if exc.upstream != 404:
                    raise
            # sglang-router forwards no /tokenize: the ids SGLang reports for a text prompt
            body = self._post("/generate", D.sglang_text_tokens_body(text))
            return self._read(D.sglang_parse_text_tokens, body, self.bos_id)
        if self.engine == "vllm":
            body = self._post("/tokenize", D.vllm_tokenize_body(self.model, text))
            return list(D._need(body, "tokens"))
        if self.engine == "llama-server":
            body = self._post("/tokenize", D.llama_server_tokenize_body(text))
            return list(D._need(body, "tokens"))
        body = self._post("/v1/completions", D.echo_tokenize_body(self.model, text))
        return D.echo_parse_tokens(body)

    def verify_tokenizer(self) -> None:
        """Refuse to start when the engine tokenizes differently (names the first token)."""
        texts = list(PROBE_TEXTS)
        if self.chat_template:
            texts.append(self.render_chat([{"role": "user", "content": "Is it on? Yes/No"}]))
        for text in texts:
            local = self.encode(text, bos=False)
            remote = self.remote_tokens(text)
            if remote and isinstance(remote[0], str):
                local_view: list[Any] = [self.decode([t]) for t in local]
            else:
                local_view = local
            if local_view != list(remote):
                i = next((k for k, (a, b) in enumerate(zip(local_view, remote)) if a != b),
                         min(len(local_view), len(remote)))
                mine = local_view[i] if i < len(local_view) else "(end)"
                theirs = remote[i] if i < len(remote) else "(end)"
                raise EngineError(
                    502, f"the {self.engine} engine at {self.url} tokenizes differently from "
                    f"the checkpoint {self.name!r}: first difference at token {i} of "
                    f"{text[:40]!r}…: local {mine!r}, engine {theirs!r}; serve the same "
                    "checkpoint on both sides")

    # ------------------------------------------------------------------ scoring

    def _score_prompts(self, prompts: list[list[int]], candidates: Sequence[Sequence[int]]
                       ) -> tuple[list[list[float]], int]:
        self.requests += 1
        if self.engine == "sglang":
            body = self._post("/generate", D.sglang_score_body(prompts, candidates))
            logits, cached = self._read(D.sglang_parse_score, body, candidates)
            return logits, min(cached) if cached else 0
        if self.engine == "vllm":
            return self._vllm_scores(prompts, candidates)
        if self.engine == "llama-server":
            def one(i: int) -> tuple[list[float], int]:
                body = self._post("/completion",
                                  D.llama_server_score_body(prompts[i], candidates[i]))
                return self._read(D.llama_server_parse_score, body, candidates[i])
            results = list(self._pool.map(one, range(len(prompts))))
            return [r[0] for r in results], min(r[1] for r in results)
        body = self._post("/generate", D.onepass_score_body(prompts, candidates))
        logits, cached = self._read(D.sglang_parse_score, body, candidates,
                                    "output_token_ids_logits")
        return logits, min(cached) if cached else 0

    def _vllm_scores(self, prompts: list[list[int]], candidates: Sequence[Sequence[int]]
                     ) -> tuple[list[list[float]], int]:
        """Label reads (:func:`D.vllm_label_body`): the first prompt alone, then the rest in
        one call, so the engine computes the shared state once and every other prompt reads
        it from its prefix cache (prompts scheduled in the same step would each compute it).
        An engine without label reads gets the per-candidate prompt dialect from then on."""
        if self._vllm_labels is not False:
            try:
                first = [self._vllm_labels_call(prompts[:1], candidates[:1])]
                if len(prompts) > 1:
                    first.append(self._vllm_labels_call(prompts[1:], candidates[1:]))
                self._vllm_labels = True
                return ([row for logits, _ in first for row in logits],
                        min(cached for _, cached in first))
            except D.DialectError:
                if self._vllm_labels:
                    raise EngineError(502, f"the {self.engine} engine's answer had no label "
                                      "log-probabilities") from None
                self._vllm_labels = False
        body = self._post("/v1/completions", D.vllm_score_body(self.model, prompts, candidates))
        return self._read(D.vllm_parse_score, body, prompts, candidates)

    def _vllm_labels_call(self, prompts: list[list[int]], candidates: Sequence[Sequence[int]]
                          ) -> tuple[list[list[float]], int]:
        body = self._post("/v1/completions", D.vllm_label_body(self.model, prompts, candidates))
        return D.vllm_parse_labels(body, prompts, candidates)  # DialectError: no label reads

    def _read(self, parse: Any, body: Any, *args: Any) -> Any:
        try:
            return parse(body, *args)
        except (D.DialectError, KeyError, TypeError, ValueError) as exc:
            raise EngineError(502, f"the {self.engine} engine's answer could not be read: "
                              f"{exc}") from None

    def score(self, prefix: Sequence[int], suffixes: Sequence[Sequence[int]],
              candidates: Sequence[Sequence[int]]) -> ScoreResult:
        if len(suffixes) != len(candidates):
            raise ValueError("one candidate list per suffix is needed")
        if not suffixes:
            return ScoreResult([], 0)
        prompts = [[*prefix, *s] for s in suffixes]
        logits, cached = self._score_prompts(prompts, candidates)
        self._stats.hits += 1 if cached else 0
        self._stats.misses += 0 if cached else 1
        return ScoreResult(logits, min(cached, len(prefix)))

    def prefill(self, prefix: Sequence[int]) -> int:
        """The engine caches what it computes; nothing to do ahead of a request."""
        return 0

    def reference_logits(self, tokens: Sequence[int], candidates: Sequence[int]) -> list[float]:
        return self._score_prompts([list(tokens)], [list(candidates)])[0][0]

    def generate(self, tokens: Sequence[int], max_new_tokens: int, *, stop: Any = None,
                 candidates: Sequence[int] = ()) -> tuple[list[int], list[float], int]:
        """Candidate logits at the end of ``tokens`` (schema decisions). Open-ended
        generation over a remote engine is not offered: such a schema is refused."""
        if max_new_tokens > 0:
            raise EngineError(502, "open schema fields need generation, which the remote "
                              "backend does not offer; use --backend torch or llamacpp")
        if not candidates:
            return [], [], 0
        logits, cached = self._score_prompts([list(tokens)], [list(candidates)])
        return [], logits[0], cached

    def cache_stats(self) -> CacheStats:
        s = self._stats
        return CacheStats(s.hits, s.partial_hits, s.misses, 0, 0, 0)

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        self.client.close()


def _excerpt(response: Any) -> str:
    try:
        body = response.json()
        error = body.get("error") if isinstance(body, dict) else None
        text = (error.get("message") if isinstance(error, dict) else error) or body
    except ValueError:
        text = response.text
    return str(text)[:300]
