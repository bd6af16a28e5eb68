"""What fixed row blocks (``backends.rows.block_rows``, the invariance scheme on CPUs whose
matmul kernels depend on the row count) cost per linear, for each block size, in one run:

* a 512-row prefill through one blocked linear vs one unblocked call, with the blocks in one
  batched matmul (the default) and one call per block (the fallback);
* a 1-row decode step (padded to the block) vs an unblocked 2-row call (what ``pad_short_rows``
  sends);
* whether the blocked linear gives the last rows of a 700-row input the same bits alone (the
  property the block exists for), and whether the unblocked one does (why it is needed here).

The shapes are SmolLM2-135M's (576 -> 1536, its MLP); ``--threads`` as the server would run.
``--requests`` adds whole requests: the embedded model in float32, the examples' first request
(4 questions; prefix cache off, median of 5) with each scheme's blocks against unblocked
linears (not invariant here: what the blocks cost a user).

    .venv/bin/python benchmarks/row_blocks.py [--threads 2] [--requests]
"""

from __future__ import annotations

import argparse
import time

import torch

from onepass.backends.rows import ROW_BLOCK, block_rows


def per_call_ms(fn, x: torch.Tensor, repeats: int) -> float:
    fn(x)
    start = time.perf_counter()
    for _ in range(repeats):
        fn(x)
    return (time.perf_counter() - start) / repeats * 1e3


def same_bits(linear: torch.nn.Module, x: torch.Tensor) -> bool:
    whole = linear(x)
    return all(torch.equal(linear(x[-rows:]), whole[-rows:]) for rows in (1, 3, 8, 33, 256))


def requests() -> None:
    from onepass.commands.pull import MEASURED_REQUEST
    from onepass.engine import DecisionEngine

    engine = DecisionEngine.from_pretrained(dtype="float32", session_cache_entries=0)
    linears = [m for m in engine.backend.model.modules() if type(m) is torch.nn.Linear]
    print(f"float32 request, scheme at load: {engine.backend.row_scheme}")

    def seconds() -> float:
        engine.answer(MEASURED_REQUEST)
        times = []
        for _ in range(5):
            start = time.perf_counter()
            engine.answer(MEASURED_REQUEST)
            times.append(time.perf_counter() - start)
        return sorted(times)[2]

    timed = {}
    for scheme, batched in (("batched", True), ("per call", False)):
        for module in linears:
            block_rows(module, ROW_BLOCK[torch.float32], batched=batched)
        timed[scheme] = seconds()
    for module in linears:
        module.forward = module._onepass_plain_forward
    plain = seconds()
    print("  " + ", ".join(f"{k} blocks {v / plain:.2f}x" for k, v in timed.items())
          + " an unblocked request")


@torch.inference_mode()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--requests", action="store_true", help="time whole requests too")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.requests:
        requests()
    for dtype in (torch.float32, torch.bfloat16):
        plain = torch.nn.Linear(576, 1536, bias=False).to(dtype)
        prefill, step = torch.randn(512, 576).to(dtype), torch.randn(1, 576).to(dtype)
        probe = torch.randn(700, 576).to(dtype)
        base = per_call_ms(plain, prefill, 20)
        base_step = per_call_ms(plain, step.expand(2, -1), 200)
        print(f"{str(dtype).removeprefix('torch.')}: unblocked rows agree alone: "
              f"{same_bits(plain, probe)}; default block {ROW_BLOCK[dtype]}")
        print("  block  scheme    prefill-512  decode-step  rows-agree")
        for block in (4, 8, 16, 32, 64):
            for batched in (True, False):
                blocked = torch.nn.Linear(576, 1536, bias=False).to(dtype)
                blocked.weight = plain.weight
                block_rows(blocked, block, batched=batched)
                print(f"  {block:5d}  {'batched' if batched else 'per call':8s}"
                      f"  {per_call_ms(blocked, prefill, 20) / base:10.2f}x"
                      f"  {per_call_ms(blocked, step, 200) / base_step:10.2f}x"
                      f"  {same_bits(blocked, probe)!s:>10}")


if __name__ == "__main__":
    main()
