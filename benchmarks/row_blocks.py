"""What fixed row blocks (``backends.rows.block_rows``, the invariance scheme on CPUs whose
matmul kernels depend on the row count) cost per linear, for each block size, in one run:

* a 512-row prefill through one blocked linear vs one unblocked call;
* a 1-row decode step (padded to the block) vs an unblocked 2-row call (what ``pad_short_rows``
  sends);
* whether the blocked linear gives the last rows of a 700-row input the same bits alone (the
  property the block exists for), and whether the unblocked one does (why it is needed here).

The shapes are SmolLM2-135M's (576 -> 1536, its MLP); ``--threads`` as the server would run.

    .venv/bin/python benchmarks/row_blocks.py [--threads 2]
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


@torch.inference_mode()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        plain = torch.nn.Linear(576, 1536, bias=False).to(dtype)
        prefill, step = torch.randn(512, 576).to(dtype), torch.randn(1, 576).to(dtype)
        probe = torch.randn(700, 576).to(dtype)
        base = per_call_ms(plain, prefill, 20)
        base_step = per_call_ms(plain, step.expand(2, -1), 200)
        print(f"{str(dtype).removeprefix('torch.')}: unblocked rows agree alone: "
              f"{same_bits(plain, probe)}; default block {ROW_BLOCK[dtype]}")
        print("  block  prefill-512  decode-step  rows-agree")
        for block in (4, 8, 16, 32, 64):
            blocked = torch.nn.Linear(576, 1536, bias=False).to(dtype)
            blocked.weight = plain.weight
            block_rows(blocked, block)
            print(f"  {block:5d}  {per_call_ms(blocked, prefill, 20) / base:10.2f}x"
                  f"  {per_call_ms(blocked, step, 200) / base_step:10.2f}x"
                  f"  {same_bits(blocked, probe)!s:>10}")


if __name__ == "__main__":
    main()
