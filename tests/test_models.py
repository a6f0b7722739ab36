"""Every model configuration × a token task and a vector task: one optimiser step works,
predictions are causal, and the state size is reported."""
import pytest
import torch

from bench.training.checks import compose_checked
from bench.training.evaluate import masked_loss
from bench.training.train import build
from conftest import model_task_cases
from tasks.base import make_generator

TASKS = {"tokens": ["task=markov", "task.seq_len=24"],
         "vectors": ["task=lgssm", "task.seq_len=24"]}
# The constructed GD-SSM maps raw regression prompts to predictions; it has no token form. The
# constructed MambaZero predicts next tokens; it has no vector form.
ONLY = {"gd_ssm_constructed": {"vectors": ["task=linreg_tokens", "task.seq_len=12"]},
        "mambazero_constructed": {"tokens": TASKS["tokens"]}}


@pytest.mark.parametrize("model,task_args", list(model_task_cases(TASKS, ONLY)))
def test_step_causality_and_state(model, task_args):
    torch.manual_seed(0)
    task, net = build(compose_checked([*task_args, f"model={model}"]))
    batch = task.sample(3, make_generator(0))
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
    before = [p.detach().clone() for p in net.parameters()]
    loss = masked_loss(task, net(batch.inputs), batch)
    loss.backward()
    assert torch.isfinite(loss)
    optimizer.step()
    assert any(not torch.equal(a, p) for a, p in zip(before, net.parameters()))

    net.eval()
    with torch.no_grad():
        out = net.predict(batch.inputs)
        cut = task.seq_len // 2
        changed = batch.inputs.clone()
        if task.kind == "tokens":
            changed[:, cut + 1:] = (changed[:, cut + 1:] + 1) % task.input_dim
        else:
            changed[:, cut + 1:] += torch.randn_like(changed[:, cut + 1:])
        out_changed = net.predict(changed)
    assert torch.allclose(out[:, :cut + 1], out_changed[:, :cut + 1], atol=1e-5)
    assert not torch.allclose(out[:, cut + 1:], out_changed[:, cut + 1:])
    state = net.state_size(task.seq_len)
    assert isinstance(state, int) and state > 0
