"""Mixed precision (`trainer.precision=bf16-mixed`, i.e. torch.autocast with bfloat16 on the CPU):
every model configuration trains end to end with finite losses, gradients and a finite Bayes gap;
its bf16 forward stays within a few bf16 roundings of its float32 forward; and the numerically
sensitive parts (scans, decays, running sums, rotary angles, LSTM cell state) are computed in
float32 whatever the autocast dtype.

Tolerances. bfloat16 keeps an 8-bit significand (7 stored bits + the implicit one), so one
round-to-nearest has relative error at most u = 2^-8 ≈ 3.9e-3. Under autocast every matmul and
convolution rounds its inputs and its output to bf16, so a forward pass through a few layers
chains some tens of such roundings, most of them independent: the norm-wise error of the
predictions is a small multiple of u (measured here at initialisation: 0.1u (LSTM, markov) to
2.6u (GD-SSM, markov: its output is a product of three bf16 projections)). TOL = 8u leaves room
for that and still catches a float32 computation done in bf16 over a sequence (measured before
the fixes: selective SSM 385u on markov T=256 and 10u on lgssm T=128, its decays near 1 rounded
to multiples of 2^-8, e.g. 0.998 to 0.996 and 0.999 to 1.0).
Rotary angles and scan internals are checked against float64 with float32 bounds instead (below).
"""
from __future__ import annotations

import json
import math

import pytest
import torch

from bench.cli.main import main
from bench.training.checks import compose_checked
from bench.config import choices
from bench.training.evaluate import masked_loss
from bench.training.train import build
from models import IOSpec, model_families
from models.griffin import rotary, rotary_angles
from models.ssd import ssd_chunked, ssd_sequential
from models.transformer import causal_linear_attention_recurrent
from conftest import CPU_SIZED, model_task_cases
from tasks.base import make_generator

U = 2.0 ** -8  # unit roundoff of bfloat16
TOL = 8 * U
BF16 = dict(device_type="cpu", dtype=torch.bfloat16)

# The constructed GD-SSM reads raw regression prompts: linreg_tokens only; the constructed
# MambaZero next tokens: markov only. The others at their tasks' default lengths (markov 256,
# lgssm 128), long enough for bf16 decays to show.
TASKS = {"tokens": ["task=markov"], "vectors": ["task=lgssm"]}
ONLY = {"gd_ssm_constructed": {"vectors": ["task=linreg_tokens"]},
        "mambazero_constructed": {"tokens": TASKS["tokens"]}}


@pytest.mark.parametrize("model,task_args", list(model_task_cases(TASKS, ONLY)))
def test_bf16_autocast_forward_backward_is_finite_and_close_to_float32(model, task_args):
    torch.manual_seed(0)
    task, net = build(compose_checked([*task_args, f"model={model}"]))
    batch = task.sample(4, make_generator(0))
    with torch.no_grad():
        reference = net.predict(batch.inputs)  # float32 throughout
    with torch.autocast(**BF16):
        loss = masked_loss(task, net(batch.inputs), batch)
    loss.backward()
    assert torch.isfinite(loss)
    grads = {name: p.grad for name, p in net.named_parameters() if p.grad is not None}
    assert grads and all(torch.isfinite(g).all() for g in grads.values())
    assert all(p.dtype == torch.float32 for p in net.parameters())  # master weights untouched
    with torch.no_grad(), torch.autocast(**BF16):
        prediction = net.predict(batch.inputs).float()
    mask = batch.loss_mask
    assert torch.isfinite(prediction[mask]).all()
    error = float((prediction - reference)[mask].norm() / reference[mask].norm())
    assert error < TOL, f"bf16 vs float32 norm-wise error {error:.2e} = {error / U:.1f}u"


# --- the float32 parts: with float32 inputs, autocast must not change them at all ----------------
def _ssd_inputs():
    g = torch.Generator().manual_seed(0)
    return dict(x=torch.randn(2, 40, 4, 3, generator=g), dt=torch.rand(2, 40, 4, generator=g),
                A=-torch.rand(4, generator=g), B=torch.randn(2, 40, 2, 5, generator=g),
                C=torch.randn(2, 40, 2, 5, generator=g), D=torch.randn(4, generator=g))


def _selective(transition):
    from models.selective_ssm import SelectiveSSM, SelectiveSSMConfig
    core = SelectiveSSM(SelectiveSSMConfig(d_model=8, transition=transition),
                        IOSpec("vectors", 3, 3, 256))
    return lambda x: (*core.layers[0].coefficients(x), core(x))


def _lstm():
    family = model_families()["lstm"]
    core = family(family.Config(d_model=8), IOSpec("vectors", 3, 3, 64))
    return lambda x: (core(x), core.forward_sequential(x)[0])


KERNELS = {
    "ssd_sequential": lambda: lambda _: ssd_sequential(**_ssd_inputs()),
    "ssd_chunked": lambda: lambda _: ssd_chunked(**_ssd_inputs(), chunk_size=16),
    "linear_attention_recurrent": lambda: lambda x: causal_linear_attention_recurrent(
        x[:, None, :, :4], x[:, None, :, 2:6], x[:, None, :, 4:]),
    "selective_ssm_linear": lambda: _selective("linear"),
    "selective_ssm_exp": lambda: _selective("exp"),
    "lstm": _lstm,
    "griffin_rotary_angles": lambda: lambda x: (rotary_angles(torch.arange(300), 8),),
}


