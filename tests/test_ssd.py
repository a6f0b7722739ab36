"""The SSD scan: the chunked form and the dispatcher against the step-by-step recurrence, and the
optional mamba_ssm kernel against the pure-PyTorch form (CUDA only).

Tolerances: the identities are checked in float64 on O(1) values; a scan of <= 100 steps does
<= ~10^4 floating-point operations per output, so round-off stays below ~1e-12 and 1e-10 leaves
two orders of margin while still catching any wrong term (which would be O(1e-2) or larger)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from models.ssd import mamba_ssm_available, ssd_chunked, ssd_scan, ssd_sequential

TOL = 1e-10


def random_scan_inputs(batch=2, length=33, heads=4, headdim=3, groups=2, states=5,
                       dtype=torch.float64, device="cpu", seed=0, decay_scale=1.0):
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=dtype).to(device)

    def rand(*shape):
        return torch.rand(*shape, generator=g, dtype=dtype).to(device)

    return dict(x=randn(batch, length, heads, headdim),
                dt=rand(batch, length, heads) + 0.05,
                A=-(rand(heads) + 0.1) * decay_scale,
                B=randn(batch, length, groups, states),
                C=randn(batch, length, groups, states),
                D=randn(heads),
                initial_state=randn(batch, heads, headdim, states))


@pytest.mark.parametrize("chunk_size", [1, 4, 16, 64])
@pytest.mark.parametrize("length", [1, 7, 33, 100])
def test_chunked_equals_sequential(chunk_size, length):
    inputs = random_scan_inputs(length=length, seed=chunk_size * 1000 + length)
    y_seq, state_seq = ssd_sequential(**inputs)
    y_chunk, state_chunk = ssd_chunked(**inputs, chunk_size=chunk_size)
    assert y_chunk.shape == y_seq.shape == inputs["x"].shape
    assert state_chunk.shape == state_seq.shape == inputs["initial_state"].shape
    torch.testing.assert_close(y_chunk, y_seq, rtol=0, atol=TOL)
    torch.testing.assert_close(state_chunk, state_seq, rtol=0, atol=TOL)


def test_chunked_gradients_equal_sequential():
    inputs = {k: v.requires_grad_() for k, v in random_scan_inputs(length=21).items()}
    weights = torch.randn(2, 21, 4, 3, generator=torch.Generator().manual_seed(1),
                          dtype=torch.float64)
    grads = []
    for scan in (ssd_sequential, lambda **kw: ssd_chunked(**kw, chunk_size=8)):
        y, state = scan(**inputs)
        loss = (y * weights).sum() + state.pow(2).sum()
        grads.append(torch.autograd.grad(loss, list(inputs.values())))
    for name, g_seq, g_chunk in zip(inputs, *grads):
        torch.testing.assert_close(g_chunk, g_seq, rtol=0, atol=TOL, msg=name)


def test_without_initial_state_or_skip_and_one_group():
    inputs = random_scan_inputs(length=19, groups=1)
    del inputs["initial_state"], inputs["D"]
    y_seq, state_seq = ssd_sequential(**inputs)
    y_chunk, state_chunk = ssd_chunked(**inputs, chunk_size=8)
    torch.testing.assert_close(y_chunk, y_seq, rtol=0, atol=TOL)
    torch.testing.assert_close(state_chunk, state_seq, rtol=0, atol=TOL)


def test_strong_decay_stays_finite_and_exact():
    # Per-step log-decays down to about -60: within a chunk of 64 the cumulative log-decay
    # reaches ~-4000, where a difference-of-cumsums segment sum or exp(+big) would break.
    inputs = random_scan_inputs(length=100, decay_scale=30.0, seed=3)
    y_seq, state_seq = ssd_sequential(**inputs)
    y_chunk, state_chunk = ssd_chunked(**inputs, chunk_size=64)
    assert torch.isfinite(y_chunk).all() and torch.isfinite(state_chunk).all()
    torch.testing.assert_close(y_chunk, y_seq, rtol=0, atol=TOL)
    torch.testing.assert_close(state_chunk, state_seq, rtol=0, atol=TOL)


def test_zero_decay_rate_is_a_plain_cumulative_sum():
    """A = 0 gives a_t = 1: y_t = sum_{s<=t} (C_t . B_s) dt_s x_s + D x_t, computed here as a
    masked matrix product, independent of both scans."""
    inputs = random_scan_inputs(length=12, groups=1, seed=5)
    inputs["A"] = torch.zeros_like(inputs["A"])
    del inputs["initial_state"]
    x, dt, B, C, D = (inputs[k] for k in ("x", "dt", "B", "C", "D"))
    scores = torch.einsum("btn,bsn->bts", C[:, :, 0], B[:, :, 0]).tril()
    expected = torch.einsum("bts,bsh,bshp->bthp", scores, dt, x) + D[:, None] * x
    for y, _ in (ssd_sequential(**inputs), ssd_chunked(**inputs, chunk_size=5)):
        torch.testing.assert_close(y, expected, rtol=0, atol=TOL)


def test_dispatcher():
    inputs = random_scan_inputs(length=10, dtype=torch.float32)
    y_torch, _ = ssd_chunked(**inputs, chunk_size=4)
    y_auto, _ = ssd_scan(**inputs, chunk_size=4, kernel="auto")  # CPU tensors: the torch path
    assert torch.equal(y_auto, y_torch)
    y_seq, _ = ssd_scan(**inputs, kernel="sequential")
    torch.testing.assert_close(y_seq, y_torch, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="unknown SSD kernel"):
        ssd_scan(**inputs, kernel="cuda")
    with pytest.raises(RuntimeError, match="mamba_ssm"):
        ssd_scan(**inputs, kernel="mamba_ssm")  # CPU tensors, or the package is absent


def test_models_never_import_mamba_ssm_on_cpu():
    code = ("import sys, torch\n"
            "from models import build_model, IOSpec\n"
            "from models.mamba import MambaConfig\n"
            "m = build_model('mamba', MambaConfig(), IOSpec('tokens', 2, 2, 16))\n"
            "m(torch.zeros(1, 16, dtype=torch.long)).sum().backward()\n"
            "assert 'mamba_ssm' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True,
                   cwd=Path(__file__).resolve().parents[1])


@pytest.mark.skipif(not torch.cuda.is_available() or not mamba_ssm_available(),
                    reason="needs CUDA and the mamba_ssm Triton kernels")
@pytest.mark.parametrize("length", [64, 100])
def test_mamba_ssm_kernel_matches_torch(length):
    # float32 on the GPU (TF32 matmuls inside the kernel): errors ~1e-3 relative at O(1) values.
    inputs = random_scan_inputs(length=length, heads=4, headdim=16, groups=2, states=16,
                                dtype=torch.float32, device="cuda")
    y_ref, state_ref = ssd_scan(**inputs, chunk_size=32, kernel="torch")
    y_fast, state_fast = ssd_scan(**inputs, chunk_size=32, kernel="mamba_ssm")
    scale = y_ref.abs().max().item()
    torch.testing.assert_close(y_fast, y_ref, rtol=0, atol=5e-3 * scale)
    torch.testing.assert_close(state_fast, state_ref, rtol=0,
                               atol=5e-3 * state_ref.abs().max().item())
