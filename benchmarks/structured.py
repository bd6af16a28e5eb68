"""Structured output cost on the embedded model. Prints ratios from one run; never a timed test.

* decode tokens/s with and without a JSON-Schema grammar on the same prompts, same sampling
  (temperature 1, same seeds), same number of tokens (the schema's 50 required properties
  never complete within the budget), one stream and ``--streams`` concurrent ones; runs are
  interleaved and the median kept (target: at most 10% slower per token);
* grammar cost on its own: tokenizer info (once per backend), compile of a ~50-property
  schema on first use and from the cache, a fresh matcher per sequence, the mask per token,
  and the whole per-token grammar work as a share of a free decode step (the end-to-end
  ratio is noisy on a shared machine; this share is not).

    .venv/bin/python benchmarks/structured.py [--tokens 64] [--repeats 3] [--streams 4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid

import torch

from onepass.engine import DecisionEngine
from onepass.generate.grammar import compile_grammar, tokenizer_info
from onepass.generate.runner import collect
from onepass.generate.sampling import SamplingParams

PROMPTS = [
    "Describe a customer record as JSON.",
    "Fill in this product sheet as JSON.",
    "Return the survey answers as JSON.",
    "Give the weather report as JSON.",
]


def fifty_properties(tag: str = "") -> dict:
    """A ~50-property object schema mixing the common leaf kinds."""
    kinds = [
        {"type": "string", "maxLength": 24},
        {"type": "integer", "minimum": 0, "maximum": 10000},
        {"type": "boolean"},
        {"enum": ["low", "medium", "high"]},
        {"type": "array", "items": {"type": "number", "minimum": -1, "maximum": 1},
         "maxItems": 4},
        {"type": "string", "format": "date"},
        {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                          "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
         "required": ["city", "zip"], "additionalProperties": False},
    ]
    props = {f"field_{i:02d}": kinds[i % len(kinds)] for i in range(50)}
    schema = {"type": "object", "properties": props, "required": list(props),
              "additionalProperties": False}
    if tag:
        schema["description"] = tag  # a distinct text: a cache miss
    return schema


def decode_rate(engine: DecisionEngine, prompts: list[list[int]], tokens: int,
                grammar: object, seed: int) -> tuple[float, int]:
    """Aggregate decode tokens/s of ``prompts`` run together (first token to last)."""
    params = SamplingParams(temperature=1.0, seed=seed, ignore_eos=True)
    streams = [engine.generator.start(p, params, tokens, grammar=grammar)[0] for p in prompts]
    results = [collect(s) for s in streams]
    end = time.monotonic()
    first = min(s.first_token_at for s in streams)
    produced = sum(r.completion_tokens for r in results)
    assert all(r.finish_reason == "length" for r in results), [r.text for r in results]
    return (produced - len(prompts)) / max(end - first, 1e-9), produced


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    engine = DecisionEngine.from_pretrained()
    start = time.perf_counter()
    info = tokenizer_info(engine.backend)
    info_s = time.perf_counter() - start
    first, cached = [], []
    for _ in range(5):
        schema = fifty_properties(uuid.uuid4().hex)
        start = time.perf_counter()
        grammar = compile_grammar(info, json_schema=schema)
        first.append(time.perf_counter() - start)
        start = time.perf_counter()
        again = compile_grammar(info, json_schema=json.loads(json.dumps(schema)))
        cached.append(time.perf_counter() - start)
        assert again is grammar
    start = time.perf_counter()
    for _ in range(100):
        grammar.matcher()
    matcher_s = (time.perf_counter() - start) / 100

    ids = [engine.generator.chat_prompt([{"role": "user", "content": p}]) for p in PROMPTS]
    decode_rate(engine, ids[:1], 8, None, 0)  # warm-up
    decode_rate(engine, ids[:1], 8, grammar, 0)
    rows = []
    for label, batch in (("1 stream", ids[:1]), (f"{args.streams} streams",
                                                 (ids * args.streams)[: args.streams])):
        free, constrained = [], []
        for r in range(args.repeats):  # interleaved: drift hits both sides alike
            free.append(decode_rate(engine, batch, args.tokens, None, r)[0])
            constrained.append(decode_rate(engine, batch, args.tokens, grammar, r)[0])
        rows.append((label, statistics.median(free), statistics.median(constrained)))

    # the mask alone, along the tokens one constrained run produced
    params = SamplingParams(temperature=1.0, seed=0, ignore_eos=True)
    (g,) = engine.generator.run(ids[0], SamplingParams(**{**params.__dict__, "logprobs": 0}),
                                args.tokens, grammar=grammar)
    m = grammar.matcher()
    mask_times, work_times = [], []
    row = torch.randn(engine.backend.vocab_size)
    for token in [t.id for t in g.tokens]:
        start = time.perf_counter()
        mask = m.allowed_mask(engine.backend.vocab_size)
        mask_times.append(time.perf_counter() - start)
        torch.where(mask, row, -float("inf"))  # the sampler's mask stage
        m.accept(token)
        work_times.append(time.perf_counter() - start)
    free_step = 1 / rows[0][1]

    print(f"model {engine.backend.name}, torch threads {torch.get_num_threads()}, "
          f"{args.tokens} tokens per sequence, median of {args.repeats}")
    print(f"{'':10} {'tokens/s free':>14} {'with schema':>12} {'ratio':>7} {'slower/token':>13}")
    for label, free_rate, con_rate in rows:
        print(f"{label:10} {free_rate:14.1f} {con_rate:12.1f} {con_rate / free_rate:7.3f} "
              f"{free_rate / con_rate - 1:12.1%}")
    print(f"tokenizer info (once per backend): {info_s * 1000:.0f} ms")
    print(f"compile, 50 properties: first use {statistics.median(first) * 1000:.2f} ms, "
          f"cached {statistics.median(cached) * 1e6:.1f} us "
          f"({statistics.median(first) / statistics.median(cached):.0f}x)")
    print(f"matcher per sequence: {matcher_s * 1e6:.0f} us; mask per token: mean "
          f"{statistics.mean(mask_times) * 1e6:.0f} us, p99 "
          f"{sorted(mask_times)[int(0.99 * (len(mask_times) - 1))] * 1e6:.0f} us")
    work = statistics.mean(work_times)
    print(f"grammar work per token (mask + mask stage + accept): {work * 1e6:.0f} us = "
          f"{work / free_step:.2%} of one free single-stream decode step "
          f"({free_step * 1000:.1f} ms)")


if __name__ == "__main__":
    main()
