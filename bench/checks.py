"""Checks of a whole run configuration that need more than one config group, made when it is
composed and before anything runs: the hardware it asks for, whether the model fits the task,
whether it fits in memory, and whether its record can be written.

The model is built under FakeTensorMode (shapes and dtypes without storage), so a model that
would need 100 GB is refused in a fraction of a second, and its training activations are
measured by running one forward pass and adding up what autograd saves for the backward pass."""
from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from pathlib import Path

import torch

from bench.config import first_line

GIB = 2**30
ACCELERATORS = ("auto", "cpu", "gpu", "cuda")
STRATEGIES = ("auto", "ddp", "ddp_spawn", "ddp_find_unused_parameters_true")
PRECISIONS = ("32-true", "32", "bf16-mixed", "16-mixed", "64-true", "64")
LOGGERS = ("csv", "tensorboard", "wandb", "none")
# The packages a logger needs (any one of them), and what to install; csv needs nothing.
LOGGER_PACKAGES = {"tensorboard": (("tensorboard", "tensorboardX"), "tensorboard"),
                   "wandb": (("wandb",), "wandb")}


class CheckFailed(ValueError):
    """A whole-run check failed; the message is one line (bench.config turns it into a
    ConfigError)."""


def cuda_devices() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def world_size(config) -> int:
    """Processes that train together: devices per node (-1: every visible GPU) × nodes."""
    t = config.trainer
    per_node = t.devices if t.devices > 0 else max(1, cuda_devices())
    return per_node * t.num_nodes


def training_device(config) -> str:
    """The device type a run trains on, "cpu" or "cuda", as Lightning's accelerator resolves
    (unchecked: check_hardware says whether this machine has it)."""
    accelerator = config.trainer.accelerator
    return ("cuda" if accelerator in ("gpu", "cuda") or (accelerator == "auto" and cuda_devices())
            else "cpu")


def check_hardware(config) -> str:
    """The device type the run will train on ("cpu" or "cuda"), or CheckFailed when the
    configuration asks for hardware this machine does not have."""
    t = config.trainer
    if t.strategy == "ddp_spawn":
        raise CheckFailed("trainer.strategy=ddp_spawn is not supported: its processes return "
                          "their results through the launcher, not records; use "
                          "trainer.strategy=ddp (trainer=ddp)")
    gpus = cuda_devices()
    if t.accelerator in ("gpu", "cuda") and gpus == 0:
        raise CheckFailed(f"trainer.accelerator={t.accelerator} (trainer={config.trainer_name}) "
                          "but no CUDA GPU is visible; use trainer.accelerator=cpu or "
                          "trainer=default")
    device = training_device(config)
    if device == "cuda" and t.devices > gpus:
        raise CheckFailed(f"trainer.devices={t.devices} but only {gpus} CUDA GPU(s) are visible")
    if device == "cpu" and t.devices > (os.cpu_count() or 1):
        raise CheckFailed(f"trainer.devices={t.devices} CPU processes but this machine has "
                          f"{os.cpu_count()} cores")
    if device == "cpu" and t.precision == "16-mixed":
        raise CheckFailed("trainer.precision=16-mixed needs a CUDA GPU; on the CPU use "
                          "bf16-mixed or 32-true")
    if t.compile and device == "cpu" and not any(
            shutil.which(c) for c in (os.environ.get("CXX", "g++"), "c++", "clang++") if c):
        raise CheckFailed("trainer.compile=true on the CPU needs a C++ compiler (torch.compile "
                          "generates C++ there), and none is on PATH; install g++ or set CXX")
    world = world_size(config)
    if t.batch_size % world:
        raise CheckFailed(f"trainer.batch_size={t.batch_size} is the global batch and must split "
                          f"evenly over the {world} training processes")
    kernel = getattr(config.model, "kernel", None)
    if kernel == "mamba_ssm":
        if device != "cuda":
            raise CheckFailed("model.kernel=mamba_ssm runs only on a CUDA GPU (this run trains on "
                              "the CPU); use model.kernel=auto")
        from models.ssd import mamba_ssm_kernel_error
        error = mamba_ssm_kernel_error()
        if error:
            raise CheckFailed(f"model.kernel=mamba_ssm but its kernel cannot be loaded: {error}")
    return device


def check_logger(config) -> None:
    """The logger's package is installed (tensorboard and wandb are optional dependencies)."""
    import importlib.util
    logger = config.trainer.logger
    if logger not in LOGGER_PACKAGES:
        return
    modules, install = LOGGER_PACKAGES[logger]
    if not any(importlib.util.find_spec(module) for module in modules):
        raise CheckFailed(f"trainer.logger={logger} needs the {install} package, which is not "
                          f"installed: pip install {install} (or use trainer.logger=csv)")


def available_bytes(device: str) -> int | None:
    """Free memory of the training device (the first GPU, or the host's available RAM)."""
    if device == "cuda":
        free, _ = torch.cuda.mem_get_info(0)
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def model_footprint(config, task, budget: int | None) -> tuple[int, int]:
    """(parameters, bytes autograd saves in one training forward pass of a batch), measured on
    models built without storage. A deep model is measured at depths 1 and 2 and extrapolated
    linearly (its layers are identical), so 10^5 layers cost no more to check than 2."""
    depth = getattr(config.model, "n_layers", None)
    if not isinstance(depth, int) or depth <= 2:
        return _footprint(config, config.model, task, budget)
    one = _footprint(config, dataclasses.replace(config.model, n_layers=1), task, None)
    two = _footprint(config, dataclasses.replace(config.model, n_layers=2), task, None)
    return tuple(a + (depth - 1) * (b - a) for a, b in zip(one, two))


