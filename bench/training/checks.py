"""Checks of a whole run configuration that need more than one config group, made once it is
composed (compose_checked) and before anything runs: the hardware it asks for, whether the model
fits the task, whether it fits in memory (the estimate: bench/training/memory.py), whether its
record can be written, and whether a resumed run continues the run it names."""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import tempfile
import weakref
from pathlib import Path

import torch

from bench.config import CheckFailed, ConfigError, RunConfig, compose, first_line
from bench.records.store import (CHECKPOINT_FORMAT, CHECKPOINT_KEY, Environment,
                                 code_of_this_process, make_environment)
from bench.training import devices
from bench.training.devices import local_rank, rank_task, training_device, world_size
from bench.training.memory import GIB, free_memory, memory_estimate
from models.ssd import mamba_ssm_kernel_error, resolve_kernel
from tasks.files import DamagedFile, check_digest, digest_path

# The packages a logger needs (any one of them), and what to install; csv needs nothing.
LOGGER_PACKAGES = {"tensorboard": (("tensorboard", "tensorboardX"), "tensorboard"),
                   "wandb": (("wandb",), "wandb")}


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
    gpus = devices.cuda_devices()  # through the module: one place to pretend a GPU
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
    if t.batch_size // world % t.accumulate_grad_batches:
        raise CheckFailed(f"trainer.batch_size={t.batch_size} must split evenly into "
                          f"{world} process(es) x trainer.accumulate_grad_batches="
                          f"{t.accumulate_grad_batches} micro-batches")
    kernel = getattr(config.model, "kernel", None)
    if kernel == "mamba_ssm":
        if device != "cuda":
            raise CheckFailed("model.kernel=mamba_ssm runs only on a CUDA GPU (this run trains on "
                              "the CPU); use model.kernel=auto")
        error = mamba_ssm_kernel_error()
        if error:
            raise CheckFailed(f"model.kernel=mamba_ssm but its kernel cannot be loaded: {error}")
    return device


def check_logger(config) -> None:
    """The logger's package is installed (tensorboard and wandb are optional dependencies)."""
    logger = config.trainer.logger
    if logger not in LOGGER_PACKAGES:
        return
    modules, install = LOGGER_PACKAGES[logger]
    if not any(importlib.util.find_spec(module) for module in modules):
        raise CheckFailed(f"trainer.logger={logger} needs the {install} package, which is not "
                          f"installed: pip install {install} (or use trainer.logger=csv)")


# the estimate check_memory made of a task and its config, which memory_summary shows rather
# than measuring the model's passes twice
_checked_estimates: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def check_memory(config, task, device: str) -> None:
    """Refuses a run whose estimate exceeds the free memory of a side (the GPU this rank trains
    on, the host), naming the largest part and the option that shrinks it."""
    estimate, free = estimate_and_free(config, task, device)
    _checked_estimates[task] = (config, estimate, free)
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
    try:
        return rank_task(config)
    except ValueError as error:
        raise CheckFailed(f"task {config.task_name}: "
                          f"{first_line(error) or type(error).__name__}") from None


def estimate_and_free(config, task, device: str):
    """The run's memory estimate (bench.training.memory) and the free memory of each side it is
    held to."""
    free = free_memory(device)
    return memory_estimate(config, task, device, budget=free.get("device", free["host"])), free


def memory_summary(config, task) -> dict:
    """check_memory's estimate of a run that passed it (its `task`: the one the checks built),
    per side and phase in GiB beside what the side has free, and the largest part of each: what
    `run print_config=true` shows."""
    checked, estimate, free = _checked_estimates.get(task, (None, None, None))
    if checked is not config:
        estimate, free = estimate_and_free(config, task, training_device(config))
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
    return config, checked_task_of(config)


def checked_task_of(config) -> object:
    """check_run of a composed config, a failure as a one-line ConfigError; the task it built.
    The CLI composes first (bench.config, no torch: a typo answers at once), then imports this
    module and checks."""
    try:
        return check_run(config)
    except CheckFailed as error:
        raise ConfigError(str(error)) from None


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
    resolved as the run resolves it (bench.training.checks.check_hardware,
    models.ssd.resolve_kernel)."""
    device = check_hardware(config)
    kernel = getattr(config.model, "kernel", None)
    name = torch.cuda.get_device_name(local_rank()) if device == "cuda" else "cpu"
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


def require_digest(path: str, command: str, what: str, written: str, otherwise: str) -> None:
    """path exists, is a regular file and its bytes match the digest beside it, checked before
    it is unpickled (a flipped byte in a tensor would load, and be trained on or scored,
    silently); ConfigError (one line) otherwise. A file without a digest (from before digests
    existed, or copied without it) is refused, naming the command that writes one for a file
    the user trusts."""
    if not os.path.lexists(path):
        raise ConfigError(f"{command}: no {what} file '{path}'")
    try:
        check_digest(path)
    except DamagedFile as error:
        if not os.path.isfile(path):  # a directory, a FIFO (which would block the read)
            raise ConfigError(f"{command}: no {what} file '{path}': it {error}") from None
        raise ConfigError(f"{command}: {what} '{path}' {error}; " + (
            f"{written} before digests existed have none: if you trust the file, write one "
            f"(sha256sum {path} > {digest_path(path)})" if error.missing else otherwise)
        ) from None


def check_resume(config: RunConfig) -> dict:
    """Validate `resume=<checkpoint>` before anything runs or is written: the file exists, is
    a regular file whose bytes match the digest written beside it (<file>.sha256, checked before
    it is unpickled; a checkpoint without one, e.g. from before digests existed, is refused,
    naming the command that writes one for a file the user trusts), this runner wrote it, and it
    was made with the same task and model (name and config). Returns the checkpoint's run
    metadata, with `resume_step` (the step the run goes on from); raises ConfigError (one line)
    otherwise."""
    path = config.resume
    require_digest(path, "resume", "checkpoint", "checkpoints written",
                   "resume from another checkpoint")
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
