"""OpenAI wire translation for generation: request bodies → what a route needs, and generated
rows → the objects the official SDK parses. Pure (no web framework, no model). One module per
dialect (:mod:`.chat`, :mod:`.completions`, :mod:`.responses`, :mod:`.embeddings`) over what they
share (:mod:`.common`); this package re-exports them, so a route reads ``W.parse_chat``.

Three dialects share one sampler (`SamplingParams`, validated under the OpenAI field names):

- Chat Completions: ``messages``, ``max_tokens``/``max_completion_tokens``, ``n``,
  ``logprobs`` (bool) + ``top_logprobs``, ``stream`` + ``stream_options.include_usage``.
- Completions: ``prompt`` (a string or token ids), ``echo``, ``logprobs`` (int), ``max_tokens``
  (0 with ``echo`` scores the prompt only).
- Responses: ``input`` (a string or message items), ``instructions``, ``max_output_tokens``,
  ``store``, ``previous_response_id``.

Structured output: ``response_format`` (chat; ``text``, ``json_object``, ``json_schema``),
``text.format`` (responses) and the ``grammar`` extension (chat, completions: Lark or GBNF)
become one :class:`~onepass.generate.grammar.GrammarSpec` per request, which the route compiles
before the request takes a slot; the grammar then masks every token.

Function tools: ``tools``, ``tool_choice``, ``parallel_tool_calls`` (chat and responses) become
a :class:`~onepass.generate.tools.ToolSpec`; assistant ``tool_calls`` + ``tool`` messages
(chat) and ``function_call`` + ``function_call_output`` items (responses) carry a conversation
on. Rendering, forcing and parsing the calls live in :mod:`onepass.generate.tools`.

Every fault is a `ContractError` naming the user-facing field. A field that would change the
answer but is not implemented (tools, response formats, ...) is refused with a 400 that says so,
never ignored; fields that change nothing here (``user``, ``metadata``, ...) are accepted and
reported (:func:`ignored_fields`: the x-onepass-ignored-fields header and the access log).
"""

from __future__ import annotations

from onepass.server.openai.chat import (
    ChatRequest,
    assistant_message,
    chat_chunk,
    chat_completion,
    chat_logprobs,
    chat_messages,
    parse_chat,
    tool_call_deltas,
    usage_chunk,
)
from onepass.server.openai.common import (
    _NEUTRAL,
    CHAT_FIELDS,
    COMPLETION_FIELDS,
    DONE,
    EMBEDDING_FIELDS,
    ENCODING_FORMATS,
    HARMLESS_FIELDS,
    INPUT_ITEMS_DEFAULT_LIMIT,
    INPUT_ITEMS_MAX_LIMIT,
    MAX_CHOICES,
    MAX_COMPLETION_LOGPROBS,
    MAX_EMBEDDING_INPUTS,
    MAX_METADATA_PAIRS,
    RESPONSES_FIELDS,
    SAMPLING_FIELDS,
    STREAM_OPTIONS,
    TEXT_KEYS,
    TOOL_FIELDS,
    Choice,
    Usage,
    error_event,
    ignored_fields,
    new_id,
    sse,
)
from onepass.server.openai.completions import (
    CompletionRequest,
    TextLogprobs,
    parse_completion,
    text_completion,
)
from onepass.server.openai.embeddings import (
    FOREIGN_TOKEN_IDS,
    EmbeddingRequest,
    embedding_vector,
    embeddings_response,
    parse_embeddings,
)
from onepass.server.openai.responses import (
    ResponsesRequest,
    function_call_item,
    input_items_page,
    item_message,
    items_messages,
    output_item_events,
    output_message,
    output_text,
    parse_input,
    parse_responses,
    reasoning_item,
    response_object,
    response_status,
)

__all__ = [
    "CHAT_FIELDS",
    "COMPLETION_FIELDS",
    "Choice",
    "DONE",
    "EMBEDDING_FIELDS",
    "ENCODING_FORMATS",
    "HARMLESS_FIELDS",
    "INPUT_ITEMS_DEFAULT_LIMIT",
    "INPUT_ITEMS_MAX_LIMIT",
    "MAX_CHOICES",
    "MAX_COMPLETION_LOGPROBS",
    "MAX_EMBEDDING_INPUTS",
    "MAX_METADATA_PAIRS",
    "RESPONSES_FIELDS",
    "SAMPLING_FIELDS",
    "STREAM_OPTIONS",
    "TEXT_KEYS",
    "TOOL_FIELDS",
    "Usage",
    "error_event",
    "ignored_fields",
    "new_id",
    "sse",
    "_NEUTRAL",
    "ChatRequest",
    "assistant_message",
    "chat_chunk",
    "chat_completion",
    "chat_logprobs",
    "chat_messages",
    "parse_chat",
    "tool_call_deltas",
    "usage_chunk",
    "CompletionRequest",
    "TextLogprobs",
    "parse_completion",
    "text_completion",
    "ResponsesRequest",
    "function_call_item",
    "input_items_page",
    "item_message",
    "items_messages",
    "output_item_events",
    "output_message",
    "output_text",
    "parse_input",
    "parse_responses",
    "reasoning_item",
    "response_object",
    "response_status",
    "EmbeddingRequest",
    "FOREIGN_TOKEN_IDS",
    "embedding_vector",
    "embeddings_response",
    "parse_embeddings",
]
