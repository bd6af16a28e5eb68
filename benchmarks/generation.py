"""Generation speed on the embedded model. Prints ratios from one run; never a timed test.

* time to first token and single-stream decode tokens/s: onepass (prefix cache off for the
  measured prompt, greedy) against plain ``transformers`` ``model.generate`` on the same model,
  dtype and thread count, same prompt, same number of new tokens;
* aggregate decode throughput of 1, 4 and 8 concurrent streams (continuous batching: one
  forward per step for every running sequence), in process or, with ``--url``, over HTTP
  through ``/v1/chat/completions`` streaming;
* with ``--llamacpp``, the same on the embedded GGUF: onepass's llamacpp backend (our step
  scheduler and sampler over llama.cpp) against llama-cpp-python's own ``Llama.generate`` on
  the same file and thread count.

    .venv/bin/python benchmarks/generation.py [--tokens 64] [--threads 2] \
        [--url http://127.0.0.1:8080] [--llamacpp]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import torch

from onepass.engine import DecisionEngine
from onepass.generate.runner import collect
from onepass.generate.sampling import SamplingParams

PROMPTS = [
    "Write a long essay about rivers.",
    "Explain how a bicycle works, in detail.",
    "Tell me a long story about a lighthouse keeper.",
    "Describe the water cycle for a ten-year-old, step by step.",
    "Write a detailed recipe for bread.",
    "Explain why the sky is blue, at length.",
    "Describe a day in the life of a honey bee.",
    "Write a long letter to a friend about a trip to the mountains.",
]


def hf_generate(engine: DecisionEngine, prompt: list[int], tokens: int) -> tuple[float, float]:
    """(time to first token, decode tokens/s) of transformers' own greedy generate."""
    model = engine.backend.model
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        start = time.perf_counter()
        model.generate(ids, max_new_tokens=1, min_new_tokens=1, do_sample=False)
        ttft = time.perf_counter() - start
        start = time.perf_counter()
        model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
        total = time.perf_counter() - start
    return ttft, (tokens - 1) / max(total - ttft, 1e-9)


def onepass_single(engine: DecisionEngine, prompt: list[int], tokens: int) -> tuple[float, float]:
    """(time to first token, decode tokens/s) through the scheduler, prefix cache cleared."""
    engine.backend.cache.clear()
    params = SamplingParams(temperature=0.0, ignore_eos=True)
    start = time.monotonic()
    (stream,) = engine.generator.start(prompt, params, tokens)
    g = collect(stream)
    end = time.monotonic()
    ttft = (stream.first_token_at or end) - start
    return ttft, (g.completion_tokens - 1) / max(end - start - ttft, 1e-9)


def aggregate_in_process(engine: DecisionEngine, prompts: list[list[int]], tokens: int) -> float:
    params = SamplingParams(temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    streams = [engine.generator.start(p, params, tokens)[0] for p in prompts]
    total = sum(collect(s).completion_tokens for s in streams)
    return total / (time.perf_counter() - start)


def aggregate_http(url: str, n: int, tokens: int) -> float:
    import httpx

    counts = [0] * n

    def one(i: int) -> None:
        body = {"model": "jev-latest", "stream": True, "max_tokens": tokens, "temperature": 0,
                "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                "ignore_eos": True}
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=300) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                        counts[i] += 1

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - start)


