"""The generation routes' bodies as pydantic models, for the OpenAPI document and ``GET /.skill``.

Documentation only: :mod:`onepass.server.openai` validates (its errors name the field), and
these models never see a request. They are built from the same constants — openai.py's field
sets and limits, the sampler's ranges — so a range changed there changes here, and a test
checks that every field openai.py accepts is documented and nothing else is. Response models
describe the non-streaming objects; tests validate real objects against them (extra fields
forbidden), so a key added or dropped on either side fails.

Size: declarations only, one pydantic model per body and response object of four routes.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, create_model

from onepass.generate.chat import MAX_MESSAGES, ROLES, TEXT_PARTS
from onepass.generate.params import (
    _FLOATS,
    _INTS,
    LOGIT_BIAS_RANGE,
    MAX_LOGIT_BIAS,
    MAX_LOGPROBS,
    MAX_STOP_CHARS,
    MAX_STOPS,
    MIN_TEMPERATURE,
    SamplingParams,
)
from onepass.server import openai as W

_FORBID = ConfigDict(extra="forbid")
_MODEL_DOC = ("Served model name (see GET /v1/models); absent: the first served model. An "
              "unknown name is a 404 before any work")

# ------------------------------------------------------------------------------ inputs


class ChatTextPart(BaseModel):
    """One text part of a message's content (images, audio and files are refused)."""

    type: Literal[TEXT_PARTS] = Field(description="The part's kind; every kind is plain text")  # type: ignore[valid-type]
    text: str = Field(description="The text")


class ChatFunctionCall(BaseModel):
    model_config = _FORBID
    name: str
    arguments: str = Field(description="The arguments: a JSON object as text")


class ChatToolCall(BaseModel):
    model_config = _FORBID
    id: str
    type: Literal["function"] = "function"
    function: ChatFunctionCall


class FunctionDefinition(BaseModel):
    model_config = _FORBID
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = Field(default=None, description="JSON Schema of the "
                                              "arguments (type object); a forced call is "
                                              "generated under it")
    strict: bool | None = Field(default=None, description="Validate the arguments of every "
                                "completed call against parameters (a mismatch is a 502)")


class ChatTool(BaseModel):
    model_config = _FORBID
    type: Literal["function"]
    function: FunctionDefinition


class ResponsesTool(FunctionDefinition):
    type: Literal["function"]


class ChatNamedChoice(BaseModel):
    model_config = _FORBID
    type: Literal["function"]
    function: dict[Literal["name"], str]


class ResponsesNamedChoice(BaseModel):
    model_config = _FORBID
    type: Literal["function"]
    name: str


_TOOLS_DOC = ("Function tools (at most 128), shown to the model through its chat template, or "
              "one portable instruction when the template declares none; calls are parsed "
              "(Hermes/Qwen <tool_call>, Mistral [TOOL_CALLS], Llama JSON) and a completed "
              "malformed call is a 502 invalid_model_output")
_CHOICE_DOC = ("auto (default with tools), none (tools not shown), required or a named "
               "function: the last two are forced by a grammar, so the call is well-formed")
_PARALLEL_DOC = "Allow several calls in one turn (default true)"


class ChatMessage(BaseModel):
    """A chat message; other keys are ignored."""

    model_config = ConfigDict(extra="allow")
    role: Literal[ROLES] = Field(description="developer is read as system")  # type: ignore[valid-type]
    content: str | list[ChatTextPart] | None = Field(
        description="A string or text parts (joined); null only for an assistant message")
    name: str | None = Field(default=None, description="Passed to the chat template")
    tool_call_id: str | None = Field(default=None, description="Tool messages: the id of the "
                                     "call this result answers (every call of an assistant "
                                     "turn needs its result before the conversation goes on)")
    tool_calls: list[ChatToolCall] | None = Field(default=None, description="Assistant "
                                                  "messages: the calls the model made")


class ResponseFunctionCallInput(BaseModel):
    """A call the model made, sent back (type function_call)."""

    model_config = ConfigDict(extra="allow")
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str = Field(description="A JSON object as text")


class ResponseFunctionCallOutput(BaseModel):
    """The result of a call (type function_call_output)."""

    model_config = ConfigDict(extra="allow")
    type: Literal["function_call_output"]
    call_id: str = Field(description="The call this answers")
    output: str | list[ChatTextPart]


