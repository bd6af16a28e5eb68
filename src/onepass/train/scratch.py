"""From-scratch models: an explicit geometry, a tokenizer and a seed give the same weights.

Every parameter is drawn from its own generator, seeded from ``(seed, parameter name)``, so
the same (geometry, initialization, seed) gives byte-identical tensors on any machine, in any
parameter order, whatever else was drawn before. Initializers (TOML ``[initialization]``):
projections ~ N(0, initializer_range), embeddings and an untied head ~ N(0, embedding_std),
RMSNorm scale = norm_weight (Gemma stores ``scale - 1``), biases = bias_value.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch

from onepass.train.config import Initialization, ModelGeometry

MODEL_TYPES = {
    "llama": "llama",
    "mistral": "mistral",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma": "gemma",
    "gemma2": "gemma2",
    "gemma3": "gemma3_text",
}
GEMMA = ("gemma", "gemma2", "gemma3")


def load_tokenizer(source: str | Path) -> Any:
    """A tokenizer from a ``tokenizer.json`` file or a directory holding tokenizer files."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    path = Path(source)
    if path.is_dir():
        return AutoTokenizer.from_pretrained(path)
    if path.is_file():
        return PreTrainedTokenizerFast(tokenizer_file=str(path))
    raise FileNotFoundError(f"tokenizer not found: {path}")


def build_config(geometry: ModelGeometry, tokenizer: Any) -> Any:
    """The transformers config for ``geometry``; absent keys take the family's defaults."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    g = geometry
    family = g.architecture
    if family not in MODEL_TYPES:
        raise ValueError(f"architecture: expected one of {', '.join(MODEL_TYPES)}, got {family!r}")
    vocab = g.vocab_size or len(tokenizer)
    if vocab < len(tokenizer):
        raise ValueError(
            f"vocab_size {vocab} is smaller than the tokenizer's {len(tokenizer)} tokens"
        )
    if g.head_dim is None and g.hidden_size % g.num_attention_heads:
        raise ValueError(
            f"hidden_size {g.hidden_size} is not a multiple of num_attention_heads "
            f"{g.num_attention_heads}; set head_dim"
        )
    head_dim = g.head_dim or g.hidden_size // g.num_attention_heads
    kv_heads = g.num_key_value_heads or g.num_attention_heads
    if g.num_attention_heads % kv_heads:
        raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
    kwargs: dict[str, Any] = dict(
        vocab_size=vocab,
        hidden_size=g.hidden_size,
        intermediate_size=g.intermediate_size or 4 * g.hidden_size,
        num_hidden_layers=g.num_hidden_layers,
        num_attention_heads=g.num_attention_heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=g.max_position_embeddings,
        rope_theta=g.rope_theta,
        rms_norm_eps=g.rms_norm_eps,
        tie_word_embeddings=g.tie_word_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    if g.attention_bias is not None:
        if family == "qwen2":
            raise ValueError("qwen2 always has q/k/v biases; attention_bias cannot be set")
        kwargs["attention_bias"] = g.attention_bias
    if family == "qwen2":
        del kwargs["head_dim"]  # qwen2 derives it
        if g.sliding_window:
            kwargs.update(use_sliding_window=True, sliding_window=g.sliding_window)
    elif g.sliding_window is not None:
        if family not in ("mistral", "gemma2", "gemma3"):
            raise ValueError(f"{family} has no sliding window")
        kwargs["sliding_window"] = g.sliding_window
    if family in ("gemma2", "gemma3"):
        kwargs["query_pre_attn_scalar"] = g.query_pre_attention_scalar or head_dim
        if g.logit_softcapping is not None:
            kwargs["final_logit_softcapping"] = g.logit_softcapping
        if g.attention_logit_softcapping is not None:
            kwargs["attn_logit_softcapping"] = g.attention_logit_softcapping
    elif any(v is not None for v in (g.query_pre_attention_scalar, g.logit_softcapping,
                                     g.attention_logit_softcapping)):
        raise ValueError(f"{family} has no query_pre_attention_scalar or soft-caps")
    if family == "gemma3":
        if g.sliding_window_pattern is not None:
            kwargs["sliding_window_pattern"] = g.sliding_window_pattern
        if g.rope_local_base_frequency is not None:
            kwargs["rope_local_base_freq"] = g.rope_local_base_frequency
    elif g.sliding_window_pattern is not None or g.rope_local_base_frequency is not None:
        raise ValueError("sliding_window_pattern and rope_local_base_frequency are gemma3 keys")
    config = CONFIG_MAPPING[MODEL_TYPES[family]](**kwargs)
    return config


def _seed_for(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


@torch.no_grad()
def initialize(model: Any, init: Initialization, seed: int, family: str) -> None:
    """Fill every parameter deterministically from ``(seed, name)`` (see the module doc)."""
    norm_value = init.norm_weight - 1.0 if family in GEMMA else init.norm_weight
    for name, param in model.named_parameters():
        generator = torch.Generator(device="cpu").manual_seed(_seed_for(seed, name))
        if name.endswith(".bias"):
            param.fill_(init.bias_value)
        elif param.ndim == 1:  # RMSNorm scales (layer, final, q/k norms)
            param.fill_(norm_value)
        else:
            std = (
                init.embedding_std
                if "embed_tokens" in name or name.endswith("lm_head.weight")
                else init.initializer_range
            )
            values = torch.randn(param.shape, generator=generator, dtype=torch.float32) * std
            param.copy_(values.to(param.dtype))


def build_model(
    geometry: ModelGeometry, init: Initialization, tokenizer: Any, seed: int
) -> Any:
    """A randomly initialized causal LM (float32) over ``geometry``."""
    from transformers import AutoModelForCausalLM

    config = build_config(geometry, tokenizer)
    attn = "eager" if geometry.architecture == "gemma2" else "sdpa"
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=torch.float32)
    initialize(model, init, seed, geometry.architecture)
    return model
