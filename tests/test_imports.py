"""The package's shape, checked: no import cycle between its modules, and the pure layers (the
contract, prompt rendering, readout arithmetic, the server's protocol and routes) import no
torch, so a front end over a remote engine needs no model runtime (ARCHITECTURE.md)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import onepass

PACKAGE = Path(onepass.__file__).parent

# modules whose import must not load torch (every module of server/ is added below)
PURE = ["onepass.contract", "onepass.limits", "onepass.prompt", "onepass.readout",
        "onepass.cache", "onepass.schema", "onepass.calibration", "onepass.engine",
        "onepass.generate.params",
        "onepass.generate.chat", "onepass.generate.streams", "onepass.generate.grammar",
        "onepass.generate.tools", "onepass.generate.text"]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _type_checking(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def import_time_edges(name: str, path: Path, known: set[str]) -> set[str]:
    """The onepass modules ``name`` imports while it is being imported: statements at module
    level (not inside functions, not under ``if TYPE_CHECKING``)."""
    edges: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if _type_checking(node):
                continue
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in known)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    base = f"{parent}.{base}" if base else parent
                if base in known:
                    edges.add(base)
                edges.update(f"{base}.{a.name}" for a in node.names
                             if f"{base}.{a.name}" in known)
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                for field in ("body", "orelse", "finalbody"):
                    visit(getattr(node, field, []) or [])
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)

    visit(ast.parse(path.read_text()).body)
    edges.discard(name)
    return edges


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            connect(v)
    return found


def test_no_module_imports_itself_back_at_import_time():
    found = modules()
    known = set(found)
    graph = {name: import_time_edges(name, path, known) for name, path in found.items()}
    # a package imports its parent's __init__ implicitly: that is not a cycle of ours
    for name in graph:
        graph[name] = {m for m in graph[name] if not name.startswith(m + ".")}
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_pure_layers_import_no_torch():
    server = sorted(n for n in modules() if n.startswith("onepass.server"))
    script = (
        "import importlib, sys\n"
        f"for name in {PURE + server!r}:\n"
        "    importlib.import_module(name)\n"
        "    if 'torch' in sys.modules:\n"
        "        sys.exit('importing ' + name + ' loaded torch')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


LONG_MODULE_LINES = 600


def test_a_long_module_says_why_it_is_long():
    """A module over ~600 lines states in its docstring why it is one module ("Size: ..."), so a
    long file is a decision someone wrote down, never drift."""
    long = {}
    for name, path in modules().items():
        text = path.read_text()
        if text.count("\n") > LONG_MODULE_LINES:
            long[name] = ast.get_docstring(ast.parse(text)) or ""
    assert long  # the check sees the long modules (engine.py is one)
    unexplained = sorted(n for n, doc in long.items() if "\nSize: " not in f"\n{doc}")
    assert unexplained == [], unexplained
