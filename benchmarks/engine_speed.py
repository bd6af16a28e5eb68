"""Engine speed on the embedded model, with a ~512-token state. Prints ratios from one run.

* cost of 1, 4 and 16 questions (shared prefix + packed suffixes, cold cache) relative to ONE
  plain forward over the same total number of tokens (prefix + every suffix);
* a prefix-cache hit relative to a miss (16 questions);
* the speed-up over the naive way: every question as its own full forward;
* the alternative fast path we did not ship: suffixes as a right-padded batch over the prefix
  cache expanded along the batch (runtime-notes), measured for the record;
* on a miss, the prefix merged into the first packed forward vs given its own forward, for a
  short and a long state (what the backend's ``merge_pairs`` rule decides between);
* the compute column: the 16-question request (miss and hit) with float32, bfloat16 and int8
  working weights (``--compute-only`` prints just that table), ratios to float32, the old
  default.

    .venv/bin/python benchmarks/engine_speed.py [--repeats 3] [--compute-only]
"""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial

import torch
from transformers import DynamicCache

from onepass import prompt as P
from onepass.engine import DecisionEngine

STATE = " ".join(
    f"Ticket {i}: customer {i * 7 % 13} reports that order {4000 + i} arrived late and the box "
    f"was damaged; they ask for a refund of {10 + i} dollars." for i in range(17)
)