def _footprint(config, model_config, task, budget: int | None) -> tuple[int, int]:
    """Builds the model without storage; a model constructor's ValueError (a model that does
    not fit the task) becomes CheckFailed. The forward pass is skipped when the weights alone
    exceed `budget` bytes."""
    import logging

    from torch._subclasses.fake_tensor import FakeTensorMode

    from models import build_model
    from models.backbone import IOSpec
    io = IOSpec(task.kind, task.input_dim, task.output_dim, task.seq_len)
    saved = 0

    def pack(tensor):
        nonlocal saved
        saved += tensor.numel() * tensor.element_size()
        return tensor

    with FakeTensorMode(allow_non_fake_inputs=True):
        try:
            model = build_model(config.model_family, model_config, io)
        except ValueError as error:
            raise CheckFailed(f"model {config.model_name} cannot be built for task "
                              f"{config.task_name}: {first_line(error) or type(error).__name__}") from None
        params = sum(p.numel() for p in model.parameters())
        if budget is not None and 16 * params > budget:
            return params, 0
        shape = (config.trainer.batch_size, task.seq_len)
        inputs = (torch.zeros(shape, dtype=torch.long) if task.kind == "tokens"
                  else torch.zeros(*shape, task.input_dim))
        # an op that cannot run on fake tensors logs a traceback before raising: not for users
        fake_log = logging.getLogger("torch._subclasses.fake_tensor")
        level, fake_log.level = fake_log.level, logging.CRITICAL
        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
                model(inputs)
        except ValueError as error:
            raise CheckFailed(f"model {config.model_name} does not fit task {config.task_name}: "
                              f"{first_line(error) or type(error).__name__}") from None
        except Exception:  # a data-dependent forward pass cannot run without data: no estimate
            saved = 0
        finally:
            fake_log.setLevel(level)
    return params, saved


def memory_estimate(config, task, params: int, activations: int) -> dict[str, int]:
    """Bytes the run needs at its peak, by phase (a rough upper estimate, not a measurement).

    training: weights, gradients and two AdamW moments in float32, a batch, the activations,
    the pool of training tasks (task.num_tasks > 0);
    evaluation: the held-out set, float64 predictions of every reference and of the model
    (and a few same-sized intermediates), and the bootstrap's resampled index."""
    t = config.trainer
    layers = max(1, getattr(config.model, "n_layers", 1))
    per_sequence = task.memory_per_sequence()
    per_rank = t.batch_size // world_size(config)
    training = (16 * params + activations * per_rank // t.batch_size + per_rank * per_sequence
                + task.pool_bytes())  # the finite pool of training tasks, if any
    predictors = len(task.references()) + 1
    eval_batch = t.eval_batch_size
    if task.scoring == "perplexity":
        # per-position losses only (float64, and the model's top-1 hits), and the logits of one
        # chunk of an evaluation batch at a time (bench/train.py token_score_chunks)
        from bench.evaluate import token_score_chunks
        eval_batch = token_score_chunks(t.eval_batch_size, task.seq_len, task.output_dim)[0].stop
        prediction = task.seq_len * 16
        chunk_logits = 3 * 4 * eval_batch * task.seq_len * task.output_dim
    else:
        prediction = task.seq_len * task.output_dim * 8
        chunk_logits = 0
    evaluation = (4 * params + t.eval_sequences * (per_sequence + 3 * predictors * prediction)
                  + 16 * t.bootstrap * t.eval_sequences + chunk_logits
                  # no_grad: about one layer's activations are alive at a time
                  + activations * eval_batch // (t.batch_size * layers))
    return {"training": training, "evaluation": evaluation}


def check_memory(config, task, device: str) -> None:
    have = available_bytes(device)
    params, activations = model_footprint(config, task, have)
    need = memory_estimate(config, task, params, activations)
    if have is not None and max(need.values()) > have:
        phase = max(need, key=need.get)
        raise CheckFailed(
            f"the run needs about {need[phase] / GIB:.1f} GiB for {phase} ({params:,} parameters; "
            f"training ~{need['training'] / GIB:.1f} GiB, evaluation "
            f"~{need['evaluation'] / GIB:.1f} GiB) but {device} has {have / GIB:.1f} GiB free; "
            + ("reduce trainer.batch_size, task.seq_len or the model size" if phase == "training"
               else "reduce trainer.eval_sequences, trainer.bootstrap or task.seq_len"))


def check_out_dir(out_dir: str) -> None:
    """out_dir is (or can be created as) a directory where a file can be written. Probes with a
    temporary file, which also catches read-only mounts where os.access would say yes to root;
    creates nothing that outlives the check."""
    if not out_dir.strip():
        raise CheckFailed("out_dir is empty; give a directory for the run records")
    path = Path(out_dir)
    existing = path
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        raise CheckFailed(f"out_dir={out_dir}: {existing} is not a directory")
    try:
        with tempfile.TemporaryFile(dir=existing, prefix=".probe-"):
            pass
    except OSError as error:
        raise CheckFailed(f"out_dir={out_dir} is not writable: {error.strerror or error}") \
            from None


def check_run(config) -> None:
    """Every whole-run check, cheapest first."""
    from tasks import task_families
    device = check_hardware(config)
    check_logger(config)
    try:
        task = task_families()[config.task_family](config.task, batch_size=config.trainer.batch_size,
                                                   seed=config.seed)
    except ValueError as error:
        raise CheckFailed(f"task {config.task_name}: {first_line(error) or type(error).__name__}") from None
    check_memory(config, task, device)
    check_out_dir(config.out_dir)
    if config.resume:  # a suite's entries are all checked before its first run
        from bench.train import check_resume
        check_resume(config)
