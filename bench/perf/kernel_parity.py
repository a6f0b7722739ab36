"""mamba-ssm's Triton SSD kernel against the pure-PyTorch scans of models/ssd.py, forward and
backward, on the shapes of the shipped model configs (conf/model/mamba.yaml, mambazero.yaml,
mamba_lm14m.yaml).

Used three ways:
- imported by tests/test_ssd.py, for the CUDA parity tests (`parity(..., device="cuda")`);
- imported by bench/perf/gpucheck/, for the error tables of a GPU check;
- run as a script in a subprocess, for the CPU parity test under Triton's interpreter:

      TRITON_INTERPRET=1 python -m bench.perf.kernel_parity [case ...]

  prints one JSON object: the import error (None when the kernel imports), the file of the
  `mamba_ssm` package that was imported, and for each case (`mamba-float32`, `mamba-float16`,
  `mambazero-float32`, ...; default all four float32 and float16 ones) the max abs errors of the kernel and of `ssd_chunked` against the float64
  `ssd_sequential` oracle, of the kernel against `ssd_chunked`, and the oracle's scale
  (max abs value) of each quantity. TRITON_INTERPRET=1 must be set before triton is imported,
  which is why this runs in its own process and never inside the test session.

The kernel is imported the plain way (models/ssd.py), which runs mamba_ssm's `__init__`. The
install this harness runs on (CI's, and the wheel a GPU check carries: built with
MAMBA_SKIP_CUDA_BUILD=TRUE and --no-deps, README.md section GPUs) lacks two of its imports, the
compiled extension `selective_scan_cuda` and `transformers`; `stand_in_env` puts placeholders for
the missing ones on the subprocess's PYTHONPATH (tests/mamba_ssm_stand_ins/: nothing of ours calls
them). Product code never does this: there `model.kernel=mamba_ssm` needs the real install.

On the CPU the script patches what the kernel's Python wrappers need from a GPU (facts measured
on a CPU install of mamba-ssm 2.3.2.post1): `torch.cuda.device(index)` becomes a null context,
`torch.cuda.get_device_properties(...)` an object with `multi_processor_count` (132, an H100's;
it only decides how the backward splits heads between programs), and every autotuned kernel takes
the first of its configs instead of timing them (the interpreter has no benchmark timer). The
backward is the default, non-deterministic one that training uses (MAMBA_DETERMINISTIC unset).

Every case runs the kernel as the models call it: through `ssd_scan(kernel="mamba_ssm")` on
CUDA, through the same wrapper without its CUDA check, `_call_mamba_chunk_scan`, on the CPU
(dt already positive, no dt_bias or softplus in the kernel, D per head, final state returned), with
x, B and C strided views of one (batch, T, d_inner + 2 * ngroups * d_state) tensor as the mixer's
split produces them, x, dt, B, C, D (and the initial state) in the case's dtype and A in float32
(the mixer's `decay_rate()` is at least float32). The loss for the backward pass weights y and the
final state with fixed random weights, so every gradient is checked, not just one direction.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
import time
import types
from collections.abc import Mapping
from pathlib import Path

import torch
import yaml

from models import ssd

ROOT = Path(__file__).resolve().parents[2]
# One folder per module that mamba_ssm's __init__ imports and a MAMBA_SKIP_CUDA_BUILD, --no-deps
# install lacks, each holding a placeholder of that module (see their docstrings).
STAND_INS = ROOT / "tests" / "mamba_ssm_stand_ins"
CONFIGS = ("mamba", "mambazero")  # cheap enough for the interpreter
CUDA_CONFIGS = CONFIGS + ("mamba_lm14m",)  # the language model's scan: 8 heads of 64, 32 states
BATCH = 2
LENGTH = 100  # with the shipped chunk_size 64: a full chunk, the state carried across, a padded tail
QUANTITIES = ("y", "final_state", "dx", "ddt", "dA", "dB", "dC", "dD", "dinitial_state")
CPU_CASES = tuple(f"{name}-{dtype}" for name in CONFIGS for dtype in ("float32", "float16"))
# On the CPU the float32 cases carry an initial state (its gradient is checked) and the float16
# ones do not, as the models call the scan.
CPU_INITIAL_STATE = {"float32": True, "float16": False}


# Not a shipped config: several heads sharing groups (head h reads group h // (H // G)); checked
# on CUDA only, where it costs nothing (under the interpreter it would take ~8x a shipped case).
EXTRA_SHAPES = {"heads4_groups2": dict(heads=4, headdim=16, groups=2, states=16, chunk_size=32)}


def scan_shape(name: str) -> dict:
    """The SSD scan's shape in the shipped model config `conf/model/<name>.yaml` (or one of
    EXTRA_SHAPES)."""
    if name in EXTRA_SHAPES:
        return dict(EXTRA_SHAPES[name])
    config = yaml.safe_load((ROOT / "conf" / "model" / f"{name}.yaml").read_text())
    d_inner = config["expand"] * config["d_model"]
    return dict(heads=d_inner // config["headdim"], headdim=config["headdim"],
                groups=config["ngroups"], states=config["d_state"],
                chunk_size=config["chunk_size"])


def missing_stand_ins() -> list[str]:
    """The stand-in folder of each module in STAND_INS that this interpreter cannot find (a
    module that is installed is never shadowed)."""
    return [str(folder) for folder in sorted(STAND_INS.iterdir())
            if folder.is_dir() and importlib.util.find_spec(folder.name) is None]


def stand_in_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of `env` for a subprocess that imports mamba_ssm from the harness's install: its
    PYTHONPATH starts with missing_stand_ins(), then what it held before. For test and check
    harnesses only (tests/test_ssd.py, bench/perf/gpucheck/), never a run's own environment."""
    paths = missing_stand_ins() + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    out = dict(env)
    if paths:
        out["PYTHONPATH"] = os.pathsep.join(paths)
    return out


