"""The SSD scan of Mamba-2 (state space duality, Dao & Gu 2024): a selective SSM whose decay is one
scalar per head and time step.

For every head h (P channels) with its group's input/output projections B_t, C_t (N states):

    H_t = exp(dt_t * A) * H_{t-1} + dt_t * x_t B_t^T        H_t in R^{P x N}
    y_t = H_t C_t + D * x_t

Three implementations of the same map, all returning (y, final_state):
- `ssd_sequential`: the recurrence step by step; slow, obviously right, the test oracle.
- `ssd_chunked`: the blocked form in pure PyTorch. Inside a chunk of L steps the output is a
  masked (L x L) "attention" with decays exp(sum of log-decays between the two steps); across
  chunks the state is carried by a recurrence over chunk summaries. Any sequence length works:
  the tail is padded with dt = 0 steps, which neither decay nor write the state.
- the Triton kernel `mamba_chunk_scan_combined` of the optional `mamba_ssm` package (CUDA only;
  its parity test also runs it on the CPU under Triton's interpreter, bench/perf/kernel_parity.py),
  reached through `ssd_scan(..., kernel="mamba_ssm")`; `ssd_scan` also dispatches to the other
  two ("torch" = chunked, "sequential").

`scan_override` makes every `ssd_scan` in a block run another function instead; with
`kernel_footprint`, a stand-in that allocates what the kernel allocates and computes nothing,
the pre-run memory estimate (bench/training/memory.py) measures a model as the kernel will run it, on a
machine without the kernel or a GPU.

Shapes: x (B, T, H, P), dt (B, T, H) positive (already softplus'd), A (H,) (negative for a
decay; zero gives a_t = 1), B and C (B, T, G, N) with G dividing H (head h reads group
h // (H // G), the mamba_ssm convention), D (H,) or None, initial_state (B, H, P, N) or None.
"""
from __future__ import annotations

import contextlib
import contextvars
import warnings
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from models.configs import KERNELS


def _check_shapes(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor) -> tuple[int, int]:
    batch, length, heads, _ = x.shape
    groups = B.shape[2]
    if dt.shape != (batch, length, heads) or A.shape != (heads,):
        raise ValueError(f"dt must be (B,T,H)={(batch, length, heads)} and A (H,)={(heads,)}, "
                         f"got {tuple(dt.shape)} and {tuple(A.shape)}")
    if B.shape[:3] != (batch, length, groups) or C.shape != B.shape:
        raise ValueError(f"B and C must both be (B,T,G,N), got {tuple(B.shape)} and {tuple(C.shape)}")
    if heads % groups:
        raise ValueError(f"the number of groups ({groups}) must divide the number of heads ({heads})")
    return heads, groups


