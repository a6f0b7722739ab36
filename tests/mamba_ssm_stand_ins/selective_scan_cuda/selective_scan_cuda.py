"""A placeholder for mamba-ssm's compiled CUDA extension `selective_scan_cuda` (Mamba-1's selective
scan), for the kernel parity harness only (bench/perf/kernel_parity.py `stand_in_env`).

mamba-ssm built with MAMBA_SKIP_CUDA_BUILD=TRUE (no nvcc: the CPU CI, the wheel a GPU check
carries) has no such extension, yet the package's `__init__` imports it, so `import mamba_ssm`, and
with it the plain import of the Triton SSD kernel, would fail. This module only lets that import
succeed: our code never calls the extension (the SSD kernel is pure Triton), and it defines
nothing, so any call into it fails loudly with an AttributeError. It is never on the path of a
normal run: `model.kernel=mamba_ssm` needs the real extension (README.md, section GPUs).
"""