def _inputs(shape: dict, dtype: torch.dtype, device: str, initial_state: bool, seed: int):
    """Leaf tensors in float64 on the CPU (then cast), the loss weights, and a function that
    turns leaves into the scan's arguments the way the mixer does."""
    g = torch.Generator().manual_seed(seed)
    heads, headdim, groups, states = (shape[k] for k in ("heads", "headdim", "groups", "states"))
    d_inner = heads * headdim
    leaves = dict(xBC=torch.randn(BATCH, LENGTH, d_inner + 2 * groups * states, generator=g,
                                  dtype=torch.float64),
                  dt=torch.rand(BATCH, LENGTH, heads, generator=g, dtype=torch.float64) + 0.05,
                  A=-(torch.rand(heads, generator=g, dtype=torch.float64) + 0.1),
                  D=torch.randn(heads, generator=g, dtype=torch.float64))
    if initial_state:
        leaves["initial_state"] = torch.randn(BATCH, heads, headdim, states, generator=g,
                                              dtype=torch.float64)
    weights = (torch.randn(BATCH, LENGTH, heads, headdim, generator=g, dtype=torch.float64),
               torch.randn(BATCH, heads, headdim, states, generator=g, dtype=torch.float64))
    # The inputs as the kernel sees them (rounded to dtype; A at least float32) ...
    low = {k: v.to(device=device, dtype=torch.float32 if k == "A" and dtype != torch.float64
                   else dtype) for k, v in leaves.items()}
    # ... and the oracle sees exactly those values, in float64.
    exact = {k: v.to(torch.float64) for k, v in low.items()}

    def arguments(t: dict) -> dict:
        x, B, C = torch.split(t["xBC"], [d_inner, groups * states, groups * states], dim=-1)
        return dict(x=x.unflatten(-1, (heads, headdim)), dt=t["dt"], A=t["A"],
                    B=B.unflatten(-1, (groups, states)), C=C.unflatten(-1, (groups, states)),
                    D=t["D"], initial_state=t.get("initial_state"))

    def split_grads(grads: dict) -> dict:
        dx, dB, dC = torch.split(grads.pop("xBC"), [d_inner, groups * states, groups * states],
                                 dim=-1)
        named = {"dx": dx, "dB": dB, "dC": dC}
        named.update({"d" + k: v for k, v in grads.items()})
        return named

    weights = tuple(w.to(device) for w in weights)
    return low, exact, weights, arguments, split_grads


