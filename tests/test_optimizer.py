"""The optimiser's parameter groups (bench/training/module.py parameter_groups): weight decay on matrices
only, the recurrent parameters the models tag at lr · trainer.recurrent_lr_ratio (paper 002
A.5), AdamW's β2 from trainer.adam_beta2 (paper 004 B.1)."""
from __future__ import annotations

import pytest

from bench.training.checks import compose_checked
from bench.config import ConfigError
from bench.training.module import ICLModule, parameter_groups
from bench.training.train import build

RECURRENT = {"gd_ssm": {"core.blocks.0.layer.A"},
             "mamba": {"core.layers.0.mixer.A_log", "core.layers.0.mixer.dt_bias"},
             "lru": {"core.blocks.0.lru.nu_log", "core.blocks.0.lru.theta_log"}}


@pytest.mark.parametrize("model,task", [("gd_ssm", "linreg"), ("mamba", "markov"),
                                        ("lru", "linreg")])
def test_groups_split_every_parameter_once(model, task):
    config = compose_checked([f"task={task}", f"model={model}", "model.n_layers=1",
                              "trainer.lr=0.002", "trainer.recurrent_lr_ratio=0.5",
                              "trainer.weight_decay=0.05"])
    _, net = build(config)
    matrices, vectors, recurrent = parameter_groups(net, config.trainer)
    names = {id(p): name for name, p in net.named_parameters()}
    grouped = [id(p) for g in (matrices, vectors, recurrent) for p in g["params"]]
    assert sorted(grouped) == sorted(names) and len(set(grouped)) == len(grouped)
    assert {names[id(p)] for p in recurrent["params"]} >= RECURRENT[model]
    assert recurrent["lr"] == pytest.approx(0.001) and recurrent["weight_decay"] == 0
    assert matrices["weight_decay"] == 0.05 and vectors["weight_decay"] == 0
    assert all(p.dim() >= 2 for p in matrices["params"])
    assert all(p.dim() < 2 for p in vectors["params"])


def test_the_optimizer_uses_beta2_and_the_group_rates():
    config = compose_checked(["task=linreg", "model=gd_ssm", "trainer.lr=0.002",
                              "trainer.recurrent_lr_ratio=0.5", "trainer.adam_beta2=0.999"])
    task, net = build(config)
    optimizer = ICLModule(net, task, config.trainer).configure_optimizers()["optimizer"]
    assert [g["betas"] for g in optimizer.param_groups] == [(0.9, 0.999)] * 3
    # the schedule scales every group alike: its base rates are the groups' own
    assert [g["initial_lr"] for g in optimizer.param_groups] == pytest.approx([0.002, 0.002, 0.001])


@pytest.mark.parametrize("override", ["trainer.adam_beta2=1", "trainer.recurrent_lr_ratio=0",
                                      "trainer.compile_mode=reduce-overhead",
                                      "trainer.compile=true trainer.compile_mode=fast"])
def test_bad_optimizer_settings_are_config_errors(override):
    with pytest.raises(ConfigError):
        compose_checked(override.split())


def test_fused_adamw_is_asked_for_and_trains_as_the_loop_does():
    """trainer.fused_adamw=true: AdamW's groups say fused (the default leaves the flag alone, so
    that no record's optimizer changes), and 20 steps of the default model from one
    initialisation on the same batches end within 1e-4 of the loop's parameters (relative to
    the largest; measured: 4.6e-6)."""
    import torch

    from bench.training.evaluate import masked_loss
    models = []
    for fused in (False, True):
        config = compose_checked(["task.seq_len=32", "trainer.batch_size=8",
                                  f"trainer.fused_adamw={str(fused).lower()}"])
        task, net = build(config)
        optimizer = ICLModule(net, task, config.trainer).configure_optimizers()["optimizer"]
        assert all(bool(g["fused"]) is fused for g in optimizer.param_groups)
        for step in range(20):
            batch = task.training_batch(step)
            masked_loss(task, net(batch.inputs), batch).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        models.append(net)
    scale = max(p.detach().abs().max().item() for p in models[0].parameters())
    for a, b in zip(*(m.parameters() for m in models)):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-4 * scale)