def questions(n: int) -> list[tuple]:
    """n questions cycling noul, choice, score: (type, instructions, options, descriptions)."""
    kinds = [
        ("noul", "The customer asks for money back.", ["yes", "no"], [None, None]),
        ("choice", "Which team should handle the tickets?", ["billing", "logistics", "support"],
         ["payments", "shipping", "product help"]),
        ("score", "How urgent are the tickets?", ["0", "1", "2"],
         ["Routine", "Urgent", "Emergency"]),
    ]
    return [kinds[i % 3][:1] + (f"{kinds[i % 3][1]} (#{i})",) + kinds[i % 3][2:] for i in range(n)]


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@torch.inference_mode()
def plain_forward(backend, n_tokens: int, ids: list[int]) -> None:
    tokens = (ids * (n_tokens // len(ids) + 1))[:n_tokens]
    backend.model(input_ids=torch.tensor([tokens]), logits_to_keep=1)


@torch.inference_mode()
def batched_padded(backend, prefix: list[int], suffixes: list[list[int]], cands) -> list:
    """Runtime-notes variant: prefix KV expanded along the batch, right-padded suffixes."""
    kv, _ = backend._prefix_kv(prefix)
    b, width = len(suffixes), max(len(s) for s in suffixes)
    ids = torch.zeros(b, width, dtype=torch.long)
    mask = torch.zeros(b, len(prefix) + width, dtype=torch.long)
    mask[:, : len(prefix)] = 1
    for i, s in enumerate(suffixes):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, len(prefix): len(prefix) + len(s)] = 1
    expanded = [(k.expand(b, -1, -1, -1), v.expand(b, -1, -1, -1)) for k, v in kv]
    out = backend.decoder(
        input_ids=ids, attention_mask=mask, cache=DynamicCache(ddp_cache_data=expanded),
        position_ids=(len(prefix) + torch.arange(width))[None].expand(b, -1), use_cache=True,
    )
    last = out.last_hidden_state[torch.arange(b), torch.tensor([len(s) - 1 for s in suffixes])]
    return backend._candidate_logits(last, cands)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: torch's); 1 is steadier when busy")
    parser.add_argument("--compute-only", action="store_true",
                        help="only the float32 / bfloat16 / int8 table")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    compute_table(args.model, args.repeats)
    if args.compute_only:
        return
    engine = DecisionEngine.from_pretrained(args.model)
    backend = engine.backend
    prefix_text = P.render_prefix(engine.format, STATE, None, engine.specials)
    print(f"model={engine.served_name} threads={torch.get_num_threads()}")

    def cold(positions):
        backend.cache.clear()
        engine.score_positions(prefix_text, positions)

    def plain(total, ids):
        return lambda: plain_forward(backend, total, ids)

    rows = []
    for n in (1, 4, 16):
        positions = [engine.position(*q) for q in questions(n)]
        prefix, suffixes = engine.tokenize(prefix_text, [p.suffix for p in positions])
        total = len(prefix) + sum(len(s) for s in suffixes)
        t_fast = timed(partial(cold, positions), args.repeats)
        t_plain = timed(plain(total, prefix), args.repeats)
        t_hit = timed(partial(engine.score_positions, prefix_text, positions), args.repeats)
        rows.append((n, t_fast, t_hit))
        print(f"{n:2d} questions: prefix {len(prefix)} + suffixes {total - len(prefix)} tokens; "
              f"onepass {t_fast * 1000:.0f} ms, one plain forward of {total} tokens "
              f"{t_plain * 1000:.0f} ms -> ratio {t_fast / t_plain:.2f}x; cache hit "
              f"{t_hit * 1000:.0f} ms -> {t_hit / t_fast:.2f}x of a miss")

    positions = [engine.position(*q) for q in questions(16)]
    _, t_miss, t_hit = rows[-1]

    t_naive = timed(lambda: engine.score_positions(prefix_text, positions, naive=True), 1)
    print(f"naive (16 full forwards, full vocabulary): {t_naive * 1000:.0f} ms -> onepass cold is "
          f"{t_naive / t_miss:.1f}x faster, warm {t_naive / t_hit:.1f}x faster")

    prefix, suffixes = engine.tokenize(prefix_text, [p.suffix for p in positions])
    cands = [[lb.token_id for lb in p.labels] for p in positions]

    def padded_cold():
        backend.cache.clear()
        batched_padded(backend, prefix, suffixes, cands)

    t_padded = timed(padded_cold, args.repeats)
    packed = backend.score(prefix, suffixes, cands).logits
    padded = batched_padded(backend, prefix, suffixes, cands)
    diff = max(abs(a - b) for x, y in zip(packed, padded) for a, b in zip(x, y))
    print(f"padded batch over expanded prefix cache (not shipped): {t_padded * 1000:.0f} ms vs "
          f"packed {t_miss * 1000:.0f} ms -> packed is {t_padded / t_miss:.2f}x faster; "
          f"max logit difference {diff:.1e}")

    merge_ab(engine, args.repeats)


def compute_table(model: str | None, repeats: int) -> None:
    """The 16-question request on the ~512-token state, cold (miss) and warm (hit), for each
    compute: float32 (the old CPU default), bfloat16, int8 (per-channel weights on PyTorch's
    dynamic int8 kernel), and what ``auto`` picks here."""
    from onepass.backends.torch import TorchBackend, pick_dtype
    from onepass.models import resolve

    resolved = resolve(model)
    auto = str(pick_dtype("auto", torch.device("cpu"))).removeprefix("torch.")
    times: dict[str, tuple[float, float]] = {}
    for compute in ("float32", "bfloat16", "int8"):
        dtype = "bfloat16" if compute == "int8" else compute
        backend = TorchBackend.load(resolved.path, name=resolved.name, device="cpu",
                                    dtype=dtype, compute=compute)
        engine = DecisionEngine(backend)
        text = P.render_prefix(engine.format, STATE, None, engine.specials)
        positions = [engine.position(*q) for q in questions(16)]

        def cold(engine=engine, text=text, positions=positions):
            engine.backend.cache.clear()
            engine.score_positions(text, positions)

        cold()  # warm-up (first-call allocations, int8 kernel set-up)
        miss = timed(cold, repeats)
        hit = timed(partial(engine.score_positions, text, positions), repeats)
        times[compute] = (miss, hit)
        del engine, backend
    base_miss, base_hit = times["float32"]
    print(f"compute (16 questions, ~512-token state; auto here = {auto}; int8 = int8 linears "
          "in a bfloat16 model):")
    for compute, (miss, hit) in times.items():
        print(f"  {compute:9} miss {miss * 1000:6.0f} ms ({base_miss / miss:4.2f}x faster than "
              f"float32)  hit {hit * 1000:6.0f} ms ({base_hit / hit:4.2f}x)")


def merge_ab(engine, repeats: int) -> None:
    """A miss with the prefix merged into the first packed forward vs in its own forward."""
    backend = engine.backend
    shipped = backend.merge_pairs
    for label, state in (("short", "when's the gas bill due?"), ("long", STATE)):
        text = P.render_prefix(engine.format, state, None, engine.specials)
        for n in (1, 4, 16):
            positions = [engine.position(*q) for q in questions(n)]
            prefix, suffixes = engine.tokenize(text, [p.suffix for p in positions])
            pairs = len(prefix) * sum(len(s) for s in suffixes)
            times = {}
            for name, budget in (("merged", 1 << 40), ("separate", 0)):
                backend.merge_pairs = budget

                def cold(positions=positions, text=text):
                    backend.cache.clear()
                    engine.score_positions(text, positions)

                times[name] = timed(cold, repeats)
            backend.merge_pairs = shipped
            pick = "merged" if pairs <= shipped else "separate"
            print(f"miss, {label} state, {n:2d} questions ({pairs} prefix x suffix pairs): merged "
                  f"{times['merged'] * 1000:.0f} ms vs separate {times['separate'] * 1000:.0f} "
                  f"ms -> {times['merged'] / times['separate']:.2f}x; shipped rule: {pick}")


if __name__ == "__main__":
    main()
