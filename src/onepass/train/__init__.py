"""Training: teach a model the decision position the server reads.

The trainer renders every example through the engine's own prompt renderer and label
assignment, so the position it optimises is byte-for-byte the position served. Modules:

* ``dataset``   Jev-native records (state + questions + answer or target probabilities),
                validated with file:line errors
* ``config``    one dataclass per TOML section; precedence flag > TOML > default, per key
* ``loss``      restricted cross-entropy over the candidate labels at the last position,
                against a gold label or a target distribution (distillation)
* ``lora``      peft adapters and their export to ``adapter.safetensors``
* (qlora holds its frozen base in :mod:`onepass.quant`: int4, int8, fp8 or fp4, dequantized
  per layer in the forward)
* ``scratch``   deterministic random init over an explicit geometry (from-scratch)
* ``artifacts`` what each method writes
* ``loop``      the loop: AdamW, warmup, clipping, accumulation, early stopping, resume

Nothing here is imported by the server; this package imports torch lazily per module.
"""