class ResponseInputMessage(BaseModel):
    """A Responses input message item."""

    model_config = ConfigDict(extra="allow")
    type: Literal["message"] = Field(default="message", description="A message")
    role: Literal[tuple(r for r in ROLES if r != "tool")] = Field(  # type: ignore[misc]
        description="developer is read as system")
    content: str | list[ChatTextPart] = Field(description="A string or text parts (joined)")


class ReasoningOptions(BaseModel):
    model_config = _FORBID
    effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    summary: None = Field(default=None, description="Not supported: only null")


class StreamOptions(BaseModel):
    """``stream_options``: only with ``stream: true``."""

    model_config = _FORBID
    include_usage: bool = Field(default=False, description="Send a usage chunk (no choices) "
                                "before data: [DONE]")
    include_obfuscation: bool = Field(default=False, description="Accepted; has no effect")


class FormatText(BaseModel):
    model_config = _FORBID
    type: Literal["text"] = Field(description="Plain text (no grammar)")


class FormatJsonObject(BaseModel):
    model_config = _FORBID
    type: Literal["json_object"] = Field(description="Any JSON object, enforced by the grammar")


class JsonSchemaBody(BaseModel):
    model_config = _FORBID
    name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_-]{1,64}$",
                             description="The schema's name")
    schema_: dict[str, Any] = Field(alias="schema", description="The JSON Schema; a "
                                    "construct the grammar engine cannot enforce is a 400 "
                                    "naming it (never loosened)")
    strict: bool | None = Field(default=None, description="Accepted; the schema is enforced "
                                "token by token either way")
    description: str | None = Field(default=None, description="Accepted; not shown to the "
                                    "model")


class FormatJsonSchema(BaseModel):
    """Chat Completions' shape: the schema under ``json_schema``."""

    model_config = _FORBID
    type: Literal["json_schema"]
    json_schema: JsonSchemaBody


class TextFormatJsonSchema(JsonSchemaBody):
    """Responses' shape: the schema's keys beside ``type``."""

    type: Literal["json_schema"]


class ResponseText(BaseModel):
    """Responses ``text``."""

    model_config = _FORBID
    format: FormatText | FormatJsonObject | TextFormatJsonSchema | None = Field(
        default=None, description="text (default), json_object or json_schema: the output is "
        "generated under the schema's grammar and always parses when status is completed")
    verbosity: Literal["medium"] | None = Field(default=None, description="Only the default")


_GRAMMAR_DOC = ("Extension: a Lark or GBNF grammar (llguidance) that constrains every token; "
                "not together with a non-text response_format or stop strings")

# the sampler's own defaults, so a documented default is the one applied
_DEFAULTS = {name: f.default for name, f in SamplingParams.__dataclass_fields__.items()}

_FLOAT_DOCS = {
    "temperature": f"0 is greedy (argmax); values between 0 and {MIN_TEMPERATURE:g} are "
                   "refused",
    "top_p": "Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p",
    "min_p": "Drop tokens below min_p times the top token's probability (0 = off)",
    "typical_p": "Locally typical sampling mass (1 = off)",
    "presence_penalty": "Subtracted once from every token already generated",
    "frequency_penalty": "Subtracted per occurrence of a token already generated",
    "repetition_penalty": "Divides positive logits (multiplies negative ones) of tokens already "
                          "in prompt or output (1 = off)",
}


def _float(name: str) -> tuple[Any, Any]:
    low, high, low_excluded = _FLOATS[name]
    lower = {"gt": low} if low_excluded else {"ge": low}
    return float | None, Field(default=_DEFAULTS[name], le=high, description=_FLOAT_DOCS[name],
                               **lower)


