"""trainer.compile=true: the run trains through torch.compile (and evaluates eager), predicts
what the eager model predicts, keeps the eager parameter names, and the record says so. The
record also names the SSD scan implementation a Mamba model ran."""
import json

import pytest
import torch

from bench.cli.main import main
from bench.training.checks import compose_checked
from bench.training.evaluate import masked_loss
from bench.training.train import build, scan_kernels

TINY = ["task.seq_len=16", "trainer.max_steps=3", "trainer.warmup_steps=1",
        "trainer.eval_sequences=16", "trainer.eval_batch_size=16", "trainer.batch_size=16",
        "trainer.bootstrap=100", "trainer.progress=false", "trainer.logger=none"]


def test_a_compiled_run_predicts_what_the_eager_model_predicts(tmp_path):
    # lstm: the model of the zoo whose graph compiles fastest on the CPU (~15 s)
    overrides = ["model=lstm", *TINY]
    compiled_task, compiled = build(compose_checked([*overrides, "trainer.compile=true"]))
    _, eager = build(compose_checked(overrides))
    assert list(compiled.state_dict()) == list(eager.state_dict())  # checkpoints interchange
    inputs = compiled_task.held_out(16).inputs
    with torch.no_grad():
        torch.testing.assert_close(compiled.predict(inputs), eager.predict(inputs),
                                   rtol=1e-5, atol=1e-5)
    assert main(["run", *overrides, "trainer.compile=true", f"out_dir={tmp_path}"]) == 0
    assert not torch.are_deterministic_algorithms_enabled()  # put back when the run ended
    record = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert record["status"] == "ok"
    # one pass of evaluation runs eager: a recompile for its batches would cost more than it saves
    assert record["train"]["compile"] is True and record["eval"]["compile"] is False
    assert record["train"]["deterministic"] is True  # make_trainer's, on the CPU
    assert record["train"]["kernel"] is None  # no SSD scan in an LSTM


def test_a_compiled_cpu_run_trains_with_deterministic_algorithms_and_an_eager_one_without():
    """Inductor's CPU code adds an embedding's gradient with atomic adds across threads: two
    compiled runs of one seed ended ~1e-9 apart (docs/profile-cpu-step.md). Deterministic
    algorithms make it fall back to aten's index_put. The flag is process-wide: an eager
    Trainer sets it off again, and a run puts back what it found (the test above)."""
    from bench.training.train import deterministic_flag_restored, make_trainer
    with deterministic_flag_restored():  # whatever fails here, later tests find the flag as it was
        make_trainer(compose_checked([*TINY, "trainer.compile=true", "trainer.accelerator=cpu"]),
                     "compiled")
        assert torch.are_deterministic_algorithms_enabled()
        make_trainer(compose_checked(TINY), "eager")
        assert not torch.are_deterministic_algorithms_enabled()


@pytest.mark.parametrize("kernel, used", [("auto", "torch"), ("torch", "torch"),
                                          ("sequential", "sequential")])
def test_the_record_names_the_scan_that_ran(kernel, used):
    _, model = build(compose_checked([f"model.kernel={kernel}", *TINY]))
    assert scan_kernels(model, "cpu") == used


def test_compile_without_a_cpp_compiler_is_a_config_error(monkeypatch, capsys):
    import shutil
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert main(["run", "trainer.compile=true", "trainer.accelerator=cpu", *TINY]) == 2
    assert "needs a C++ compiler" in capsys.readouterr().err


def test_the_mamba_forward_compiles_as_one_graph():
    """No graph break in the default model's forward (fullgraph=True refuses one): a break at
    every SSD scan (the scan_override ContextVar read) split it into 8 graphs and made the
    compiled CPU step no faster than eager (docs/profile-cpu-step.md). The eager backend traces
    without generating code, so this costs seconds."""
    task, model = build(compose_checked(TINY))
    inputs = task.training_batch(0).inputs
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(inputs), model(inputs))


@pytest.mark.parametrize("overrides", [["task=linreg", "model=gd_ssm"], ["model=griffin"],
                                       ["task=lgssm", "model=selective_ssm"],
                                       ["task=lgssm", "model=nonselective_ssm"],
                                       ["task=lgssm", "model=lru"]])
def test_the_recurrent_models_compile_forward_and_backward_as_one_graph(overrides):
    """Their parallel scans are autograd Functions with their own backward pass
    (models/scan.py), which Dynamo traces whole: no graph break, and the same predictions."""
    task, model = build(compose_checked([*overrides, *TINY]))
    inputs = task.training_batch(0).inputs
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    predictions = compiled(inputs)
    predictions.float().sum().backward()
    torch.testing.assert_close(predictions, model(inputs))


def test_a_compiled_mamba_trains_along_the_eager_loss_curve():
    """The default Mamba compiled (trainer.compile=true: inductor fuses the forward and the
    backward and sums in its own order) and eager, from one initialisation on the same batches,
    10 AdamW steps each: every step's loss agrees within 1e-5 relative and the parameters after
    them within 1e-5 of the largest (measured: 9e-8 and 8e-8), where a changed computation moves
    both by orders of magnitude more."""
    # compiled code is cached per code object, across models: after other shapes in this
    # process Dynamo would retrace with dynamic shapes (which Inductor fails on for this graph)
    torch.compiler.reset()
    overrides = ["task.seq_len=32", "trainer.batch_size=8"]
    task, eager = build(compose_checked(overrides))
    _, compiled = build(compose_checked([*overrides, "trainer.compile=true"]))
    compiled.load_state_dict(eager.state_dict())
    curves = []
    for model in (eager, compiled):
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        curve = []
        for step in range(10):
            batch = task.training_batch(step)
            loss = masked_loss(task, model(batch.inputs), batch)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            curve.append(loss.item())
        curves.append(torch.tensor(curve, dtype=torch.float64))
    torch.testing.assert_close(curves[1], curves[0], rtol=1e-5, atol=0)
    scale = max(p.detach().abs().max().item() for p in eager.parameters())
    for (name, a), b in zip(eager.state_dict().items(), compiled.state_dict().values()):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5 * scale, msg=name)