def _heads_of_groups(t: Tensor, heads: int) -> Tensor:
    """(..., G, N) -> (..., H, N): every head reads its group's B or C."""
    return t.repeat_interleave(heads // t.shape[-2], dim=-2)


def ssd_sequential(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None = None,
                   initial_state: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The recurrence one step at a time. Returns y (B,T,H,P) and the final state (B,H,P,N).
    Computes in at least float32 (autocast off), like `ssd_chunked`: the state is a running
    sum that a bfloat16 einsum would round at every step."""
    heads, _ = _check_shapes(x, dt, A, B, C)
    batch, length, _, headdim = x.shape
    out_dtype = x.dtype
    dtype = torch.promote_types(x.dtype, torch.float32)
    with torch.autocast(device_type=x.device.type, enabled=False):
        x, dt, A, B, C = (t.to(dtype) for t in (x, dt, A, B, C))
        B_heads, C_heads = _heads_of_groups(B, heads), _heads_of_groups(C, heads)
        state = (x.new_zeros(batch, heads, headdim, B.shape[-1]) if initial_state is None
                 else initial_state.to(dtype))
        outputs = []
        for t in range(length):
            decay = torch.exp(dt[:, t] * A)[:, :, None, None]                    # (B,H,1,1)
            write = (dt[:, t, :, None] * x[:, t])[..., None] * B_heads[:, t, :, None, :]
            state = decay * state + write                                         # (B,H,P,N)
            outputs.append(torch.einsum("bhpn,bhn->bhp", state, C_heads[:, t]))
        y = torch.stack(outputs, dim=1) if length else x.new_zeros(x.shape)
        if D is not None:
            y = y + D.to(dtype)[:, None] * x
    return y.to(out_dtype), state.to(out_dtype)


def segment_sum(log_decay: Tensor) -> Tensor:
    """(..., L) -> (..., L, L) with entry [i, j] = sum_{j < k <= i} log_decay[k] for j <= i and
    -inf above the diagonal, so exp() of it is the causal decay matrix. Built by a masked cumsum
    rather than a difference of cumsums, which would cancel catastrophically for long chunks.

    Its backward pass is its own: ∂L/∂log_decay[k] sums the gradient over the rectangle
    i >= k > j, a cumsum along rows and a masked column sum. Autograd through the masked
    cumsum (two masked fills, a cumsum down the columns and its reversal) took 2.8 ms of the
    default CPU step; the values agree up to rounding."""
    return _SegmentSum.apply(log_decay)


class _SegmentSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, log_decay: Tensor) -> Tensor:
        return _segment_sum(log_decay)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> Tensor:
        # sums[..., i, m] = Σ_{j <= m} grad[i, j]; ∂/∂log_decay[m + 1] = Σ_{i > m} sums[i, m]
        # (only entries below the diagonal are read: the -inf ones above pass no gradient)
        length = grad.shape[-1]
        below = torch.ones(length, length, dtype=torch.bool, device=grad.device).tril(-1)
        columns = (grad.cumsum(dim=-1) * below).sum(dim=-2)
        return F.pad(columns[..., :-1], (1, 0))


def _segment_sum(log_decay: Tensor) -> Tensor:
    """segment_sum's values, without autograd."""
    length = log_decay.shape[-1]
    repeated = log_decay[..., :, None].expand(*log_decay.shape, length)  # [i, j] = log_decay[i]
    strictly_lower = torch.ones(length, length, dtype=torch.bool, device=log_decay.device).tril(-1)
    sums = repeated.masked_fill(~strictly_lower, 0.0).cumsum(dim=-2)
    lower = torch.ones(length, length, dtype=torch.bool, device=log_decay.device).tril(0)
    return sums.masked_fill(~lower, float("-inf"))


def ssd_chunked(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None = None,
                initial_state: Tensor | None = None, chunk_size: int = 64) -> tuple[Tensor, Tensor]:
    """The blocked SSD algorithm in pure PyTorch, for any sequence length. Same contract as
    `ssd_sequential`. Computes in at least float32 (autocast off) because the decays are
    exponentials of sums."""
    heads, groups = _check_shapes(x, dt, A, B, C)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    batch, length, _, headdim = x.shape
    state_dim = B.shape[-1]
    out_dtype = x.dtype
    dtype = torch.promote_types(x.dtype, torch.float32)
    with torch.autocast(device_type=x.device.type, enabled=False):
        x, dt, A, B, C = (t.to(dtype) for t in (x, dt, A, B, C))
        x_in = x
        # Pad the tail with dt = 0 steps: decay exp(0) = 1 and no write, so the state is unchanged.
        pad = -length % chunk_size
        if pad:
            x, B, C = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (x, B, C))
            dt = F.pad(dt, (0, 0, 0, pad))
        chunks = (length + pad) // chunk_size
        per_group = heads // groups

        # (batch, chunk, step, group, head-in-group, ...) so each head meets its group's B and C.
        x = x.reshape(batch, chunks, chunk_size, groups, per_group, headdim)
        dt = dt.reshape(batch, chunks, chunk_size, groups, per_group)
        B = B.reshape(batch, chunks, chunk_size, groups, state_dim)
        C = C.reshape(batch, chunks, chunk_size, groups, state_dim)
        x_dt = x * dt[..., None]
        log_decay = (dt * A.reshape(groups, per_group)).permute(0, 1, 3, 4, 2)  # (b,c,g,r,L)
        log_decay_cum = log_decay.cumsum(dim=-1)

        # 1. Within each chunk: y_i = sum_{j<=i} (C_i . B_j) exp(a_{j+1} + ... + a_i) dt_j x_j.
        decay_within = torch.exp(segment_sum(log_decay))                       # (b,c,g,r,L,L)
        scores = torch.einsum("bclgn,bcsgn->bcgls", C, B)[:, :, :, None] * decay_within
        y = torch.einsum("bcgrls,bcsgrp->bclgrp", scores, x_dt)

        # 2. What each chunk alone writes into the state by its end.
        decay_to_end = torch.exp(log_decay_cum[..., -1:] - log_decay_cum)      # (b,c,g,r,L)
        chunk_writes = torch.einsum("bclgn,bcgrl,bclgrp->bcgrpn", B, decay_to_end, x_dt)

        # 3. The state entering each chunk: a recurrence over chunk summaries, written as a
        #    (chunks+1) x (chunks+1) decay matrix over the chunk totals (slot 0 = initial state).
        if initial_state is None:
            start = x.new_zeros(batch, 1, groups, per_group, headdim, state_dim)
        else:
            start = initial_state.to(dtype).reshape(batch, 1, groups, per_group, headdim, state_dim)
        summaries = torch.cat([start, chunk_writes], dim=1)                    # (b,c+1,g,r,p,n)
        chunk_totals = F.pad(log_decay_cum[..., -1].permute(0, 2, 3, 1), (1, 0))  # (b,g,r,c+1)
        decay_across = torch.exp(segment_sum(chunk_totals))                    # (b,g,r,c+1,c+1)
        states = torch.einsum("bgrzc,bcgrpn->bzgrpn", decay_across, summaries)
        entering, final = states[:, :-1], states[:, -1]

        # 4. Each step reads the entering state, decayed up to that step.
        y = y + torch.einsum("bclgn,bcgrpn,bcgrl->bclgrp", C, entering, torch.exp(log_decay_cum))

        y = y.reshape(batch, chunks * chunk_size, heads, headdim)[:, :length]
        if D is not None:
            y = y + D.to(dtype)[:, None] * x_in
        final = final.reshape(batch, heads, headdim, state_dim)
    return y.to(out_dtype), final.to(out_dtype)


# ---------------------------------------------------------------------------------------------
# The optional CUDA kernel.

_kernel_cache: dict[str, Callable | str] = {}  # "fn": the kernel, or "error": why it does not import
_auto_cache: dict[str, str] = {}  # device type -> what kernel="auto" runs there (resolved once)
_auto_fallback: dict[str, str] = {}  # device type -> why "auto" fell back to torch there

KERNEL_INSTALL = ("mamba-ssm with its CUDA extension: on a CUDA machine, pip install mamba-ssm "
                  "--no-build-isolation (README.md, section GPUs)")


def _import_mamba_chunk_scan() -> Callable:
    """`mamba_ssm.ops.triton.ssd_combined.mamba_chunk_scan_combined`, imported on first use, the
    plain way: importing it runs the package's `__init__`, which imports mamba-ssm's compiled
    CUDA extension (`selective_scan_cuda`) and its model classes' requirements (transformers,
    huggingface_hub), so the kernel imports only from an ordinary install of mamba-ssm
    (KERNEL_INSTALL). An install built without the extension (MAMBA_SKIP_CUDA_BUILD) fails here
    with "No module named 'selective_scan_cuda'"; the kernel parity test's harness runs that
    install with stand-ins on PYTHONPATH (bench/perf/kernel_parity.py `stand_in_env`).

    The outcome is cached; a failure raises a fresh RuntimeError with the cached reason each
    time (re-raising one stored exception object would grow its traceback on every call)."""
    if "fn" in _kernel_cache:
        return _kernel_cache["fn"]
    if "error" in _kernel_cache:
        raise RuntimeError(_kernel_cache["error"])
    try:
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
    except Exception as error:  # not only ImportError: a broken install (a Triton that finds
        # no driver, a mismatched build) makes the kernel unavailable too, never a traceback
        _kernel_cache["error"] = (
            f"kernel='mamba_ssm' needs {KERNEL_INSTALL}; importing "
            f"mamba_ssm.ops.triton.ssd_combined failed: {type(error).__name__}: {error}")
        raise RuntimeError(_kernel_cache["error"]) from error
    _kernel_cache["fn"] = mamba_chunk_scan_combined
    return _kernel_cache["fn"]


def mamba_ssm_kernel_error() -> str | None:
    """Why the mamba_ssm kernel cannot be used here, or None when it imports."""
    try:
        _import_mamba_chunk_scan()
    except RuntimeError as error:
        return str(error)
    return None


def mamba_ssm_available() -> bool:
    return mamba_ssm_kernel_error() is None


def _call_mamba_chunk_scan(x, dt, A, B, C, D, initial_state, chunk_size) -> tuple[Tensor, Tensor]:
    """The kernel with this module's conventions, on any device the kernel can run on (CUDA; the
    CPU parity test runs it under Triton's interpreter).

    Like `ssd_chunked`, it computes in at least float32 with autocast off: under bf16-mixed, x, B
    and C arrive in bfloat16, and the kernel would carry its chunk states and write its output in
    bfloat16 (measured on CUDA: README, section GPU); upcast, only the returned y is rounded to
    x's dtype. Its float32 dot products follow the process's TF32 policy (bench.training.train
    `apply_tf32_policy`: Triton's TRITON_F32_DEFAULT)."""
    scan = _import_mamba_chunk_scan()
    out_dtype = x.dtype
    dtype = torch.promote_types(x.dtype, torch.float32)
    with torch.autocast(device_type=x.device.type, enabled=False):
        x, dt, A, B, C = (t.to(dtype) for t in (x, dt, A, B, C))
        D = D.to(dtype) if D is not None else None
        initial_state = initial_state.to(dtype) if initial_state is not None else None
        # dt is already positive, so the kernel's own bias and softplus are left off.
        y, final = scan(x, dt, A, B, C, chunk_size=chunk_size, D=D, initial_states=initial_state,
                        dt_softplus=False, return_final_states=True)
    # The other scans return y and the final state in x's dtype, and so does this one, so the
    # choice of kernel changes no dtype.
    return y.to(out_dtype), final.to(out_dtype)


def _ssd_mamba_ssm(x, dt, A, B, C, D, initial_state, chunk_size) -> tuple[Tensor, Tensor]:
    if not x.is_cuda:
        raise RuntimeError("kernel='mamba_ssm' runs on CUDA tensors only; use kernel='torch' "
                           "or 'auto' on this device")
    return _call_mamba_chunk_scan(x, dt, A, B, C, D, initial_state, chunk_size)


def _smoke_test_kernel(device: torch.device, shape: tuple[int, ...] | None = None) -> str | None:
    """Why the mamba_ssm kernel cannot train on `device` (it imports but a forward and backward
    call fails: a Triton or driver mismatch), or None when it runs. `shape`: (batch, length,
    heads, headdim, groups, states, chunk_size) of the scan a model will run, called with inputs
    laid out as the mixer lays them out (x, B, C views of one tensor), so that the autotuning
    this first call does (Triton tunes per shape and specialises on sizes) is the one training
    needs rather than a separate tuning of a toy shape; default a tiny one."""
    batch, length, heads, headdim, groups, states, chunk = shape or (1, 16, 1, 16, 1, 16, 16)
    try:
        g = torch.Generator(device=device).manual_seed(0)
        width = heads * headdim + 2 * groups * states
        xBC = torch.randn(batch, length, width, device=device, generator=g, requires_grad=True)
        x, B, C = torch.split(xBC, [heads * headdim, groups * states, groups * states], dim=-1)
        dt = torch.rand(batch, length, heads, device=device, generator=g) + 0.1
        A = -torch.ones(heads, device=device)
        D = torch.ones(heads, device=device)
        y, _ = _ssd_mamba_ssm(x.unflatten(-1, (heads, headdim)), dt, A,
                              B.unflatten(-1, (groups, states)), C.unflatten(-1, (groups, states)),
                              D, None, chunk)
        y.sum().backward()
        torch.cuda.synchronize(device)
    except Exception as error:  # any failure to launch means: do not use it for training
        return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    return None


_smoke_tested: set[tuple] = set()  # (device type, shape) whose smoke test has run


def resolve_kernel(kernel: str, device: torch.device, dtype: torch.dtype = torch.float32,
                   shape: tuple[int, ...] | None = None) -> str:
    """The implementation `kernel` means for tensors on device: "auto" is the mamba_ssm kernel on
    CUDA when it imports and a call of it runs (checked once per process and device type, and
    once more per `shape` given, see _smoke_test_kernel; `kernel_fallback` says why not),
    otherwise torch; the others are themselves."""
    if kernel not in KERNELS:
        raise ValueError(f"unknown SSD kernel {kernel!r}; choose one of {', '.join(KERNELS)}")
    if kernel != "auto":
        return kernel
    if dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return "torch"
    device = torch.device(device)
    if device.type != "cuda":
        return _auto_cache.setdefault(device.type, "torch")
    decided = _auto_cache.get(device.type)
    if decided == "torch" or (decided == "mamba_ssm"
                              and (shape is None or (device.type, shape) in _smoke_tested)):
        return decided
    reason = mamba_ssm_kernel_error()
    if reason is None:
        _smoke_tested.add((device.type, shape))
        reason = _smoke_test_kernel(device, shape)
        if reason is not None:  # installed but broken: worth a warning
            _auto_fallback[device.type] = reason
            warnings.warn(f"model.kernel=auto: the mamba_ssm kernel imports but does not run "
                          f"on {device} ({reason}); using the pure-PyTorch scan")
    _auto_cache[device.type] = "mamba_ssm" if reason is None else "torch"
    return _auto_cache[device.type]


def kernel_fallback(device: torch.device | str) -> str | None:
    """Why kernel="auto" fell back to the pure-PyTorch scan on `device` although mamba_ssm is
    installed (for the run record), or None."""
    return _auto_fallback.get(torch.device(device).type)


def ssd_scan(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None = None,
             initial_state: Tensor | None = None, chunk_size: int = 64,
             kernel: str = "auto") -> tuple[Tensor, Tensor]:
    """The SSD scan through the chosen implementation: "torch" (`ssd_chunked`), "sequential"
    (`ssd_sequential`, the oracle), "mamba_ssm" (the Triton kernel; CUDA only) or "auto" (the
    kernel on CUDA when it imports and the dtype is one it supports, otherwise torch); inside
    `scan_override(scan)`, `scan` whatever the kernel."""
    # compiled code never runs under an override (the memory estimate runs eager), and
    # reading a ContextVar breaks torch.compile's graph at every scan
    override = None if torch.compiler.is_compiling() else _scan_override.get()
    if override is not None:
        return override(x, dt, A, B, C, D, initial_state, chunk_size)
    kernel = resolve_kernel(kernel, x.device, x.dtype)
    if kernel == "mamba_ssm":
        return _ssd_mamba_ssm(x, dt, A, B, C, D, initial_state, chunk_size)
    if kernel == "sequential":
        return ssd_sequential(x, dt, A, B, C, D, initial_state)
    return ssd_chunked(x, dt, A, B, C, D, initial_state, chunk_size)


# ---------------------------------------------------------------------------------------------
# Measuring memory without the kernel.

_scan_override: contextvars.ContextVar[Callable | None] = contextvars.ContextVar(
    "ssd_scan_override", default=None)


@contextlib.contextmanager
def scan_override(scan: Callable):
    """Within the block (in this thread or task), every `ssd_scan` call runs
    `scan(x, dt, A, B, C, D, initial_state, chunk_size)` whatever kernel it names; the previous
    setting comes back on exit. For measuring a model as another kernel will run it."""
    token = _scan_override.set(scan)
    try:
        yield
    finally:
        _scan_override.reset(token)


class _KernelFootprint(torch.autograd.Function):
    """Allocates what `mamba_chunk_scan_combined` allocates, computes nothing (the values are
    garbage): forward, the output, the final state and, float32, the per-chunk cumulative decays
    (B, H, chunks, L) and chunk states (B, chunks, H, P, N), with the (L x L) chunk products
    C·B per group as a temporary; saved for the backward pass, the inputs, the output, the
    decays and the chunk states (the kernel recomputes these from the inputs; keeping them
    bounds that recomputation). None of ssd_chunked's per-chunk (L x L) decay matrices: the
    kernel never stores them."""

    @staticmethod
    def forward(ctx, x, dt, A, B, C, D, initial_state, chunk_size):
        batch, length, heads, headdim = x.shape
        groups, state_dim = B.shape[2:]
        chunks = -(-length // chunk_size)
        decays = x.new_empty(batch, heads, chunks, chunk_size, dtype=torch.float32)
        states = x.new_empty(batch, chunks, heads, headdim, state_dim, dtype=torch.float32)
        products = x.new_empty(batch, chunks, groups, chunk_size, chunk_size, dtype=torch.float32)
        y = torch.empty_like(x)
        final = x.new_empty(batch, heads, headdim, state_dim)
        del products  # a temporary of the kernel's forward pass
        ctx.save_for_backward(x, dt, A, B, C, D, initial_state, decays, states, y)
        return y, final

    @staticmethod
    def backward(ctx, dy, dfinal):
        x, dt, A, B, C, D, initial_state, *_ = ctx.saved_tensors
        grads = [torch.empty_like(t) if t is not None and needed else None
                 for t, needed in zip((x, dt, A, B, C, D, initial_state), ctx.needs_input_grad)]
        return (*grads, None)


def kernel_footprint(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor,
                     D: Tensor | None = None, initial_state: Tensor | None = None,
                     chunk_size: int = 64) -> tuple[Tensor, Tensor]:
    """A stand-in for the mamba_ssm kernel (same arguments as `ssd_chunked`) with its memory and
    none of its arithmetic: `with scan_override(kernel_footprint):` measures a model's memory as
    the kernel runs it (see _KernelFootprint)."""
    _check_shapes(x, dt, A, B, C)
    return _KernelFootprint.apply(x, dt, A, B, C, D, initial_state, chunk_size)
