"""bench/perf/triton_compile_cost.py compiles Triton kernels for an H100 (sm_90) on a machine without
a GPU: its compile-only driver gets a real cubin out of Triton's whole pipeline (front end, LLVM,
ptxas) and launches nothing, and Triton's public compile hooks see each compilation."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="needs triton (pip install -e .[gpu])")

SCRIPT = r"""
import tempfile, os, sys
sys.path.insert(0, os.getcwd())
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp()
import torch, triton, triton.language as tl
from triton import knobs
from triton.runtime.driver import driver
from bench.perf.triton_compile_cost import compile_only_driver

@triton.jit
def add(x, y, out, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + i, tl.load(x + i, mask=i < n) + tl.load(y + i, mask=i < n), mask=i < n)

driver.set_active(compile_only_driver(90))
seen = []
knobs.runtime.jit_post_compile_hook = lambda **kw: seen.append(kw["fn"].name)
x = torch.zeros(64)
kernel = add[(1,)](x, x, x, 64, BLOCK=64)
print(seen, kernel.metadata.target.arch, len(kernel.asm["cubin"]) > 0, "sm_90" in kernel.asm["ptx"])
"""


def test_a_kernel_compiles_for_sm90_without_a_gpu_and_the_hooks_see_it(tmp_path):
    script = tmp_path / "compile_add.py"  # Triton reads a kernel's source from its file
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-4:] == ["['add']", "90", "True", "True"], done.stdout


def test_bad_options_are_one_line_errors(capsys):
    from bench.perf.triton_compile_cost import main
    assert main(["shape=big"]) == 2
    err = capsys.readouterr().err
    assert "unknown or empty option 'shape=big'" in err and err.count("\n") == 1
