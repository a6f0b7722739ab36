"""Checks of a whole run configuration that need more than one config group, made once it is
composed (compose_checked) and before anything runs: the hardware it asks for, whether the model fits the task,
whether it fits in memory, and whether its record can be written.

The memory check builds the model under FakeTensorMode (shapes and dtypes without storage), so a
model that would need 100 GB is refused in a fraction of a second, and measures its passes as
they will run (precision, SSD kernel): a training step's forward pass, loss and backward pass
and an evaluation call, following every allocation to its peak. With the buffers it counts, the
estimate is per side, the training device of this rank and the host, each compared with what
that side has free."""
from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import tempfile
import weakref
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from bench.config import (ACCELERATORS, LOGGERS, PRECISIONS, STRATEGIES, ConfigError, RunConfig,
                          compose, first_line)
from bench.records import (CHECKPOINT_FORMAT, CHECKPOINT_KEY, Environment, make_environment,
                           code_of_this_process)

GIB = 2**30
MIB = 2**20
# The packages a logger needs (any one of them), and what to install; csv needs nothing.
LOGGER_PACKAGES = {"tensorboard": (("tensorboard", "tensorboardX"), "tensorboard"),
                   "wandb": (("wandb",), "wandb")}


class CheckFailed(ValueError):
    """A whole-run check failed; the message is one line (compose_checked turns it into
    a ConfigError)."""


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


