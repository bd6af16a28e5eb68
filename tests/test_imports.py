"""The pure layers load without torch (ARCHITECTURE's rules): the decision contract, prompt
rendering, readout math and prefix cache, the sampling parameters, the grammar front end, and
the server's OpenAI request models. Each check imports in a fresh interpreter, since this test
process has torch loaded already."""

import subprocess
import sys

import pytest

PURE = [
    "onepass.contract",
    "onepass.prompt",
    "onepass.readout",
    "onepass.cache",
    "onepass.generate.params",
    "onepass.generate.chat",
    "onepass.generate.tools",
    "onepass.generate.grammar",
    "onepass.server.openai",
    "onepass.server.openai_schema",
    "onepass.server.decisions_openai",
]


@pytest.mark.parametrize("module", PURE)
def test_pure_module_loads_without_torch(module):
    script = (f"import sys, {module}; "
              "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", f"{module} loads torch"
