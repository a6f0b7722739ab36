"""What a cold autotune of mamba-ssm's SSD kernel costs before any GPU time: every autotune
configuration of every Triton kernel that one forward and backward call of
`mamba_chunk_scan_combined` runs, compiled for real (Triton's front end, LLVM, ptxas) for an H100
(sm_90), on a machine without a GPU.

    python -m bench.perf.triton_compile_cost [model=mamba] [batch=64] [length=256] [arch=90]

The scan shape is that of `conf/model/<model>.yaml` (bench.perf.kernel_parity.scan_shape, also its
EXTRA_SHAPES), called as the models call it (x, B, C views of one tensor, float32, D, no initial
state), at `batch` sequences of `length`. Under a compile-only Triton driver nothing is launched
and each configuration's "benchmark" is its one compilation, so the autotuner compiles every
configuration once, in order; Triton's public compile hooks time each. Prints one JSON object:
configurations and seconds, forward and in all, the seconds of each kernel's i-th configuration
summed over kernels (what warm-up process i of gpucheck compiles), and of each kernel's last
(what gpucheck's parity compiles). Each run compiles into a fresh cache. The mamba-ssm install
without its CUDA extension gets the harness's stand-ins (bench.perf.kernel_parity.stand_in_env): the
script runs itself again with them."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import types
from collections import defaultdict


def compile_only_driver(arch: int):
    """A Triton driver that compiles for CUDA `arch` and launches nothing (no GPU needed)."""
    import torch
    from triton.backends import DriverBase
    from triton.backends.compiler import GPUTarget

    class CompileOnly(DriverBase):
        @classmethod
        def is_active(cls):
            return True

        def __init__(self):
            properties = {"max_shared_mem": 232448, "multiprocessor_count": 132,
                          "max_num_regs": 65536, "warpSize": 32}  # an H100's
            self.utils = types.SimpleNamespace(
                get_device_properties=lambda device: properties,
                load_binary=lambda name, kernel, shared, device: (None, None, 0, 0, 1024))
            self.launcher_cls = lambda src, metadata: (lambda *args: None)

        def map_python_to_cpp_type(self, ty):
            return "void*"

        def get_current_target(self):
            return GPUTarget("cuda", arch, 32)

        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

        def get_active_torch_device(self):
            return torch.device("cpu")

        def get_benchmarker(self):
            def compile_once(kernel_call, quantiles=None, **kwargs):
                kernel_call()
                return [1.0, 1.0, 1.0]
            return compile_once

        def get_empty_cache_for_benchmark(self):
            return torch.empty(1)

        def clear_cache(self, cache):
            pass

    return CompileOnly()


def measure(model: str, batch: int, length: int, arch: int) -> dict:
    import torch
    from triton import knobs
    from triton.runtime.driver import driver

    from bench.perf.kernel_parity import scan_shape

    driver.set_active(compile_only_driver(arch))
    # what the kernel's Python wrappers ask of a GPU (bench.perf.kernel_parity.patch_for_cpu)
    torch.cuda.device = lambda device: contextlib.nullcontext()
    torch.cuda.get_device_properties = (
        lambda device=None: types.SimpleNamespace(multi_processor_count=132))
    started: dict[str, float] = {}
    seconds: dict[str, list[float]] = defaultdict(list)

    def before(**kwargs):
        started[kwargs["fn"].name] = time.perf_counter()
        return False  # compile it

    def after(**kwargs):
        name = kwargs["fn"].name
        seconds[name].append(time.perf_counter() - started.pop(name))

    knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook = before, after
    from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined

    shape = scan_shape(model)
    heads, headdim, groups, states = (shape[k] for k in ("heads", "headdim", "groups", "states"))
    xBC = torch.randn(batch, length, heads * headdim + 2 * groups * states, requires_grad=True)
    x, B, C = torch.split(xBC, [heads * headdim, groups * states, groups * states], dim=-1)
    dt = (torch.rand(batch, length, heads) + 0.1).requires_grad_()
    A = -torch.ones(heads, requires_grad=True)
    D = torch.ones(heads, requires_grad=True)
    start = time.perf_counter()
    y, final = mamba_chunk_scan_combined(
        x.unflatten(-1, (heads, headdim)), dt, A, B.unflatten(-1, (groups, states)),
        C.unflatten(-1, (groups, states)), chunk_size=shape["chunk_size"], D=D,
        return_final_states=True)
    forward_s, forward_n = time.perf_counter() - start, sum(map(len, seconds.values()))
    (y.sum() + final.sum()).backward()
    total_s = time.perf_counter() - start
    longest = max(map(len, seconds.values()))
    return {"model": model, "shape": shape, "batch": batch, "length": length, "arch": arch,
            "configs_forward": forward_n, "forward_s": forward_s,
            "configs": sum(map(len, seconds.values())), "total_s": total_s,
            "kernels": {name: [round(s, 2) for s in times] for name, times in seconds.items()},
            "by_config_index_s": [round(sum(t[i] for t in seconds.values() if len(t) > i), 1)
                                  for i in range(longest)],
            # what gpucheck's parity compiles (kernel_parity.pin_configs(-1)): each last config
            "last_configs_s": round(sum(t[-1] for t in seconds.values()), 1)}


def main(argv: list[str]) -> int:
    options = dict(model="mamba", batch="64", length="256", arch="90")
    for arg in argv:
        key, _, value = arg.partition("=")
        if key not in options or not value:
            print(f"error: unknown or empty option '{arg}'; options: {', '.join(options)}",
                  file=sys.stderr)
            return 2
        options[key] = value
    if os.environ.get("ICL_COMPILE_COST_CHILD") != "1":  # again, with the stand-ins, a fresh cache
        from bench.perf.kernel_parity import stand_in_env
        with tempfile.TemporaryDirectory() as cache:
            env = dict(stand_in_env(os.environ), ICL_COMPILE_COST_CHILD="1",
                       TRITON_CACHE_DIR=cache, TRITON_F32_DEFAULT="ieee")
            return subprocess.run([sys.executable, "-m", "bench.perf.triton_compile_cost", *argv],
                                  env=env).returncode
    result = measure(options["model"], int(options["batch"]), int(options["length"]),
                     int(options["arch"]))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
