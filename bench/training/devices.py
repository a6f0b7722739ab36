"""Where a run trains on this machine: the GPUs it sees, the processes that train together, the
device type, this process's rank on its node and the processes that sample its batches. What a
configuration means here, read by the checks, the memory estimate and the run alike."""
from __future__ import annotations

import os

import torch

from tasks import task_families


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


def local_rank() -> int:
    """This process's rank on its node, which Lightning's launcher puts in LOCAL_RANK (0 in the
    first process, before it launches the others): the index of the GPU it will train on."""
    try:
        return int(os.environ.get("LOCAL_RANK", 0))
    except ValueError:
        return 0


def rank_task(config):
    """The run's task as each rank builds it: trainer.batch_size is the global batch, and each of
    the world_size ranks samples its share (validated to divide evenly when the config was
    composed). Built once per run, by the checks (bench.training.checks.checked_task)."""
    task = task_families()[config.task_family](
        config.task, batch_size=config.trainer.batch_size // world_size(config), seed=config.seed)
    task.micro_batches = config.trainer.accumulate_grad_batches  # parts of a step's batch
    return task