def _run(scan, leaves: dict, weights, arguments, split_grads) -> tuple[dict, dict]:
    """y, final state and every gradient of one scan, and its forward/backward seconds."""
    leaves = {k: v.clone().requires_grad_() for k, v in leaves.items()}
    start = time.perf_counter()
    y, final = scan(**arguments(leaves))
    forward = time.perf_counter() - start
    loss = (y.double() * weights[0]).sum() + (final.double() * weights[1]).sum()
    start = time.perf_counter()
    grads = torch.autograd.grad(loss, list(leaves.values()))
    backward = time.perf_counter() - start
    out = {"y": y.detach(), "final_state": final.detach()}
    out.update(split_grads(dict(zip(leaves, grads))))
    return out, {"forward": forward, "backward": backward}


def parity(name: str, dtype: str, device: str, initial_state: bool = True, seed: int = 0,
           raw: bool = False) -> dict:
    """Errors of the kernel and of `ssd_chunked` against the float64 `ssd_sequential` oracle (run
    on the same rounded inputs), of the kernel against `ssd_chunked`, and the oracle's scale, for
    the scan of shipped config `name` (or an EXTRA_SHAPES entry) in `dtype` ("float32",
    "float16", "bfloat16"). With `raw`, the kernel is mamba_ssm's function called directly on the
    inputs in `dtype` (what it does without our float32 upcast), not the models' path."""
    shape = scan_shape(name)
    chunk = shape["chunk_size"]
    low, exact, weights, arguments, split_grads = _inputs(shape, getattr(torch, dtype), device,
                                                          initial_state, seed)

    def kernel(x, dt, A, B, C, D, initial_state):
        if raw:
            y, final = ssd._import_mamba_chunk_scan()(
                x, dt, A, B, C, chunk_size=chunk, D=D, initial_states=initial_state,
                dt_softplus=False, return_final_states=True)
            return y, final.to(y.dtype)
        if x.is_cuda:  # the models' path, through the dispatcher
            return ssd.ssd_scan(x, dt, A, B, C, D, initial_state, chunk, kernel="mamba_ssm")
        return ssd._call_mamba_chunk_scan(x, dt, A, B, C, D, initial_state, chunk)

    def chunked(**kw):
        return ssd.ssd_chunked(**kw, chunk_size=chunk)

    oracle, _ = _run(ssd.ssd_sequential, exact, weights, arguments, split_grads)
    fast, seconds = _run(kernel, low, weights, arguments, split_grads)
    reference, _ = _run(chunked, low, weights, arguments, split_grads)
    for out in (fast, reference):
        assert out["y"].dtype == getattr(torch, dtype) and out["final_state"].dtype == out["y"].dtype

    def max_abs(a: dict, b: dict) -> dict:
        return {q: (a[q].double() - b[q].double()).abs().max().item() for q in oracle}

    return {"shape": shape, "dtype": dtype, "device": device, "initial_state": initial_state,
            "raw": raw, "batch": BATCH, "length": LENGTH, "seconds": seconds,
            "scale": {q: v.abs().max().item() for q, v in oracle.items()},
            "errors": {"kernel": max_abs(fast, oracle), "chunked": max_abs(reference, oracle),
                       "kernel_vs_chunked": max_abs(fast, reference)}}


# Tolerances of the kernel, relative to each quantity's largest value (tests/test_ssd.py and
# gpucheck's parity rows): float32 1e-2 allows TF32 dot products (10 mantissa bits) should a
# process enable them; float16 4e-3 (4 float16 eps); bfloat16 3e-2 (4 bfloat16 eps). Measured on
# an H100 (gpucheck, 2026-11-26): the kernel's worst error against the float64 oracle was 2.9e-6
# in float32, 1.8e-2 in bf16 and 4.6e-3 in float16 -- dA of the `mamba` scan, where our own
# chunked scan, given the same rounded inputs, is as far off (4.55e-3): the rounding of the
# float16 output y and of its incoming gradient, summed over 6,400 terms into one number.
CUDA_TOLERANCE = {"float32": 1e-2, "float16": 4e-3, "bfloat16": 3e-2}
# A kernel error over the tolerance still passes when our chunked scan, run on the same rounded
# inputs, is this close to as far from the oracle: the error is then the dtype's, not the
# kernel's (the kernel-vs-chunked difference must still be within the tolerance).
AS_FAR_AS_CHUNKED = 1.25


