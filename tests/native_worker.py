"""Native-library work (llama.cpp) in a child process, so a crash fails one test, not the run.

A segfault inside pytest's own process kills the whole run with no report. :class:`NativeWorker`
runs ``setup`` source in a child Python process and proxies attribute reads and calls to the
names it binds, over a socket pair; when the child dies, the calling test fails naming the
signal and the end of the child's output (faulthandler's Python stack included), and the next
call starts a fresh child. :func:`require_llamacpp` skips a test when a llama.cpp package is not
installed, with the reason scripts/install.sh recorded (its smoke decode), and fails it under
``CI=true`` when the installer expected the build to work on this CPU.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest
from conftest import running_in_ci
from server_process import describe_exit

INSTALL_RECORD = Path(sys.prefix) / "onepass-llamacpp.json"  # written by scripts/install.sh

_CHILD = r"""
import pickle, sys, traceback
from dataclasses import is_dataclass
from multiprocessing.connection import Connection

PLAIN = (str, bytes, int, float, bool, type(None), list, tuple, dict, set, frozenset)
conn = Connection(int(sys.argv[1]))
names = {}

def resolve(path):
    head, *rest = path.split(".")
    obj = names[head]
    for part in rest:
        obj = getattr(obj, part)
    return obj

while True:
    try:
        op, path, args, kwargs = conn.recv()
    except EOFError:
        break
    try:
        if op == "setup":
            exec(path, names)
            reply = None
        elif op == "call":
            reply = resolve(path)(*args, **kwargs)
        else:  # "get": plain data comes back, anything else stays here behind a proxy
            value = resolve(path)
            plain = isinstance(value, PLAIN) or (
                is_dataclass(value) and not isinstance(value, type))
            kind = "value" if plain else "callable" if callable(value) else "object"
            reply = (kind, value if plain else None)
        conn.send(("ok", reply))
    except BaseException as exc:
        text = traceback.format_exc()
        try:
            pickle.dumps(exc)
        except Exception:
            exc = RuntimeError(f"{type(exc).__name__}: {exc}")
        conn.send(("error", (exc, text)))
"""


class NativeWorker:
    """A child Python process holding the names ``setup`` binds (``what`` names it in
    failures). ``proxy(name)`` returns an object that forwards to it; ``close()`` ends it."""

    def __init__(self, setup: str, *, what: str, timeout: float = 600) -> None:
        self.setup, self.what, self.timeout = setup, what, timeout
        self.proc: subprocess.Popen | None = None
        self.conn: Connection | None = None
        self.log = tempfile.TemporaryFile("w+")  # noqa: SIM115 (lives as long as the worker)

    def __enter__(self) -> NativeWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> None:
        ours, theirs = socket.socketpair()
        self.log.seek(0)
        self.log.truncate()
        with theirs:
            self.proc = subprocess.Popen(
                [sys.executable, "-X", "faulthandler", "-c", _CHILD, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), stdout=self.log, stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.conn = Connection(ours.detach())
        self._ask("setup", self.setup, (), {})

    def _ask(self, op: str, path: str, args: tuple, kwargs: dict) -> Any:
        if self.proc is None:
            self._start()
        assert self.conn is not None and self.proc is not None
        doing = "setup" if op == "setup" else f"{path}()" if op == "call" else path
        try:
            self.conn.send((op, path, args, kwargs))
            if not self.conn.poll(self.timeout):
                self._stop()
                pytest.fail(f"{self.what} did not answer {doing} within {self.timeout:.0f} s; "
                            f"its output ends:\n{self._tail()}", pytrace=False)
            status, reply = self.conn.recv()
        except (EOFError, OSError):
            code = self._reap()
            pytest.fail(f"{self.what} {describe_exit(code)} during {doing}; its output "
                        f"ends:\n{self._tail()}", pytrace=False)
        if status == "error":
            exc, text = reply
            with contextlib.suppress(AttributeError):
                exc.add_note(f"in {self.what}:\n{text}")
            raise exc
        return reply

    def _reap(self) -> int:
        assert self.proc is not None
        try:
            code = self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(10)
        self._forget()
        return code

    def _forget(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.proc = self.conn = None

    def _stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
        self._forget()

    def _tail(self, chars: int = 3000) -> str:
        self.log.seek(0)
        return self.log.read()[-chars:] or "(no output)"

    def call(self, path: str, *args: Any, **kwargs: Any) -> Any:
        """``path(*args, **kwargs)`` in the child (``path``: a bound name, dotted)."""
        return self._ask("call", path, args, kwargs)

    def proxy(self, path: str) -> Any:
        """An object standing for ``path`` in the child: attributes that are plain data (and
        dataclasses) come back as values, methods as callables, other objects as proxies."""
        return _Proxy(self, path)

    def close(self) -> None:
        """End the child (closing its socket ends its loop) and drop its output."""
        if self.proc is not None:
            assert self.conn is not None
            self.conn.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
            self.proc = self.conn = None
        self.log.close()


class _Proxy:
    def __init__(self, worker: NativeWorker, path: str) -> None:
        self._worker, self._path = worker, path

    def __getattr__(self, name: str) -> Any:
        path = f"{self._path}.{name}"
        kind, value = self._worker._ask("get", path, (), {})
        if kind == "value":
            return value
        if kind == "callable":
            return lambda *args, **kwargs: self._worker.call(path, *args, **kwargs)
        return _Proxy(self._worker, path)


def require_llamacpp(package: str, module: str) -> None:
    """Skip unless ``module`` (of ``package``) is installed: saying why, from the installer's
    record when it built one and removed it; under ``CI=true`` that is a failure instead, when
    the installer expected the build to work on this CPU."""
    spec = importlib.util.find_spec(module)  # found, not imported: no native code ran
    if spec is not None and spec.origin is not None:  # (not a folder left by an uninstall)
        return
    try:
        entry = json.loads(INSTALL_RECORD.read_text()).get(package)
    except (OSError, ValueError):
        entry = None
    if not entry or entry.get("ok"):
        pytest.skip(f"{package} is not installed: bash scripts/install.sh builds it "
                    "(ONEPASS_SKIP_GGUF=1 skips it)")
    message = (f"scripts/install.sh built {package} and removed it again: {entry['message']} "
               f"(rerun: .venv/bin/python scripts/smoke_llamacpp.py)")
    if entry.get("expected", True) and running_in_ci():
        pytest.fail(message + "; CI must run the llama.cpp tests", pytrace=False)
    pytest.skip(message)


LLAMACPP_SETUP = """
from onepass.backends.llamacpp import LlamaCppBackend, gguf_path
from onepass.engine import DecisionEngine

path, name = gguf_path(None)
backend = LlamaCppBackend(path, name=name, {options})
engine = DecisionEngine(backend)
"""


def llamacpp_worker(**options: object) -> NativeWorker:
    """A worker holding ``backend`` (a LlamaCppBackend on the embedded GGUF with ``options``)
    and ``engine`` (a DecisionEngine over it); skips as :func:`require_llamacpp` says."""
    require_llamacpp("llama-cpp-python", "llama_cpp")
    args = ", ".join(f"{key}={value!r}" for key, value in options.items())
    return NativeWorker(LLAMACPP_SETUP.format(options=args), what="the llama.cpp worker process")