def llama_cpp_python(path: str, prompt: list[int], tokens: int, threads: int
                     ) -> tuple[float, float]:
    """(time to first token, decode tokens/s) of llama-cpp-python's own greedy loop."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=path, n_ctx=2048, n_threads=threads, verbose=False)
    runs = []
    for _ in range(2):  # the first run warms up
        llm.reset()  # no prompt reuse: onepass's prefix cache is cleared for its runs too
        start = time.perf_counter()
        first = None
        for count, _token in enumerate(llm.generate(prompt, temp=0.0, reset=True), start=1):
            first = first or time.perf_counter()
            if count == tokens:
                break
        end = time.perf_counter()
        runs.append((first - start, (tokens - 1) / max(end - first, 1e-9)))
    llm.close()
    return runs[-1]


def single_stream_table(base: str, theirs: tuple[float, float], ours_name: str,
                        ours: tuple[float, float]) -> None:
    """One single-stream comparison: (time to first token, decode tokens/s) as ratios to the
    baseline, then both absolute values for orientation."""
    (t_ttft, t_rate), (o_ttft, o_rate) = theirs, ours
    print("| | time to first token | decode tokens/s |")
    print("|---|---|---|")
    print(f"| {base} | 1.00 | 1.00 |")
    print(f"| {ours_name} | {o_ttft / t_ttft:.2f}x | {o_rate / t_rate:.2f}x |")
    print(f"(absolute: {base} {t_ttft * 1000:.0f} ms / {t_rate:.1f} tok/s; "
          f"{ours_name} {o_ttft * 1000:.0f} ms / {o_rate:.1f} tok/s)")


def compare_llamacpp(tokens: int, threads: int, repeats: int) -> None:
    """The GGUF rows: onepass's llamacpp backend against llama-cpp-python on the same file."""
    from onepass.backends.llamacpp import load

    backend = load(n_threads=threads)
    engine = DecisionEngine(backend)
    prompts = [engine.generator.chat_prompt([{"role": "user", "content": p}]) for p in PROMPTS]
    onepass_single(engine, prompts[0], 8)  # warm-up (builds the generation context)
    theirs = [llama_cpp_python(str(backend.path), prompts[0], tokens, threads)
              for _ in range(repeats)]
    ours = [onepass_single(engine, prompts[0], tokens) for _ in range(repeats)]
    t_ttft, t_rate = (statistics.median(x[i] for x in theirs) for i in (0, 1))
    o_ttft, o_rate = (statistics.median(x[i] for x in ours) for i in (0, 1))
    print(f"\nembedded GGUF, single stream, {tokens} tokens, {threads} threads, "
          f"median of {repeats}")
    single_stream_table("llama-cpp-python Llama.generate", (t_ttft, t_rate),
                        "onepass --backend llamacpp", (o_ttft, o_rate))
    print("\naggregate tokens/s of concurrent streams, relative to llama-cpp-python's one "
          "stream (its Llama serves one sequence at a time)")
    print("| streams | onepass llamacpp |\n|---|---|")
    for n in (1, 4, 8):
        print(f"| {n} | {aggregate_in_process(engine, prompts[:n], tokens) / t_rate:.2f}x |")
    backend.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--url", help="also measure concurrency over HTTP against this server")
    parser.add_argument("--llamacpp", action="store_true",
                        help="only the GGUF rows: onepass llamacpp vs llama-cpp-python")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.llamacpp:
        compare_llamacpp(args.tokens, args.threads, args.repeats)
        return
    engine = DecisionEngine.from_pretrained()
    prompts = [engine.generator.chat_prompt([{"role": "user", "content": p}]) for p in PROMPTS]
    onepass_single(engine, prompts[0], 8)  # warm-up
    hf_generate(engine, prompts[0], 8)

    hf = [hf_generate(engine, prompts[0], args.tokens) for _ in range(args.repeats)]
    op = [onepass_single(engine, prompts[0], args.tokens) for _ in range(args.repeats)]
    hf_ttft, hf_rate = statistics.median(x[0] for x in hf), statistics.median(x[1] for x in hf)
    op_ttft, op_rate = statistics.median(x[0] for x in op), statistics.median(x[1] for x in op)
    print(f"single stream, {args.tokens} tokens, prompt {len(prompts[0])} tokens, "
          f"{args.threads} threads, median of {args.repeats}")
    single_stream_table("transformers generate", (hf_ttft, hf_rate), "onepass",
                        (op_ttft, op_rate))

    print("\naggregate throughput (tokens/s relative to one stream)")
    print("| streams | in process |" + (" HTTP |" if args.url else ""))
    print("|---|---|" + ("---|" if args.url else ""))
    base = aggregate_in_process(engine, prompts[:1], args.tokens)
    base_http = aggregate_http(args.url, 1, args.tokens) if args.url else None
    for n in (1, 4, 8):
        rate = aggregate_in_process(engine, prompts[:n], args.tokens)
        row = f"| {n} | {rate / base:.2f}x |"
        if args.url:
            row += f" {aggregate_http(args.url, n, args.tokens) / base_http:.2f}x |"
        print(row)


if __name__ == "__main__":
    main()