def parity_failures(result: dict, tolerance: float) -> list[str]:
    """What of `parity`'s result breaks the rule (empty: the kernel passes). Per quantity, the
    kernel's error against the oracle must be within `tolerance` x the oracle's largest value
    or within AS_FAR_AS_CHUNKED x our chunked scan's error on the same inputs, and the kernel
    must agree with the chunked scan within `tolerance`."""
    errors, scale, failures = result["errors"], result["scale"], []
    for quantity, error in errors["kernel"].items():
        bound = max(tolerance * scale[quantity],
                    AS_FAR_AS_CHUNKED * errors["chunked"][quantity])
        if error > bound:
            failures.append(f"kernel {quantity}: {error:.3g} > {bound:.3g} (tolerance "
                            f"{tolerance:g} x {scale[quantity]:.3g}; chunked scan "
                            f"{errors['chunked'][quantity]:.3g})")
    for quantity, error in errors["kernel_vs_chunked"].items():
        if error > tolerance * scale[quantity]:
            failures.append(f"kernel_vs_chunked {quantity}: {error:.3g} > {tolerance:g} x "
                            f"{scale[quantity]:.3g}")
    return failures


def within_tolerance(result: dict, tolerance: float) -> bool:
    return not parity_failures(result, tolerance)


def pin_configs(index: int) -> None:
    """Every Triton autotuner of this process runs config number `index` of its list instead of
    timing them all (a negative index counts from the end; one past a shorter list wraps
    around). Two uses: parity checks the kernel's arithmetic at one fixed configuration per
    kernel, the last (mamba-ssm lists its largest blocks first: the last compiles fastest),
    without the minutes a cold autotune takes; and gpucheck's warm-up compiles config i of every
    kernel in process i, in parallel, so that a later autotune finds every config compiled in
    Triton's cache. Triton runs a single remaining config without benchmarking it."""
    from triton.runtime.autotuner import Autotuner

    prune = Autotuner.prune_configs

    def pinned(self, kwargs):
        configs = prune(self, kwargs)
        return [configs[index % len(configs)]]

    Autotuner.prune_configs = pinned


def patch_for_cpu() -> None:
    """What the kernel's wrappers need from a GPU, for running them under TRITON_INTERPRET=1."""
    torch.cuda.device = lambda device: contextlib.nullcontext()
    torch.cuda.get_device_properties = (
        lambda device=None: types.SimpleNamespace(multi_processor_count=132))
    # One config left: the autotuner then runs it without benchmarking (which the interpreter
    # cannot do: "0 active drivers").
    pin_configs(0)


def main(cases: list[str]) -> dict:
    if os.environ.get("TRITON_INTERPRET") != "1" or "triton" in sys.modules:
        raise SystemExit("set TRITON_INTERPRET=1 in the environment, before triton is imported")
    torch.set_num_threads(1)
    patch_for_cpu()

    start = time.perf_counter()
    error = ssd.mamba_ssm_kernel_error()
    result = {"import_seconds": time.perf_counter() - start, "error": error}
    result["cases"] = {}
    if error is None:
        import mamba_ssm  # imported whole by the plain import above: the installed package
        result["mamba_ssm_file"] = mamba_ssm.__file__
        for case in cases:
            name, dtype = case.split("-")
            result["cases"][case] = parity(name, dtype, "cpu",
                                           initial_state=CPU_INITIAL_STATE.get(dtype, True))
    return result


def relative_errors(result: dict) -> dict:
    """Each max abs error divided by the oracle's max abs value of that quantity."""
    return {against: {q: e / result["scale"][q] if result["scale"][q] else e
                      for q, e in errors.items()}
            for against, errors in result["errors"].items()}


def format_errors(result: dict) -> str:
    """One line per quantity: kernel, chunked and kernel-vs-chunked max abs errors, oracle scale."""
    lines = [f"{'':15} {'kernel':>10} {'chunked':>10} {'k-vs-c':>10} {'scale':>10}"]
    errors = result["errors"]
    for q in result["scale"]:
        lines.append(f"{q:15} {errors['kernel'][q]:10.2e} {errors['chunked'][q]:10.2e} "
                     f"{errors['kernel_vs_chunked'][q]:10.2e} {result['scale'][q]:10.2e}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    out = main(sys.argv[1:] or list(CPU_CASES))
    for case, res in out["cases"].items():
        print(f"{case} (forward {res['seconds']['forward']:.1f} s, backward "
              f"{res['seconds']['backward']:.1f} s)\n{format_errors(res)}", file=sys.stderr)
    print(json.dumps(out))