def _sampling_fields() -> dict[str, tuple[Any, Any]]:
    """The sampler's fields under their OpenAI names (openai.SAMPLING_FIELDS), with the
    sampler's ranges; null means the default."""
    seed_low, seed_high = _INTS["seed"]
    stop = Annotated[str, StringConstraints(min_length=1, max_length=MAX_STOP_CHARS)]
    token_id = Annotated[str, StringConstraints(pattern=r"^[0-9]+$")]
    bias = Annotated[float, Field(ge=-LOGIT_BIAS_RANGE, le=LOGIT_BIAS_RANGE)]
    fields: dict[str, tuple[Any, Any]] = {name: _float(name) for name in _FLOATS}
    fields.update({
        "top_k": (int | None, Field(default=_DEFAULTS["top_k"], ge=_INTS["top_k"][0],
                                    description="Keep the k most likely tokens (0 = off)")),
        "logit_bias": (dict[token_id, bias] | None, Field(
            default=None, max_length=MAX_LOGIT_BIAS,
            description="Token id (a decimal string) -> value added to its logit before "
            "sampling")),
        "seed": (int | None, Field(default=None, ge=seed_low, le=seed_high,
                                   description="Request-local random generator: the same seed "
                                   "gives the same sample")),
        "stop": (stop | Annotated[list[stop], Field(max_length=MAX_STOPS)] | None, Field(
            default=None, description="Stop strings, matched across token boundaries; never "
            "part of the output")),
        "ignore_eos": (bool | None, Field(default=False, description="Keep generating past the "
                                          "end-of-sequence token (up to the output limit)")),
    })
    return {name: fields[name] for name in W.SAMPLING_FIELDS}


def _ignored_fields(*, responses: bool) -> dict[str, tuple[Any, Any]]:
    """openai.HARMLESS_FIELDS: accepted and ignored (they change nothing on a local server);
    Responses checks the types of ``user`` and ``metadata`` because it echoes them."""
    doc = "Accepted, changes nothing here; named in the x-onepass-ignored-fields header"
    fields: dict[str, tuple[Any, Any]] = {name: (Any, Field(default=None, description=doc))
                                          for name in W.HARMLESS_FIELDS}
    if responses:
        key = Annotated[str, StringConstraints(max_length=64)]
        value = Annotated[str, StringConstraints(max_length=512)]
        fields["user"] = (str | None, Field(default=None, description="Echoed in the response"))
        fields["metadata"] = (dict[key, value] | None, Field(
            default=None, max_length=W.MAX_METADATA_PAIRS,
            description="String pairs echoed in the response"))
    return fields


def _stream_fields(kind: str) -> dict[str, tuple[Any, Any]]:
    return {
        "stream": (bool | None, Field(default=False, description=f"Send {kind} as server-sent "
                                      "events (text/event-stream)")),
        "stream_options": (StreamOptions | None, Field(default=None,
                                                       description="Only with stream: true")),
    }


def _not_implemented_note(accepted: frozenset[str]) -> str:
    """What happens to the other OpenAI fields, from openai.py's own tables."""
    neutral = sorted(k for k in W._NEUTRAL if k not in accepted)
    return ("Any other field is refused with a 400 naming it (never silently ignored); "
            "unimplemented OpenAI fields are accepted only at their default value: "
            + ", ".join(neutral) + ". A null value means the field's default.")


def _request_model(name: str, doc: str, accepted: frozenset[str],
                   fields: dict[str, tuple[Any, Any]], example: dict[str, Any]) -> type[BaseModel]:
    config = ConfigDict(extra="forbid", title=name, json_schema_extra={"examples": [example]})
    return create_model(name, __config__=config, __doc__=f"{doc} {_not_implemented_note(accepted)}",
                        **fields)


def _model_field() -> tuple[Any, Any]:
    return str | None, Field(default=None, min_length=1, description=_MODEL_DOC)


