"""A training step never makes the host wait for the device, outside logging steps: no value is
read back (item, bool, int, float, tolist), no op has a data-dependent output size (nonzero,
boolean-mask indexing), no copy to the device blocks (every tensor of a Batch is copied with
non_blocking=True; the progress bar's loss is a float, not a logged device tensor). Counted on
the CPU by bench.perf.speed.step_profile, the way a GPU run would wait, for one whole step (fetch,
copy, step, callbacks, progress bar, logger) of every task family and of every model family, as
Lightning runs it."""
import pytest

from bench.training.checks import compose_checked
from bench.config import ConfigError
from bench.perf.speed import step_profile
from models import model_families
from tasks import task_families

TINY = ["trainer.batch_size=4", "trainer.eval_sequences=8", "trainer.bootstrap=10"]
# every task family (the registry's), at a small size, through the conf file named after it;
# text through the corpus that ships with Python. linreg_tokens: linreg's other prompt sampler.
CONF_OF_FAMILY = {"text": "pydoc"}
EXTRA = {"text": ["task.tokenizer=byte"]}
TASKS = {CONF_OF_FAMILY.get(family, family): ["task.seq_len=16", *EXTRA.get(family, [])]
         for family in task_families()}
TASKS["linreg_tokens"] = ["task.seq_len=12"]
# every model family, and the two presets that switch a family to another code path
MODELS = [*model_families(), "linear_transformer", "nonselective_ssm"]


@pytest.mark.parametrize("task", sorted(TASKS))
def test_no_host_sync_in_a_training_step_of_any_task(task):
    try:
        config = compose_checked([f"task={task}", *TASKS[task], *TINY])
    except ConfigError:  # a family that refuses the short sequence keeps its default length
        config = compose_checked([f"task={task}", *(o for o in TASKS[task]
                                                   if not o.startswith("task.seq_len=")), *TINY])
    profile = step_profile(config)
    assert profile["host_syncs"] == 0, profile["sync_ops"]
    assert profile["aten_calls"] > 0
    assert profile["progress_bar"], "the step profiled runs with the progress bar"


@pytest.mark.parametrize("model", MODELS)
def test_no_host_sync_in_a_training_step_of_any_model(model):
    task = ["task=linreg", "task.seq_len=12"] if model == "gd_ssm" else ["task.seq_len=32"]
    profile = step_profile(compose_checked([f"model={model}", *task, *TINY]))
    assert profile["host_syncs"] == 0, profile["sync_ops"]


def test_the_counter_sees_a_host_sync(monkeypatch):
    """The check can fail: a loss that reads a value back is counted."""
    import bench.training.module

    real = bench.training.module.masked_loss

    def reading(task, output, batch):
        loss = real(task, output, batch)
        if float(loss.detach()) > -1:  # a host sync on every step
            return loss
        return loss

    monkeypatch.setattr(bench.training.module, "masked_loss", reading)
    profile = step_profile(compose_checked(["task.seq_len=32", *TINY]))
    assert profile["sync_ops"] == {"_local_scalar_dense": 1}  # float() reads the value


@pytest.mark.parametrize("task", ["markov", "switching_markov", "hmm", "lgssm", "lgssm_colored"])
def test_a_training_batch_is_a_few_hundred_ops_not_a_loop_over_time(task):
    """The samplers are vectorised over time: a batch of 32 default-sized sequences (T 256 or
    128) costs < 1,500 aten calls (nested calls counted; measured 593-976), where the loops they
    replace made 4,500-19,000 (one per op per time step)."""
    from bench.perf.speed import sampler_cost
    from bench.training.train import build
    sampled, _ = build(compose_checked([f"task={task}"]))
    assert sampler_cost(sampled, repeats=1)["aten_calls"] < 1500


def test_the_counter_sees_a_blocking_copy_of_the_batch(monkeypatch):
    """A Batch copied the way Lightning would copy it by itself (Batch.to, blocking): one
    blocking copy per tensor of the training batch."""
    from bench.training.datamodule import TaskData

    monkeypatch.setattr(TaskData, "transfer_batch_to_device",
                        lambda self, batch, device, index: batch.to(device))
    profile = step_profile(compose_checked(["task.seq_len=32", *TINY]))
    assert profile["sync_ops"] == {"to (blocking)": 3}  # inputs, targets, loss_mask


def test_the_counter_sees_a_logged_device_tensor_read_by_the_progress_bar(monkeypatch):
    """The loss logged the usual Lightning way (self.log(..., prog_bar=True) of a device tensor)
    is read back with .item() by the progress bar at every step: counted."""
    import bench.training.module

    real = bench.training.module.ICLModule.training_step

    def logging(self, batch, batch_idx):
        loss = real(self, batch, batch_idx)
        self.log("loss_every_step", loss.detach(), prog_bar=True, logger=False)
        return loss

    monkeypatch.setattr(bench.training.module.ICLModule, "training_step", logging)
    profile = step_profile(compose_checked(["task.seq_len=32", *TINY]))
    assert profile["sync_ops"].get("_local_scalar_dense", 0) >= 1, profile["sync_ops"]


def test_every_tensor_of_a_batch_is_copied_without_blocking():
    """TaskData.transfer_batch_to_device (what Lightning calls for every training and test batch)
    copies each tensor of a Batch, latent included, and of the test loader's (index, Batch)
    pairs with non_blocking=True."""
    import torch
    from torch.overrides import TorchFunctionMode

    from bench.training.datamodule import TaskData
    from bench.training.train import build

    calls = []

    class Spy(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__name__", "") == "to":
                calls.append((id(args[0]), (kwargs or {}).get("non_blocking")))
            return func(*args, **(kwargs or {}))

    task, _ = build(compose_checked(["task.seq_len=16", *TINY]))
    data = TaskData(task)
    batch = task.held_out(2)
    tensors = [batch.inputs, batch.targets, batch.loss_mask, *batch.latent.values()]
    index = torch.arange(2)
    with Spy():
        data.transfer_batch_to_device(batch, torch.device("cpu"), 0)
        data.transfer_batch_to_device((index, batch), torch.device("cpu"), 0)
    assert batch.latent, "the held-out batch carries its latent"
    expected = [id(t) for t in tensors]
    assert calls == [(i, True) for i in expected + [id(index)] + expected]
