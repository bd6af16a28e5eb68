"""Arguments shared by every command that loads a model.

Every flag also reads ``ONEPASS_<FLAG>`` from the environment (dashes become underscores,
upper case): precedence is flag > environment > default, the same rule everywhere.
"""

from __future__ import annotations

import argparse
import os
from typing import Any


def env_default(flag: str, default: Any = None, cast: type = str) -> Any:
    """The default for ``--flag``: ``$ONEPASS_FLAG`` when set, else ``default``."""
    raw = os.environ.get("ONEPASS_" + flag.upper().replace("-", "_"))
    if raw is None or raw == "":
        return default
    if cast is bool:
        return raw.strip().lower() in ("1", "true", "yes", "on")
    try:
        return cast(raw)
    except ValueError as exc:
        raise SystemExit(f"ONEPASS_{flag.upper().replace('-', '_')}: {exc}") from exc


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("model")
    g.add_argument(
        "--model",
        default=env_default("model"),
        help="embedded alias (default: smollm2-135m-instruct; also gemma3-270m, "
        "qwen2.5-coder-0.5b-instruct), a .gguf file, a checkpoint directory or a hub id",
    )
    g.add_argument("--adapter", default=env_default("adapter"),
                   help="LoRA adapter directory merged into the model at load")
    g.add_argument("--served-model-name", default=env_default("served-model-name"),
                   help="name reported in responses (default: the model's name)")
    g.add_argument("--device", default=env_default("device", "auto"),
                   choices=["auto", "cpu", "cuda", "mps"], help="default: auto")
    g.add_argument("--dtype", default=env_default("dtype", "auto"),
                   choices=["auto", "float32", "bfloat16", "float16"],
                   help="default: auto (float32 on CPU, bfloat16/float16 on GPU)")
    g.add_argument("--context-path", default=env_default("context-path"),
                   help="a system context file (policy, memory) prefilled once at start-up")
    g.add_argument("--session-cache-entries", type=int,
                   default=env_default("session-cache-entries", 16, int),
                   help="prefix cache entries (default 16; 0 disables)")
    g.add_argument("--session-cache-tokens", type=int,
                   default=env_default("session-cache-tokens", 32768, int),
                   help="prefix cache resident tokens (default 32768; 0 disables)")
    g.add_argument("--max-input-tokens", type=int,
                   default=env_default("max-input-tokens", 8192, int),
                   help="refuse prompts longer than this (default 8192); nothing is truncated")
    g.add_argument("--temperature", type=float, default=env_default("temperature", 1.0, float),
                   help="readout temperature over the candidate labels (default 1.0)")


def engine_from_args(args: argparse.Namespace):
    from onepass.engine import DecisionEngine

    return DecisionEngine.from_pretrained(
        args.model,
        device=args.device,
        dtype=args.dtype,
        context_path=args.context_path,
        adapter=args.adapter,
        session_cache_entries=args.session_cache_entries,
        session_cache_tokens=args.session_cache_tokens,
        max_input_tokens=args.max_input_tokens,
        temperature=args.temperature,
        served_name=args.served_model_name,
    )