@pytest.mark.parametrize("name", KERNELS)
def test_float32_internals_are_unchanged_by_autocast(name):
    """Recurrences, decays and running sums run with autocast off in float32: under bf16
    autocast they give bit for bit what they give without it (before the fixes: the SSD
    sequential state and the linear attention state were bf16 einsums, the selective decays
    bf16 linear maps, the LSTM a bf16 oneDNN kernel)."""
    torch.manual_seed(1)
    fn = KERNELS[name]()
    x = torch.randn(2, 40, 8)
    plain = fn(x)
    with torch.autocast(**BF16):
        mixed = fn(x)
    for a, b in zip(plain, mixed):
        assert b.dtype == a.dtype and torch.equal(a, b), name


def test_mamba_norms_take_float32_statistics_of_bf16_inputs():
    """The mixer hands its norms bf16 y and z under autocast; the gate product and the mean
    square are formed in float32 from them (as if the bf16 values had been given in float32)."""
    from models.mamba import GatedRMSNorm, RMSNorm
    torch.manual_seed(2)
    gated, plain = GatedRMSNorm(32, 2, "silu"), RMSNorm(32, eps=1e-5)
    y, z = torch.randn(2, 5, 32).bfloat16(), torch.randn(2, 5, 32).bfloat16()
    with torch.autocast(**BF16):
        out_gated, out_plain = gated(y, z), plain(y)
    assert out_gated.dtype == torch.float32 and out_plain.dtype == torch.bfloat16
    assert torch.equal(out_gated, gated(y.float(), z.float()))
    assert torch.equal(out_plain, plain(y.float()).bfloat16())


def test_griffin_rotary_angles_and_embedding_under_bf16_at_long_positions():
    """Griffin's rotary embedding of bf16 queries/keys (head_dim 16) at positions up to 511,
    against float64. Before the fix the angles were computed in bf16, which rounds an angle in
    [128, 256) to an integer and one in [256, 512) to an even integer: measured angle errors
    0.29 rad on [128, 256) and 1.0 rad on [256, 512), embeddings off by 0.27 and 0.96 of their
    norm. Now the angles are float32: two roundings (frequency, product), |error| <= 2·2^-24
    times the angle; the rotated pair is rounded once to bf16, so each output is off by at most
    u times its pair's norm (plus float32 noise)."""
    half, positions = 8, torch.arange(512)
    exact = rotary_angles(positions, half, torch.float64)
    with torch.autocast(**BF16):
        angles = rotary_angles(positions, half)
    assert angles.dtype == torch.float32
    late = positions >= 128
    bound = 2 * 2.0 ** -24 * exact + 1e-12
    assert ((angles.double() - exact).abs() <= bound)[late].all()

    torch.manual_seed(0)
    with torch.autocast(**BF16):
        q = torch.nn.functional.linear(torch.randn(2, 512, 2 * half), torch.eye(2 * half))
        rotated = rotary(q, positions)
    assert q.dtype == rotated.dtype == torch.bfloat16
    q64 = q.double()
    cos, sin = exact.cos(), exact.sin()
    x1, x2 = q64[..., :half], q64[..., half:]
    expected = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    pair_norm = torch.cat([x1.hypot(x2)] * 2, dim=-1)
    relative = (rotated.double() - expected).abs() / pair_norm.clamp_min(1e-30)
    assert relative[:, late].max() <= U * (1 + 1e-3)


# --- end to end: python -m bench run trainer.precision=bf16-mixed ----------------------------
TINY = ["task.seq_len=24", "trainer.max_steps=4", "trainer.warmup_steps=2",
        "trainer.eval_sequences=32", "trainer.bootstrap=200", "trainer.progress=false",
        "trainer.precision=bf16-mixed", "trainer.accelerator=cpu"]
# gd_steps=[1]: the tuned multi-step GD baselines of linreg cost seconds and test nothing here.
E2E_TASK = {"gd_ssm_constructed": ["task=linreg_tokens", "task.gd_steps=[1]"]}


@pytest.mark.parametrize("model", choices("model"))
def test_bf16_mixed_run_end_to_end(model, tmp_path, capsys):
    task_args = E2E_TASK.get(model, ["task=markov"])
    task = task_args[0][5:]
    assert main(["run", *task_args, f"model={model}", *CPU_SIZED.get(model, []),
                 f"out_dir={tmp_path}", *TINY]) == 0
    capsys.readouterr()
    record = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert record["status"] == "ok"
    assert record["trainer"]["config"]["precision"] == "bf16-mixed"
    assert record["train"]["precision"] == "bf16-mixed" and record["train"]["steps"] == 4
    # evaluated by Trainer.test under the same autocast; token log-probs are float32 (the
    # softmax runs in float32), a vector prediction may be bf16
    assert record["eval"]["precision"] == "bf16-mixed"
    assert record["eval"]["dtype"] == ("float32" if task == "markov" else record["eval"]["dtype"])
    assert record["eval"]["dtype"] in ("float32", "bfloat16")
    gap = record["metrics"]["bayes_gap"]
    assert math.isfinite(gap) and all(math.isfinite(v) for v in record["metrics"]["bayes_gap_ci"])
    assert math.isfinite(record["metrics"]["loss"]["model"])
    print(f"{model} on {task}, bf16-mixed: Bayes gap {gap:.4f}")  # shown by pytest -rP