ChatCompletionRequestModel = _request_model(
    "ChatCompletionRequestModel",
    "POST /v1/chat/completions body (validation: openai.parse_chat).",
    W.CHAT_FIELDS,
    {
        "model": _model_field(),
        "messages": (list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES,
                                              description="The conversation, rendered by the "
                                              "model's chat template; never truncated")),
        "max_completion_tokens": (int | None, Field(
            default=None, ge=1, description="Output token limit; absent: the model's default, "
            "capped by the room left in the context. Over the context: 400")),
        "max_tokens": (int | None, Field(default=None, ge=1, description="Older name of "
                                         "max_completion_tokens (send one of them)")),
        "n": (int | None, Field(default=1, ge=1, le=W.MAX_CHOICES,
                                description="Choices generated from the one prompt")),
        **_stream_fields("chat.completion.chunk objects ending with data: [DONE]"),
        "logprobs": (bool | None, Field(default=False, description="Return each output "
                                        "token's log-probability (the model's own)")),
        "top_logprobs": (int | None, Field(default=None, ge=0, le=MAX_LOGPROBS,
                                           description="Alternatives per token; only with "
                                           "logprobs: true")),
        "response_format": (FormatText | FormatJsonObject | FormatJsonSchema | None, Field(
            default=None, description="text (default), json_object or json_schema: enforced "
            "token by token; a completed output (finish_reason stop) always parses and "
            "validates; finish_reason length may be partial")),
        "grammar": (str | None, Field(default=None, min_length=1, description=_GRAMMAR_DOC)),
        "chat_template_kwargs": (dict[str, str | int | float | bool | None] | None, Field(
            default=None, description="vLLM extension: more chat-template variables (at most "
            "32 scalar values; enable_thinking may be true here, unlike a decision)")),
        "reasoning_effort": (Literal["none", "minimal", "low", "medium", "high"] | None, Field(
            default=None, description="On a template with a thinking switch (Qwen3's "
            "enable_thinking): none/minimal turn thinking off, low/medium/high on; the think "
            "block comes back as message.reasoning_content. A model without a switch "
            "accepts only none")),
        "tools": (list[ChatTool] | None, Field(default=None, max_length=128,
                                                description=_TOOLS_DOC)),
        "tool_choice": (Literal["auto", "none", "required"] | ChatNamedChoice | None,
                        Field(default=None, description=_CHOICE_DOC)),
        "parallel_tool_calls": (bool | None, Field(default=True, description=_PARALLEL_DOC)),
        **_sampling_fields(),
        **_ignored_fields(responses=False),
    },
    {"messages": [{"role": "user", "content": "Say hello in three words."}],
     "max_tokens": 16, "temperature": 0},
)

CompletionRequestModel = _request_model(
    "CompletionRequestModel",
    "POST /v1/completions body (validation: openai.parse_completion).",
    W.COMPLETION_FIELDS,
    {
        "model": _model_field(),
        "prompt": (Annotated[str, StringConstraints(min_length=1)]
                   | Annotated[list[int], Field(min_length=1)]
                   | Annotated[list[str | list[int]], Field(min_length=1, max_length=1)],
                   Field(description="A string or token ids (ids checked against the "
                         "vocabulary); a batch of exactly one prompt is also taken")),
        "max_tokens": (int | None, Field(default=None, ge=0, description="Output token limit; "
                                         "0 (with echo: true) scores the prompt only")),
        "n": (int | None, Field(default=1, ge=1, le=W.MAX_CHOICES,
                                description="Choices generated from the one prompt")),
        **_stream_fields("text_completion chunks ending with data: [DONE]"),
        "logprobs": (int | None, Field(default=None, ge=0, le=W.MAX_COMPLETION_LOGPROBS,
                                       description="Log-probabilities of each token plus this "
                                       "many alternatives")),
        "echo": (bool | None, Field(default=False, description="Prepend the prompt to the text "
                                    "(with logprobs: the prompt's log-probabilities too)")),
        "grammar": (str | None, Field(default=None, min_length=1, description=_GRAMMAR_DOC)),
        **_sampling_fields(),
        **_ignored_fields(responses=False),
    },
    {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0},
)

ResponseRequestModel = _request_model(
    "ResponseRequestModel",
    "POST /v1/responses body (validation: openai.parse_responses).",
    W.RESPONSES_FIELDS,
    {
        "model": _model_field(),
        "input": (Annotated[str, StringConstraints(min_length=1)]
                  | Annotated[list[ResponseInputMessage | ResponseFunctionCallInput
                                 | ResponseFunctionCallOutput], Field(min_length=1)],
                  Field(description="A string (one user message) or items: messages, "
                        "function_call and function_call_output")),
        "instructions": (str | None, Field(default=None, description="A system message put "
                                           "before the conversation")),
        "max_output_tokens": (int | None, Field(default=None, ge=1, description="Output token "
                                                "limit; reaching it makes the response "
                                                "incomplete")),
        **_stream_fields("lifecycle events (response.created ... response.completed)"),
        "store": (bool | None, Field(default=False, description="Keep the response (process-"
                                     "local, bounded, lost on restart) for GET, DELETE and "
                                     "previous_response_id")),
        "previous_response_id": (str | None, Field(
            default=None, min_length=1, description="Continue a stored response (same model)")),
        "text": (ResponseText | None, Field(default=None, description="text.format: "
                                            "structured output (json_object, json_schema)")),
        "grammar": (str | None, Field(default=None, min_length=1, description=_GRAMMAR_DOC)),
        "reasoning": (ReasoningOptions | None, Field(
            default=None, description="reasoning.effort on the template's thinking switch "
            "(as reasoning_effort on chat); the think block is a reasoning output item")),
        "tools": (list[ResponsesTool] | None, Field(default=None, max_length=128,
                                                     description=_TOOLS_DOC)),
        "tool_choice": (Literal["auto", "none", "required"] | ResponsesNamedChoice | None,
                        Field(default=None, description=_CHOICE_DOC)),
        "parallel_tool_calls": (bool | None, Field(default=True, description=_PARALLEL_DOC)),
        **_sampling_fields(),
        **_ignored_fields(responses=True),
    },
    {"input": "Say hello in three words.", "max_output_tokens": 16, "temperature": 0},
)

