"""Embeddings on the wire: a ``/v1/embeddings`` body → :class:`EmbeddingRequest` (texts or
token-id arrays, ``dimensions``, ``encoding_format``), and vectors → the list object (float or
base64). Pure."""

from __future__ import annotations

import base64
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from onepass.contract import ContractError, _describe
from onepass.server.openai.common import (
    EMBEDDING_FIELDS,
    ENCODING_FORMATS,
    MAX_EMBEDDING_INPUTS,
    _bool,
    _check_fields,
    _int,
    _model,
)


@dataclass(frozen=True)
class EmbeddingRequest:
    """A validated /v1/embeddings body: texts (or token-id arrays), in order."""

    model: str | None
    inputs: list[str | list[int]]
    dimensions: int | None
    encoding_format: str


# Token ids carry no tokenizer: OpenAI reads them as tiktoken ids, LangChain's OpenAIEmbeddings
# sends tiktoken ids by default, and most of them fall inside this model's vocabulary too, so
# they would be read as other words without any error. They are taken only when the request
# says they are the served model's own (model_token_ids: true).
FOREIGN_TOKEN_IDS = (
    "token-id input is read as the served model's own token ids, which a client cannot be "
    "assumed to send (LangChain's OpenAIEmbeddings sends tiktoken ids by default); send text "
    "(LangChain: check_embedding_ctx_length=False), or add model_token_ids: true when the ids "
    "come from this model's tokenizer")


def parse_embeddings(body: Any) -> EmbeddingRequest:
    body = _check_fields(body, EMBEDDING_FIELDS, "POST /v1/embeddings")
    raw = body.get("input")
    inputs: list[Any] = [raw] if isinstance(raw, str) else raw
    if isinstance(raw, list) and raw and all(
            isinstance(t, int) and not isinstance(t, bool) for t in raw):
        inputs = [raw]  # one input given as token ids
    if not isinstance(inputs, list) or not inputs:
        raise ContractError("input", "expected a non-empty string or an array of strings, got "
                            f"{_describe(raw)}")
    if len(inputs) > MAX_EMBEDDING_INPUTS:
        raise ContractError("input", f"{len(inputs)} inputs is over the limit of "
                            f"{MAX_EMBEDDING_INPUTS}; send several requests")
    own_ids = _bool(body, "model_token_ids")
    for i, item in enumerate(inputs):
        ok = (isinstance(item, str) and item) or (isinstance(item, list) and item and all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in item))
        if not ok:
            raise ContractError(f"input[{i}]", "expected a non-empty string or token ids, got "
                                f"{_describe(item)}")
        if isinstance(item, list) and not own_ids:
            raise ContractError(f"input[{i}]", FOREIGN_TOKEN_IDS)
    fmt = body.get("encoding_format", "float")
    if fmt not in ENCODING_FORMATS:
        raise ContractError("encoding_format", f"expected float or base64, got {_describe(fmt)}")
    return EmbeddingRequest(_model(body), list(inputs), _int(body, "dimensions", 1, None), fmt)


def embedding_vector(vector: Sequence[float], dimensions: int | None, fmt: str) -> Any:
    """Truncated to ``dimensions`` (when given), then L2-normalised; base64 is the raw
    little-endian float32 bytes, as OpenAI sends them."""
    cut = list(vector[:dimensions] if dimensions else vector)
    norm = math.sqrt(sum(x * x for x in cut)) or 1.0
    cut = [x / norm for x in cut]
    if fmt == "base64":
        return base64.b64encode(struct.pack(f"<{len(cut)}f", *cut)).decode("ascii")
    return cut


def embeddings_response(model: str, vectors: Sequence[Sequence[float]], req: EmbeddingRequest,
                        prompt_tokens: int) -> dict[str, Any]:
    return {"object": "list", "model": model,
            "data": [{"object": "embedding", "index": i,
                      "embedding": embedding_vector(v, req.dimensions, req.encoding_format)}
                     for i, v in enumerate(vectors)],
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}
