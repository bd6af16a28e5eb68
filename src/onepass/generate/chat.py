"""Chat messages as the OpenAI APIs send them → the plain list a chat template renders (pure).

Roles: system, developer (rendered as system, as the reference does), user, assistant, tool.
Content: a string, or a list of text parts (``text``, ``input_text``, ``output_text``) joined
with nothing between them. Anything else is a ContractError naming the exact field.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from onepass.contract import ContractError

ROLES = ("system", "developer", "user", "assistant", "tool")
TEXT_PARTS = ("text", "input_text", "output_text")
MAX_MESSAGES = 1024


def normalize_messages(raw: Any, field: str = "messages") -> list[dict[str, Any]]:
    """Validated ``[{"role", "content"}, ...]`` (plus ``tool_call_id``/``name`` when given)."""
    if not isinstance(raw, list) or not raw:
        raise ContractError(field, "expected a non-empty array of messages")
    if len(raw) > MAX_MESSAGES:
        raise ContractError(field, f"{len(raw)} messages is over the limit of {MAX_MESSAGES}")
    out = []
    for i, message in enumerate(raw):
        where = f"{field}[{i}]"
        if not isinstance(message, dict):
            raise ContractError(where, "expected an object with 'role' and 'content'")
        role = message.get("role")
        if role not in ROLES:
            raise ContractError(f"{where}.role", f"expected one of {', '.join(ROLES)}, "
                                f"got {role!r}")
        content = message.get("content")
        if content is None and role == "assistant":
            content = ""
        item: dict[str, Any] = {
            "role": "system" if role == "developer" else role,
            "content": content_text(content, f"{where}.content"),
        }
        for key in ("name", "tool_call_id"):
            value = message.get(key)
            if value is not None:
                if not isinstance(value, str):
                    raise ContractError(f"{where}.{key}", "expected a string")
                item[key] = value
        out.append(item)
    return out


def content_text(content: Any, field: str) -> str:
    """A message's text: the string itself, or its text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") not in TEXT_PARTS:
                raise ContractError(
                    f"{field}[{j}]",
                    f"expected a text part ({{'type': one of {', '.join(TEXT_PARTS)}, "
                    "'text': ...}); images, audio and files are not supported",
                )
            text = part.get("text")
            if not isinstance(text, str):
                raise ContractError(f"{field}[{j}].text", "expected a string")
            texts.append(text)
        return "".join(texts)
    raise ContractError(field, "expected a string or an array of text parts")


def plain_transcript(messages: Sequence[dict[str, Any]]) -> str:
    """The portable rendering for a model without a chat template: one labelled line per
    turn and an open assistant turn."""
    lines = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
    return "\n\n".join(lines) + "\n\nAssistant:"


def starts_with_bos(backend: Any, text: str) -> bool:
    """Chat templates that write the BOS token themselves must not get a second one."""
    bos = getattr(getattr(backend, "tokenizer", None), "bos_token", None)
    return bool(bos) and text.startswith(bos)