def loader_workers(config) -> int:
    """Processes that sample training batches (trainer.loader_workers; -1: automatic). On a
    GPU, sampling in the training process would sit between steps: up to 4 workers per rank, as
    the host's cores allow. On the CPU the cores are training: batches are sampled in-process."""
    if config.trainer.loader_workers >= 0:
        return config.trainer.loader_workers
    if training_device(config) != "cuda":
        return 0
    ranks_here = max(1, world_size(config) // config.trainer.num_nodes)
    return max(1, min(4, (os.cpu_count() or 1) // ranks_here - 1))


# What a multi-node launcher puts in each process's environment (torchrun, SLURM, MPI-style
# launchers set some of them; Lightning reads them to find the other nodes).
MULTI_NODE_LAUNCH = ("NODE_RANK", "GROUP_RANK", "SLURM_NNODES", "SLURM_JOB_NUM_NODES",
                     "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


def check_hardware(config) -> str:
    """The device type the run will train on ("cpu" or "cuda"), or CheckFailed when the
    configuration asks for hardware this machine does not have."""
    t = config.trainer
    if t.strategy == "ddp_spawn":
        raise CheckFailed("trainer.strategy=ddp_spawn is not supported: its processes return "
                          "their results through the launcher, not records; use "
                          "trainer.strategy=ddp (trainer=ddp)")
    if t.num_nodes > 1 and not any(os.environ.get(name) for name in MULTI_NODE_LAUNCH):
        raise CheckFailed(f"trainer.num_nodes={t.num_nodes} needs a multi-node launcher that "
                          "starts every node (torchrun --nnodes, SLURM's srun); started alone, "
                          "this process would wait forever for the other nodes")
    cores = os.cpu_count() or 1
    if t.threads > 4 * cores:  # torch sized its thread pool by it: 100000 segfaulted
        raise CheckFailed(f"trainer.threads={t.threads} but this machine has {cores} cores; "
                          f"use at most {4 * cores} (0: torch's default, one per core)")
    gpus = cuda_devices()
    if t.accelerator in ("gpu", "cuda") and gpus == 0:
        raise CheckFailed(f"trainer.accelerator={t.accelerator} (trainer={config.trainer_name}) "
                          "but no CUDA GPU is visible; use trainer.accelerator=cpu or "
                          "trainer=default")
    device = training_device(config)
    if device == "cpu" and t.devices == -1:
        raise CheckFailed("trainer.devices=-1 means every GPU, and this run trains on the CPU; "
                          "give the number of CPU processes (trainer.devices=1, 2, ...)")
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


def local_rank() -> int:
    """This process's rank on its node, which Lightning's launcher puts in LOCAL_RANK (0 in the
    first process, before it launches the others): the index of the GPU it will train on."""
    try:
        return int(os.environ.get("LOCAL_RANK", 0))
    except ValueError:
        return 0


def available_bytes(side: str) -> int | None:
    """Free memory of `side`: "cuda", this rank's GPU (LOCAL_RANK; asking opens a CUDA context on
    that GPU only), or "host", the node's available RAM; None when it cannot be read."""
    if side == "cuda":
        free, _ = torch.cuda.mem_get_info(local_rank())
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


# Allowances for what a run allocates beyond the tensors measured here, after the checks. Host:
# Lightning's loops, the threads' malloc arenas, allocator slack (the default run's peak RSS is
# 155 MB above its RSS when checked, with ~40 MB of tensors). CUDA: the host memory of the
# libraries a run's first kernels load (cuBLAS, cuDNN), and on the GPU their workspaces and the
# caching allocator's rounding (neither measured: no GPU was lent to this work).
HOST_RUNTIME = 256 * MIB
CUDA_HOST_RUNTIME = GIB
CUDA_RUNTIME = 512 * MIB


def parameter_bytes(precision: str) -> int:
    """Bytes of a parameter, a gradient or an AdamW moment: float64 under 64-true, else float32
    (*-mixed keeps float32 weights and computes under autocast)."""
    return 8 if precision in ("64-true", "64") else 4


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype | None):
    """torch's default floating dtype set to `dtype` inside (None: unchanged), restored after."""
    previous = torch.get_default_dtype()
    if dtype is not None:
        torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


@contextlib.contextmanager
def precision_context(precision: str):
    """The forward context Lightning's precision plugin gives a step: autocast for *-mixed (on the
    CPU device type, where the fake tensors live; as on CUDA, matmuls run in half precision and
    losses and reductions in float32), float64 as the default dtype for 64-true."""
    half = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
    if half is not None:
        with torch.autocast("cpu", dtype=half):
            yield
    elif parameter_bytes(precision) == 8:
        with default_dtype(torch.float64):
            yield
    else:
        yield


class Allocations(TorchDispatchMode):
    """Bytes of the tensors that ops allocate while it is active: `live` now, `peak` so far.

    A storage counts from the op that creates it until it is freed (a weak reference's
    callback), so what autograd saves counts until the backward pass releases it; results that
    alias an input (views, in-place ops: the op's schema says so) allocate nothing. Runs on fake
    tensors, so a model's peak is measured without its memory."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0

    def _free(self, size: int) -> None:
        self.live -= size

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        returns = func._schema.returns
        for result, declared in zip(out if len(returns) > 1 else (out,), returns):
            if declared.alias_info is None:
                for tensor in tree_leaves(result):
                    if isinstance(tensor, torch.Tensor):
                        storage = tensor.untyped_storage()
                        size = storage.nbytes()
                        self.live += size
                        weakref.finalize(storage, self._free, size)
        self.peak = max(self.peak, self.live)
        return out


@dataclasses.dataclass(frozen=True)
class Footprint:
    """A model's parameters, and the peak bytes its passes allocate on one rank (measured on a
    model without storage): the training forward pass with its loss, that and the backward pass
    (the new gradients included), and one evaluation call (an evaluation batch; for text, the
    first chunk of it, bench/evaluate.py token_scores)."""

    params: int
    forward: int = 0
    backward: int = 0
    evaluation: int = 0


def scan_kernel(config, device: str, mamba_ssm: bool | None = None) -> str | None:
    """The SSD scan the run's model will use on `device` (models.ssd.resolve_kernel): "auto" is
    the mamba_ssm kernel on CUDA when it imports (`mamba_ssm`: whether it does, default: ask
    this machine) and the precision is not float64. None for a model without an SSD scan."""
    kernel = getattr(config.model, "kernel", None)
    if kernel != "auto":
        return kernel
    if device != "cuda" or parameter_bytes(config.trainer.precision) == 8:
        return "torch"
    if mamba_ssm is None:
        from models.ssd import mamba_ssm_available
        mamba_ssm = mamba_ssm_available()
    return "mamba_ssm" if mamba_ssm else "torch"


def model_footprint(config, task, kernel: str | None, eval_rows: int,
                    budget: int | None = None) -> Footprint:
    """The Footprint of the run's model at one rank's batch, with the SSD scan `kernel`. A deep
    model is measured at depths 1 and 2 and extrapolated linearly (its layers are identical), so
    10^5 layers cost no more to check than 2."""
    depth = getattr(config.model, "n_layers", None)
    if not isinstance(depth, int) or depth <= 2:
        return _footprint(config, config.model, task, kernel, eval_rows, budget)
    one, two = (_footprint(config, dataclasses.replace(config.model, n_layers=layers), task, kernel,
                           eval_rows, None) for layers in (1, 2))
    return Footprint(*(a + (depth - 1) * (b - a)
                       for a, b in zip(dataclasses.astuple(one), dataclasses.astuple(two))))


def _footprint(config, model_config, task, kernel: str | None, eval_rows: int,
               budget: int | None) -> Footprint:
    """Builds the model without storage and measures its passes (Allocations); a model
    constructor's ValueError (a model that does not fit the task) becomes CheckFailed. The passes
    are skipped when the weights, gradients and AdamW state alone exceed `budget` bytes, and
    measure nothing for a model whose forward pass depends on the data (no estimate)."""
    import logging

    from torch._subclasses.fake_tensor import FakeTensorMode

    from bench.evaluate import masked_loss, token_scores
    from models import build_model
    from models.backbone import IOSpec
    from models.ssd import kernel_footprint, scan_override
    from tasks.base import Batch
    precision = config.trainer.precision
    io = IOSpec(task.kind, task.input_dim, task.output_dim, task.seq_len)
    with FakeTensorMode(allow_non_fake_inputs=True):
        try:
            # a float64 run's model is built in float64: module.double() cannot swap the
            # parameters of a model without storage
            with default_dtype(torch.float64 if parameter_bytes(precision) == 8 else None):
                model = build_model(config.model_family, model_config, io)
        except ValueError as error:
            raise CheckFailed(f"model {config.model_name} cannot be built for task "
                              f"{config.task_name}: {first_line(error) or type(error).__name__}") from None
        params = sum(p.numel() for p in model.parameters())
        if budget is not None and 4 * parameter_bytes(precision) * params > budget:
            return Footprint(params)

        def batch(rows: int) -> Batch:
            shape = (rows, task.seq_len)
            inputs = (torch.zeros(shape, dtype=torch.long) if task.kind == "tokens"
                      else torch.zeros(*shape, task.input_dim))
            targets = (torch.zeros(shape, dtype=torch.long) if task.kind == "tokens"
                       else torch.zeros(*shape, task.output_dim))
            return Batch(inputs, targets, torch.ones(shape, dtype=torch.bool))

        # an op that cannot run on fake tensors logs a traceback before raising: not for users
        fake_log = logging.getLogger("torch._subclasses.fake_tensor")
        level, fake_log.level = fake_log.level, logging.CRITICAL
        scan = scan_override(kernel_footprint) if kernel == "mamba_ssm" else contextlib.nullcontext()
        try:
            with scan, precision_context(precision):
                train = batch(config.trainer.batch_size // world_size(config))
                with Allocations() as allocated:
                    output = model(train.inputs)
                    loss = masked_loss(task, output, train)  # the run's loss, no data-sized op
                    del output
                    forward = allocated.peak
                    loss.backward()
                    backward = allocated.peak
                held_out = batch(eval_rows)
                model.eval()
                with torch.no_grad(), Allocations() as allocated:
                    if task.scoring == "perplexity":
                        token_scores(model, held_out, task.output_dim)
                    else:
                        model.predict(held_out.inputs).float()
                return Footprint(params, forward, backward, allocated.peak)
        except ValueError as error:
            raise CheckFailed(f"model {config.model_name} does not fit task {config.task_name}: "
                              f"{first_line(error) or type(error).__name__}") from None
        except Exception:  # a data-dependent forward pass cannot run without data: no estimate
            return Footprint(params)
        finally:
            fake_log.setLevel(level)


@dataclasses.dataclass(frozen=True)
class Term:
    """A part of the estimate: bytes that live on `side` ("device": one rank's training device;
    "host": the node's RAM, every rank on it) during `phase` ("training" or "evaluation"), what
    they hold, and the option that shrinks them (named when the run does not fit)."""

    side: str
    phase: str
    what: str
    option: str
    bytes: int


@dataclasses.dataclass(frozen=True)
class Estimate:
    """A run's memory at the peak of each phase on each side: a CUDA run's "device" (one rank's
    GPU) and "host"; a CPU run has only the host, where the device terms of its `ranks`
    processes add to the host's."""

    device: str
    params: int
    ranks: int  # training processes on this node
    terms: tuple[Term, ...]

    @property
    def sides(self) -> tuple[str, ...]:
        return ("device", "host") if self.device == "cuda" else ("host",)

    def parts(self, side: str, phase: str) -> list[Term]:
        """The terms of `phase` on `side`, largest first."""
        if self.device == "cuda":
            parts = [t for t in self.terms if t.phase == phase and t.side == side]
        else:
            parts = [dataclasses.replace(t, bytes=t.bytes * self.ranks) if t.side == "device"
                     else t for t in self.terms if t.phase == phase]
        return sorted(parts, key=lambda t: -t.bytes)

    def need(self, side: str, phase: str) -> int:
        return sum(t.bytes for t in self.parts(side, phase))


def pool_peak_bytes(task, probe: int = 64, chunk_floats: int = 1 << 24) -> int:
    """Peak bytes of drawing the pool of training tasks (tasks/base.py `_draw_pool`), not just
    of holding it: the chunks and their concatenation live together (twice the pool), and the
    chunk being drawn has its sampling temporaries, measured on a draw of `probe` tasks and
    scaled to a chunk (`chunk_floats`, _draw_pool's default). Counting the pool once let
    linreg num_tasks=10^9 (18.6 GiB held, 37 GiB at the peak) past the check on a 21 GiB host,
    where the kernel killed it with no record."""
    pool = task.pool_bytes()
    if pool == 0:
        return 0
    generator = torch.Generator().manual_seed(0)
    with Allocations() as allocated:
        drawn = task.draw_latent(probe, generator)
    kept = sum(v.numel() * v.element_size() for v in drawn.values())
    per_task = max(0, allocated.peak - kept) / probe
    floats = max(1, sum(v[0].numel() for v in drawn.values()))
    chunk = min(task.num_tasks, max(1, chunk_floats // floats))
    return 2 * pool + int(per_task * chunk)


def batches_in_flight(config) -> int:
    """Training batches of one rank alive on the host at once: each loader worker's prefetch
    and the pinned copy, or the one being made and the one training when sampled in-process."""
    from tasks.base import Task
    workers = loader_workers(config)
    return 2 if workers == 0 else workers * Task.PREFETCH + 1


def memory_estimate(config, task, device: str, kernel: str | None = None,
                    budget: int | None = None) -> Estimate:
    """Bytes the run needs at its peaks (an upper estimate from measured passes and counted
    buffers), for training on `device` ("cpu" or "cuda": this machine need not have it) at the
    configured precision, with the SSD scan `kernel` (default: scan_kernel on this machine).

    Device, per rank. Training: weights, gradients and two AdamW moments (the last step's
    gradients live until the next backward pass; AdamW's foreach step adds a parameter-sized
    temporary), DDP's gradient buckets, the activations and loss measured at their peak, the
    batch and the pool of training tasks. Evaluation: weights and gradients, one evaluation
    call, the model outputs gathered from every rank (and their sorted float32 and float64
    copies).
    Host, per node. Training: the batches the loader prefetches. Evaluation: on every rank the
    held-out set, the gathered predictions in float64 and the AdamW state (and on a GPU, the
    model), which Lightning moves to the host after fitting; on rank 0 the references' float64
    predictions (and a few same-sized intermediates) and the bootstrap's resampled index.
    Both sides and phases: the allowances for what is not a tensor counted here (HOST_RUNTIME,
    CUDA_HOST_RUNTIME, CUDA_RUNTIME)."""
    t = config.trainer
    kernel = kernel if kernel is not None else scan_kernel(config, device)
    world = world_size(config)
    ranks = world // t.num_nodes
    held_out = task.held_out_size(t.eval_sequences)
    eval_rows = max(1, min(t.eval_batch_size, -(-held_out // world)))
    model = model_footprint(config, task, kernel, eval_rows, budget)
    weights = parameter_bytes(t.precision) * model.params  # one parameter-sized buffer
    per_sequence = task.memory_per_sequence()
    size = task.eval_size_option
    if task.scoring == "perplexity":  # per-position losses and top-1 hits, never distributions
        outputs, prediction = 2, task.seq_len * 16
    else:
        outputs, prediction = task.output_dim, task.seq_len * task.output_dim * 8
    predictors = len(task.references()) + 1
    runtime = HOST_RUNTIME + (CUDA_HOST_RUNTIME if device == "cuda" else 0)
    activations = max(model.forward, model.backward - weights, weights)
    terms = [
        Term("device", "training", "weights, gradients and AdamW state", "the model size",
             (5 if world > 1 else 4) * weights),
        Term("device", "training", "activations and loss", "trainer.batch_size or task.seq_len",
             activations),
        Term("device", "training", "the batch", "trainer.batch_size",
             t.batch_size // world * per_sequence),
        Term("device", "training", "the pool of training tasks", "task.num_tasks",
             pool_peak_bytes(task)),
        Term("device", "evaluation", "weights and gradients", "the model size", 2 * weights),
        Term("device", "evaluation", "an evaluation batch's forward pass",
             "trainer.eval_batch_size", model.evaluation),
        Term("device", "evaluation", "the gathered model outputs", size,
             24 * held_out * task.seq_len * outputs),
        Term("host", "training", "the processes' runtime", "", ranks * runtime),
        Term("host", "training", "training batches sampled ahead (loader workers, pinned)",
             "trainer.batch_size or trainer.loader_workers",
             ranks * batches_in_flight(config) * (t.batch_size // world) * per_sequence),
        Term("host", "evaluation", "the processes' runtime", "", ranks * runtime),
        Term("host", "evaluation", "the AdamW state (and a GPU run's model) after fitting",
             "the model size", ranks * (4 if device == "cuda" else 2) * weights),
        Term("host", "evaluation", "the held-out set and predictions on every rank", size,
             ranks * held_out * (per_sequence + prediction)),
        Term("host", "evaluation", "the references' float64 predictions", size,
             held_out * 3 * predictors * prediction),
        Term("host", "evaluation", "the bootstrap", f"trainer.bootstrap or {size}",
             24 * t.bootstrap * held_out),
    ]
    if device == "cuda":
        terms += [Term("device", phase, "CUDA workspaces", "", CUDA_RUNTIME)
                  for phase in ("training", "evaluation")]
    return Estimate(device, model.params, ranks, tuple(terms))


def free_memory(device: str) -> dict[str, int | None]:
    """What each side a run on `device` uses has free, in bytes (None: cannot be read)."""
    free = {"host": available_bytes("host")}
    if device == "cuda":
        free["device"] = available_bytes("cuda")
    return free


def check_memory(config, task, device: str) -> None:
    """Refuses a run whose estimate exceeds the free memory of a side (the GPU this rank trains
    on, the host), naming the largest part and the option that shrinks it."""
    free = free_memory(device)
    estimate = memory_estimate(config, task, device, budget=free.get("device", free["host"]))
    short = [(estimate.need(side, phase) / free[side], side, phase)
             for side in estimate.sides for phase in ("training", "evaluation")
             if free[side] is not None and estimate.need(side, phase) > free[side]]
    if not short:
        return
    _, side, phase = max(short)
    largest = next((t for t in estimate.parts(side, phase) if t.option), None)
    where = f"cuda:{local_rank()}" if side == "device" else "the host"
    raise CheckFailed(
        f"the run needs about {estimate.need(side, phase) / GIB:.1f} GiB for {phase} on {where} "
        f"but it has {free[side] / GIB:.1f} GiB free ({estimate.params:,} parameters" +
        (f"; the largest part, ~{largest.bytes / GIB:.1f} GiB: {largest.what}); reduce "
         f"{largest.option}" if largest else "); free some memory"))


def check_out_dir(out_dir: str) -> None:
    """out_dir is (or can be created as) a directory where a file can be written. Probes with a
    temporary file, which also catches read-only mounts where os.access would say yes to root;
    creates nothing that outlives the check."""
    if not out_dir.strip():
        raise CheckFailed("out_dir is empty; give a directory for the run records")
    path = Path(out_dir)
    long = next((part for part in path.parts if len(os.fsencode(part)) > 255), None)
    if long is not None:
        raise CheckFailed(f"out_dir={out_dir[:60]}...: a folder name of {len(os.fsencode(long))} "
                          "bytes; file systems allow 255")
    existing = path
    while not existing.exists():
        if os.path.lexists(existing):  # a link to nothing (or to itself): no record could land
            raise CheckFailed(f"out_dir={out_dir}: {existing} is a symlink that leads nowhere")
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


def checked_task(config):
    """The run's task, built as the run builds it (each rank samples its share of the global
    trainer.batch_size); a setting the task refuses is one line. The run trains on the one the
    checks built (checked_run, train.run's `task`): a run builds its task once."""
    from tasks import task_families
    try:
        return task_families()[config.task_family](
            config.task, batch_size=config.trainer.batch_size // world_size(config),
            seed=config.seed)
    except ValueError as error:
        raise CheckFailed(f"task {config.task_name}: "
                          f"{first_line(error) or type(error).__name__}") from None


def memory_summary(config) -> dict:
    """check_memory's estimate of a run that passed it, per side and phase in GiB beside what
    the side has free, and the largest part of each: what `run print_config=true` shows."""
    device = check_hardware(config)
    free = free_memory(device)
    estimate = memory_estimate(config, checked_task(config), device,
                               budget=free.get("device", free["host"]))
    summary: dict = {"parameters": estimate.params}
    for side in estimate.sides:
        name = f"cuda:{local_rank()}" if side == "device" else "host"
        entry: dict = {}
        for phase in ("training", "evaluation"):
            largest = estimate.parts(side, phase)[0]
            entry[f"{phase}_gib"] = round(estimate.need(side, phase) / GIB, 3)
            entry[f"{phase}_largest"] = f"{largest.what} ({largest.bytes / GIB:.3f} GiB)"
        entry["free_gib"] = None if free[side] is None else round(free[side] / GIB, 1)
        summary[name] = entry
    return summary


def too_large(error: BaseException) -> bool:
    """Whether torch refused a tensor for its size while the checks built the task or measured
    the model: a size whose bytes overflow 64 bits ("Storage size calculation overflowed",
    "Overflow when unpacking long long"), or an allocation the host cannot make. Integers that
    fit 64 bits but not a tensor (model.d_model=10^9, task.seq_len=10^10) ended as an internal
    error, exit 1, where the memory check refuses what is merely too big."""
    if isinstance(error, (MemoryError, OverflowError)):
        return True
    text = str(error).lower()
    return isinstance(error, (RuntimeError, TypeError)) and any(
        part in text for part in ("overflow", "can't allocate memory", "not enough memory"))


def largest_integer_override(config) -> str | None:
    """The override (as given) that holds the largest integer: the likeliest size to blame."""
    best, named = 0, None
    for override in config.overrides:
        key, _, value = override.partition("=")
        if "." not in key:
            continue
        for number in re.findall(r"[0-9]+", value):
            if int(number) > best:
                best, named = int(number), override
    return named


def compose_checked(argv: list[str]) -> RunConfig:
    """compose(argv) and every whole-run check (check_run) of the result, a failure as a
    one-line ConfigError raised before anything runs: what the CLI runs before a command."""
    return checked_run(argv)[0]


def checked_run(argv: list[str]) -> tuple:
    """compose_checked, and the task the checks built (a tasks.base.Task): the run's own
    (train.run's `task`), so that a run builds its task once."""
    config = compose(argv)
    try:
        task = check_run(config)
    except CheckFailed as error:
        raise ConfigError(str(error)) from None
    return config, task


def check_run(config):
    """Every whole-run check, cheapest first; returns the task the memory check built."""
    device = check_hardware(config)
    check_logger(config)
    try:
        task = checked_task(config)
        check_memory(config, task, device)
    except CheckFailed:
        raise
    except Exception as error:
        if not too_large(error):
            raise
        named = largest_integer_override(config)
        raise CheckFailed(f"{named + ': ' if named else ''}the run's tensors cannot be allocated at "
                          f"{'this size' if named else 'these sizes'} ({type(error).__name__}: "
                          f"{first_line(error)}); lower {'it' if named else 'them'}") from None
    check_out_dir(config.out_dir)
    for folder, used in (("logs", config.trainer.logger != "none"),
                         ("checkpoints", config.trainer.checkpoint_every > 0)):
        inside = Path(config.out_dir) / folder  # the run's own folder goes in it
        if used and os.path.lexists(inside) and not inside.is_dir():
            # (found after the start, it was a failed record at step 0, exit 1)
            raise CheckFailed(f"out_dir={config.out_dir}: {inside} is not a directory, and the "
                              f"run's {folder} go there")
    if config.resume:  # a suite's entries are all checked before its first run
        check_resume(config)
    return task


def planned_environment(config) -> Environment:
    """The environment a run of config (a bench.config.RunConfig) trains in on this machine,
    resolved as the run resolves it (bench.checks.check_hardware, models.ssd.resolve_kernel)."""
    from models.ssd import resolve_kernel
    device = check_hardware(config)
    kernel = getattr(config.model, "kernel", None)
    # this rank's GPU (Lightning gives rank r of a node the device LOCAL_RANK)
    name = (torch.cuda.get_device_name(int(os.environ.get("LOCAL_RANK", 0)))
            if device == "cuda" else "cpu")
    return make_environment(device, name,
                        resolve_kernel(kernel, torch.device(device)) if kernel else None,
                        config.trainer.precision, config.trainer.compile, config.trainer.tf32)


def _differences(saved, current, prefix: str) -> list[str]:
    """Dotted keys whose values differ between two nested dicts, with both values."""
    if isinstance(saved, dict) and isinstance(current, dict):
        out = []
        # Names first: "a different task: task.name=..." says the most in the fewest words.
        order = {"name": 0, "family": 1}
        for key in sorted(set(saved) | set(current), key=lambda k: (order.get(k, 2), str(k))):
            if key not in saved:
                out.append(f"{prefix}.{key} (not in the checkpoint)")
            elif key not in current:
                out.append(f"{prefix}.{key} (only in the checkpoint)")
            else:
                out += _differences(saved[key], current[key], f"{prefix}.{key}")
        return out
    if isinstance(saved, (list, tuple)) and isinstance(current, (list, tuple)):
        saved, current = list(saved), list(current)
    return [] if saved == current else [f"{prefix}={saved!r} in the checkpoint, {current!r} now"]


# Trainer settings a resumed run may change: how it is evaluated, logged and checkpointed, and
# how batches are fed; none changes what is trained. Every other setting (and the seed, the
# environment, the code) must be the checkpoint's: the optimizer, its schedule over max_steps
# and the batches continue from the checkpoint as they were.
RESUME_MAY_CHANGE = frozenset({"eval_sequences", "eval_batch_size", "bootstrap", "reference_cache",
                               "log_every", "val_every", "val_sequences", "checkpoint_every",
                               "progress", "threads", "logger", "loader_workers", "save_weights"})


def check_resume(config: RunConfig) -> dict:
    """Validate `resume=<checkpoint>` before anything runs or is written: the file exists and is
    readable, this runner wrote it, and it was made with the same task and model (name and
    config). Returns the checkpoint's run metadata, with `resume_step` (the step the run goes
    on from); raises ConfigError (one line) otherwise."""
    path = config.resume
    if not os.path.isfile(path):
        raise ConfigError(f"resume: no checkpoint file '{path}'")
    try:
        # weights_only=False: Lightning checkpoints hold more than tensors (loop states, our
        # metadata); only load checkpoints you trust, as with any pickle.
        checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:  # unreadable, truncated, not a torch file: all one line
        raise ConfigError(f"resume: cannot read checkpoint '{path}': {type(error).__name__}: "
                          f"{first_line(error)}") from None
    meta = checkpoint.get(CHECKPOINT_KEY) if isinstance(checkpoint, dict) else None
    if not isinstance(meta, dict) or meta.get("format") != CHECKPOINT_FORMAT:
        raise ConfigError(f"resume: '{path}' is not a checkpoint written by this runner "
                          f"(no '{CHECKPOINT_KEY}' metadata of format {CHECKPOINT_FORMAT})")
    described = config.describe()

    def trained_by(trainer: dict | None) -> dict:
        settings = (trainer or {}).get("config") or {}
        return {key: value for key, value in settings.items() if key not in RESUME_MAY_CHANGE}

    now, code_now = planned_environment(config), code_of_this_process()["code"]
    compared = {  # what the checkpoint was made with, what this run would use
        "task": (meta.get("task"), described["task"]),
        "model": (meta.get("model"), described["model"]),
        "seed": (meta.get("seed"), described["seed"]),
        "trainer": (trained_by(meta.get("trainer")), trained_by(described["trainer"])),
        # older checkpoints carry no environment or code: nothing to compare them with
        "environment": (meta.get("environment", now._asdict()), now._asdict()),
        "code": (meta.get("code", code_now), code_now)}
    for group, (then, current) in compared.items():
        diffs = _differences(then, current, group)
        if diffs:
            more = f" (and {len(diffs) - 2} more)" if len(diffs) > 2 else ""
            raise ConfigError(f"resume: '{path}' was made with a different {group}: "
                              f"{'; '.join(diffs[:2])}{more}; a resumed run trains on as it "
                              "started, or its record would not say what ran")
    return {**meta, "resume_step": int(checkpoint.get("global_step", 0))}