EmbeddingRequestModel = _request_model(
    "EmbeddingRequestModel",
    "POST /v1/embeddings body (validation: openai.parse_embeddings).",
    W.EMBEDDING_FIELDS,
    {
        "model": _model_field(),
        "input": (Annotated[str, StringConstraints(min_length=1)]
                  | Annotated[list[Annotated[str, StringConstraints(min_length=1)]],
                              Field(min_length=1, max_length=W.MAX_EMBEDDING_INPUTS)]
                  | Annotated[list[int], Field(min_length=1)]
                  | Annotated[list[list[int]], Field(min_length=1,
                                                     max_length=W.MAX_EMBEDDING_INPUTS)],
                  Field(description="A string, up to 128 strings, or token ids (only with "
                        "model_token_ids: true); an input over the input-token limit is a 400 "
                        "(never truncated)")),
        "model_token_ids": (bool | None, Field(
            default=False, description="onepass extension: the token ids in input are the "
            "served model's own (tiktoken ids, which LangChain's OpenAIEmbeddings sends by "
            "default, would be misread: without it token ids are a 400)")),
        "dimensions": (int | None, Field(default=None, ge=1, description="Keep the first "
                                         "dimensions, then L2-normalise")),
        "encoding_format": (Literal["float", "base64"] | None, Field(
            default="float", description="base64: little-endian float32 bytes")),
        "user": (Any, Field(default=None, description="Accepted, changes nothing here; "
                            "named in the x-onepass-ignored-fields header")),
    },
    {"input": ["The cat sat on the mat.", "A cat was sitting on the rug."]},
)

REQUEST_MODELS: dict[str, type[BaseModel]] = {
    "/v1/embeddings": EmbeddingRequestModel,
    "/v1/chat/completions": ChatCompletionRequestModel,
    "/v1/completions": CompletionRequestModel,
    "/v1/responses": ResponseRequestModel,
}


# ------------------------------------------------------------------------------ outputs


class ChatTopLogprob(BaseModel):
    model_config = _FORBID
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(ChatTopLogprob):
    top_logprobs: list[ChatTopLogprob]


class ChatLogprobs(BaseModel):
    model_config = _FORBID
    content: list[ChatTokenLogprob]
    refusal: None = None


class ChatAssistantMessage(BaseModel):
    model_config = _FORBID
    role: Literal["assistant"]
    content: str | None = Field(description="null when the reply is only tool calls")
    refusal: None = None
    tool_calls: list[ChatToolCall] | None = None
    reasoning_content: str | None = Field(default=None, description="A reasoning model's "
                                          "think block (absent when it wrote none)")


class ChatChoice(BaseModel):
    model_config = _FORBID
    index: int
    message: ChatAssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: Literal["stop", "length", "tool_calls"] = Field(
        description="stop: end of sequence, a stop string or a completed grammar; length: the "
        "output limit (calls withheld); tool_calls: the reply calls functions")


class PromptTokensDetails(BaseModel):
    model_config = _FORBID
    cached_tokens: int = Field(description="Prompt tokens read from the prefix cache")


class CompletionTokensDetails(BaseModel):
    model_config = _FORBID
    reasoning_tokens: int = Field(description="Completion tokens inside the think block")


class ChatUsage(BaseModel):
    model_config = _FORBID
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    completion_tokens_details: CompletionTokensDetails


class ChatCompletionResponseModel(BaseModel):
    """A ``chat.completion`` (stream: false)."""

    model_config = _FORBID
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: ChatUsage
    system_fingerprint: None = None


class CompletionLogprobs(BaseModel):
    model_config = _FORBID
    tokens: list[str]
    token_logprobs: list[float | None] = Field(description="null for the first prompt token")
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    model_config = _FORBID
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: Literal["stop", "length"] | None


