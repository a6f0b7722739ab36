"""Suite-wide settings. One intra-op thread: the tensors here are small, and with more threads
than idle cores torch's thread pool spins and is several times slower, not faster. The commands
the tests start as processes share the cores with the other test worker (pytest -n 2): their
threads sleep at once rather than spin briefly (bench/cli/openmp.py), as on any shared machine."""
import os
import signal

import pytest
import torch

torch.set_num_threads(1)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Started under nohup, the tests inherit an ignored SIGHUP, and a run rightly leaves an ignored
# signal ignored (bench/training/signals.py SignalGuard): the tests of what a run does on SIGHUP need the
# default disposition, here and in the runs they start.
if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


# Model presets sized for a GPU (paper 000's language models, 14.5M to 200M parameters): the CPU
# test grids run them narrower and shallower, every switch as configured (the 14.5M Mamba's bf16
# run alone took 40 s here at full width). Their full size is built without storage in
# tests/test_lm_presets.py.
CPU_SIZED = {"mamba_lm14m": ["model.d_model=64", "model.n_layers=2"],
             "transformer_lm14m": ["model.d_model=64"],
             "mamba_lm110m": ["model.d_model=64", "model.n_layers=2"],
             "mamba_lm200m": ["model.d_model=64", "model.n_layers=2"]}


def ties_embeddings(model: str) -> bool:
    """Whether conf/model/<model>.yaml shares the token embedding with the head: such a preset
    only fits token tasks."""
    import yaml
    from bench.config import CONF_DIR
    values = yaml.safe_load((CONF_DIR / "model" / f"{model}.yaml").read_text()) or {}
    return bool(values.get("tie_embeddings", False))


def model_task_cases(tasks: dict[str, list[str]], only: dict[str, dict[str, list[str]]]):
    """(model, overrides) for every model config and every task kind of `tasks`; a model named
    in `only` gets its own {kind: task overrides} instead (one that fits only some kinds). A
    tied-embedding preset gets the token kinds only; a CPU_SIZED preset its size overrides."""
    from bench.config import choices
    for model in choices("model"):
        cases = only.get(model, tasks)
        if ties_embeddings(model):
            cases = {kind: args for kind, args in cases.items() if kind == "tokens"}
        for kind, task_args in cases.items():
            yield pytest.param(model, [*task_args, *CPU_SIZED.get(model, [])],
                               id=f"{model}-{kind}")


def fits_a_fixed_batch(model, kind: str, length: int, steps: int = 30) -> None:
    """Forward, backward and AdamW steps through a whole Backbone (5 symbols / 5-d vectors) on a
    fixed batch: every parameter gets a finite gradient, and `steps` steps lower the loss by 20%.
    The vector target (a running sum) needs memory, so a model that ignores its past cannot fit
    it."""
    generator = torch.Generator().manual_seed(3)
    if kind == "tokens":
        inputs = torch.randint(0, 5, (4, length), generator=generator)
        loss_fn = lambda out: torch.nn.functional.cross_entropy(out.transpose(1, 2), inputs)
    else:
        inputs = torch.randn(4, length, 5, generator=generator)
        targets = inputs.cumsum(1) / 4
        loss_fn = lambda out: (out - targets).pow(2).mean()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = loss_fn(model(inputs))
        loss.backward()
        for name, param in model.named_parameters():
            assert param.grad is not None and torch.isfinite(param.grad).all(), name
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]


def redraw_in_float64(module: torch.nn.Module, seed: int, scale: float = 0.5) -> torch.nn.Module:
    """The module in float64 with every parameter redrawn from N(0, scale²): identities between
    a fast form and its naive twin must hold for any parameters, not just the initialisation."""
    module = module.double()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape, generator=generator, dtype=torch.float64) * scale)
    return module


def assert_causal(core: torch.nn.Module, x: torch.Tensor, t: int) -> None:
    """Outputs up to position t are bit-identical when every input after t changes, and the
    outputs after t do react (so the check is not vacuous)."""
    changed = x.clone()
    changed[:, t + 1:] = torch.randn_like(changed[:, t + 1:])
    before, after = core(x), core(changed)
    assert torch.equal(before[:, :t + 1], after[:, :t + 1])
    assert (before[:, t + 1:] - after[:, t + 1:]).abs().max() > 1e-6


def check_score_last(every, final, last: int, sequences: int = 200) -> None:
    """`final` is `every` with score=last (paper 002: only the final query is trained on and
    scored): the same held-out sequences with exactly one scored position per sequence, at
    `last`; the training loss is the squared error there alone; the held-out loss of every
    reference is the `all` run's per-position curve at that position."""
    from bench.training.evaluate import score
    from bench.training.evaluate import masked_loss
    a, b = every.held_out(sequences), final.held_out(sequences)
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    expected = torch.zeros_like(b.loss_mask)
    expected[:, last] = True
    assert torch.equal(b.loss_mask, expected) and a.loss_mask[:, last].all()
    assert int(a.loss_mask[0].sum()) > 1  # the `all` mask scores more than the last query
    # the training batch, as the Lightning path draws it (step 0, rank 0)
    train = final.training_batch(0)
    assert torch.equal(train.loss_mask, expected[:1].expand_as(train.loss_mask))
    output = torch.randn(train.targets.shape, generator=torch.Generator().manual_seed(0))
    direct = (output[:, last] - train.targets[:, last]).pow(2).mean()
    assert float(masked_loss(final, output, train)) == pytest.approx(float(direct), rel=1e-6)
    predictions = {name: ref.predict(a) for name, ref in every.references().items()}
    curves = score(every, a, predictions, resamples=10)["per_position"]
    scored = score(final, b, predictions, resamples=10)
    for name in predictions:
        point = curves[f"loss.{name}"][last]
        assert scored["metrics"]["loss"][name] == pytest.approx(point, rel=1e-12, abs=1e-15)
        curve = scored["per_position"][f"loss.{name}"]
        assert curve[last] == pytest.approx(point, rel=1e-12, abs=1e-15)
        assert all(v is None for i, v in enumerate(curve) if i != last)


def nan_loss_from(step: int, monkeypatch) -> None:
    """Make the training loss NaN from training step `step` (0-based) on: the model's output is
    multiplied by NaN in those steps (a forward hook), as a run that diverges there would see it.
    Keyed by the step, not by calls of the loss, which the pre-run memory check makes too."""
    import math

    import bench.training.module
    real = bench.training.module.ICLModule.training_step

    def training_step(self, batch, batch_idx):
        if int(self.global_step) < step:
            return real(self, batch, batch_idx)
        hook = self.model.register_forward_hook(lambda module, args, output: output * math.nan)
        try:
            return real(self, batch, batch_idx)
        finally:
            hook.remove()

    monkeypatch.setattr(bench.training.module.ICLModule, "training_step", training_step)


def own_fields(config_class) -> set[str]:
    """A model config's fields but the backbone options every family shares (models/configs.py
    BackboneOptions), which its YAML file does not list."""
    import dataclasses

    from models.configs import BackboneOptions
    shared = {f.name for f in dataclasses.fields(BackboneOptions)}
    return {f.name for f in dataclasses.fields(config_class)} - shared