class CompletionResponseModel(BaseModel):
    """A ``text_completion`` (stream: false)."""

    model_config = _FORBID
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: ChatUsage | None = None
    system_fingerprint: None = None


class ResponseOutputText(BaseModel):
    model_config = _FORBID
    type: Literal["output_text"]
    text: str
    annotations: list[Any]
    logprobs: list[Any]


class ResponseOutputMessage(BaseModel):
    model_config = _FORBID
    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    status: Literal["in_progress", "completed", "incomplete"]
    content: list[ResponseOutputText]


class ResponseFunctionCall(BaseModel):
    model_config = _FORBID
    id: str
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"]


class ReasoningText(BaseModel):
    model_config = _FORBID
    type: Literal["reasoning_text"]
    text: str


class ResponseReasoningItem(BaseModel):
    model_config = _FORBID
    id: str
    type: Literal["reasoning"]
    status: Literal["in_progress", "completed", "incomplete"]
    summary: list[Any]
    content: list[ReasoningText]


class ResponseInputTokensDetails(BaseModel):
    model_config = _FORBID
    cached_tokens: int
    cache_write_tokens: int


class ResponseOutputTokensDetails(BaseModel):
    model_config = _FORBID
    reasoning_tokens: int


class ResponseUsage(BaseModel):
    model_config = _FORBID
    input_tokens: int
    input_tokens_details: ResponseInputTokensDetails
    output_tokens: int
    output_tokens_details: ResponseOutputTokensDetails
    total_tokens: int


class ResponseIncompleteDetails(BaseModel):
    model_config = _FORBID
    reason: Literal["max_output_tokens"]


class ResponseObjectModel(BaseModel):
    """A ``response`` (stream: false, and what GET /v1/responses/{id} returns)."""

    model_config = _FORBID
    id: str
    object: Literal["response"]
    created_at: int
    status: Literal["in_progress", "completed", "incomplete"]
    completed_at: int | None
    model: str
    output: list[ResponseReasoningItem | ResponseOutputMessage | ResponseFunctionCall]
    error: None = None
    incomplete_details: ResponseIncompleteDetails | None
    instructions: str | None
    max_output_tokens: int
    metadata: dict[str, str]
    parallel_tool_calls: bool
    previous_response_id: str | None
    temperature: float
    top_p: float
    tool_choice: Literal["auto", "none", "required"] | ResponsesNamedChoice
    tools: list[ResponsesTool]
    store: bool
    text: dict[str, Any]
    truncation: Literal["disabled"]
    reasoning: ReasoningOptions | None = None
    background: bool
    user: str | None
    usage: ResponseUsage | None


class ResponseDeletedModel(BaseModel):
    model_config = _FORBID
    id: str
    object: Literal["response"]
    deleted: bool


class ResponseInputItem(BaseModel):
    """A stored input item: a message (role, content), a function_call or its output."""

    model_config = ConfigDict(extra="allow")
    id: str
    type: Literal["message", "function_call", "function_call_output"]
    status: str


class ResponseInputItemsModel(BaseModel):
    """A page of a stored response's input items."""

    model_config = _FORBID
    object: Literal["list"]
    data: list[ResponseInputItem]
    first_id: str | None
    last_id: str | None
    has_more: bool


class EmbeddingItem(BaseModel):
    model_config = _FORBID
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str = Field(description="L2-normalised; a base64 string with "
                                         "encoding_format base64")


class EmbeddingUsage(BaseModel):
    model_config = _FORBID
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponseModel(BaseModel):
    """The embeddings of the inputs, in their order."""

    model_config = _FORBID
    object: Literal["list"]
    model: str
    data: list[EmbeddingItem]
    usage: EmbeddingUsage


class OpenAIErrorBody(BaseModel):
    model_config = _FORBID
    message: str = Field(description="Names the field and what was expected")
    type: str = Field(description="The error kind (see the status table)")
    field: str | None = Field(default=None, description="The field at fault")
    request_id: str | None = Field(default=None, description="Also in x-typesafe-request-id")
    param: str | None = Field(default=None, description="Same as field (what OpenAI clients "
                              "read); absent on auth errors")
    code: str | None = Field(default=None, description="Same as type; absent on auth errors")


class OpenAIErrorResponse(BaseModel):
    """Every error on the generation routes: the server's envelope plus OpenAI's param and
    code. After a stream has started, an error arrives as a final event instead."""

    model_config = _FORBID
    error: OpenAIErrorBody
