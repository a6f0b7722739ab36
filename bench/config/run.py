"""The typed configuration of a run: TrainerConfig (conf/trainer/*.yaml) and RunConfig, the
composed whole (bench.config.compose builds it)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

# The values TrainerConfig accepts (bench/training/checks.py checks what this machine can do with
# them).
ACCELERATORS = ("auto", "cpu", "gpu", "cuda")
STRATEGIES = ("auto", "ddp", "ddp_spawn", "ddp_find_unused_parameters_true")
PROCESS_GROUP_BACKENDS = ("auto", "nccl", "gloo")
PRECISIONS = ("32-true", "32", "bf16-mixed", "16-mixed", "64-true", "64")
LOGGERS = ("csv", "tensorboard", "wandb", "none")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass
class TrainerConfig:
    max_steps: int = 800
    batch_size: int = 32  # the global batch of an optimizer step (split over ranks, micro-batches)
    # micro-batches per optimizer step: each rank's share of the batch is split into this many,
    # run one after another and their gradients summed -- less memory, the same batch
    accumulate_grad_batches: int = 1
    lr: float = 3e-3
    min_lr_ratio: float = 0.1  # cosine decays from lr to lr * min_lr_ratio
    weight_decay: float = 1e-3
    adam_beta2: float = 0.95  # AdamW's β2 (β1 = 0.9); paper 004 B.1 trains with 0.999
    recurrent_lr_ratio: float = 1.0  # lr of the state-transition parameters (models tag them) / lr; paper 002 A.5: 0.5
    warmup_steps: int = 50
    grad_clip: float = 1.0  # 0 = no clipping
    accelerator: str = "auto"  # auto | cpu | gpu (= cuda)
    devices: int = 1  # -1: all visible devices
    num_nodes: int = 1
    strategy: str = "auto"  # auto | ddp | ddp_spawn | ddp_find_unused_parameters_true
    # DDP's collectives: auto = Lightning's (nccl on GPUs, gloo on CPUs); gloo also runs over
    # CUDA tensors, e.g. several processes sharing one GPU (python -m bench gpucheck)
    process_group_backend: str = "auto"  # auto | nccl | gloo
    precision: str = "32-true"  # 32-true | bf16-mixed | 16-mixed (CUDA) | 64-true
    tf32: bool = False  # CUDA: float32 matmuls/convolutions/Triton dots on TF32 tensor cores
    compile: bool = False  # torch.compile the model for training (evaluation runs eager)
    # torch.compile's mode: default | reduce-overhead (CUDA graphs on a GPU) | max-autotune |
    # max-autotune-no-cudagraphs
    compile_mode: str = "default"
    fused_adamw: bool = False  # AdamW's update as one fused kernel (not bit-identical to the loop)
    eval_sequences: int = 512
    eval_batch_size: int = 128
    bootstrap: int = 2000  # bootstrap resamples for the confidence interval
    reference_cache: bool = True  # held-out set + reference scores once per task config, in out_dir/cache
    log_every: int = 10
    # optimizer steps between validations of the headline (Bayes gap; text: nats/token) on a
    # fixed sample of val_sequences held-out sequences, logged as val/*; 0 = none (README "Training logs")
    val_every: int = 0
    val_sequences: int = 64
    checkpoint_every: int = 0  # steps between checkpoints; 0 = none
    progress: bool = True
    threads: int = 0  # CPU threads for torch; 0 = torch's default (one per core). See README "Threads"
    logger: str = "csv"  # csv | tensorboard | wandb | none: training log in out_dir/logs/<run>/
    loader_workers: int = -1  # processes sampling training batches; -1: up to 4 on a GPU, 0 on CPU
    save_weights: bool = True  # final weights to out_dir/weights/<run_id>.pt (python -m bench eval)

    def __post_init__(self):
        at_least = {"max_steps": 1, "batch_size": 1, "accumulate_grad_batches": 1,
                    "eval_sequences": 2, "eval_batch_size": 1,
                    "bootstrap": 1, "log_every": 1, "val_every": 0, "val_sequences": 1,
                    "num_nodes": 1, "warmup_steps": 0,
                    "checkpoint_every": 0, "threads": 0, "loader_workers": -1}
        for name, low in at_least.items():
            if getattr(self, name) < low:
                raise ValueError(f"trainer.{name} must be >= {low}, got {getattr(self, name)}")
        if self.compile_mode not in COMPILE_MODES:
            raise ValueError(f"trainer.compile_mode must be one of {', '.join(COMPILE_MODES)}, got "
                             f"'{self.compile_mode}'")
        if self.compile_mode != "default" and not self.compile:
            raise ValueError(f"trainer.compile_mode={self.compile_mode} needs trainer.compile=true")
        if not self.lr > 0:
            raise ValueError(f"trainer.lr must be > 0, got {self.lr}")
        if not 0 < self.adam_beta2 < 1:
            raise ValueError(f"trainer.adam_beta2 must be in (0, 1), got {self.adam_beta2}")
        if not self.recurrent_lr_ratio > 0:
            raise ValueError(f"trainer.recurrent_lr_ratio must be > 0, got "
                             f"{self.recurrent_lr_ratio}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"trainer.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.weight_decay < 0 or self.grad_clip < 0:
            raise ValueError(f"trainer.weight_decay and trainer.grad_clip must be >= 0, got "
                             f"{self.weight_decay}, {self.grad_clip}")
        if self.devices == 0 or self.devices < -1:
            raise ValueError(f"trainer.devices must be >= 1, or -1 for all, got {self.devices}")
        for name, allowed in (("accelerator", ACCELERATORS), ("strategy", STRATEGIES),
                              ("process_group_backend", PROCESS_GROUP_BACKENDS),
                              ("precision", PRECISIONS), ("logger", LOGGERS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"trainer.{name} must be one of {', '.join(allowed)}, got "
                                 f"'{getattr(self, name)}'")


@dataclass
class RunConfig:
    task_name: str
    task_family: str
    task: Any
    model_name: str
    model_family: str
    model: Any
    trainer_name: str
    trainer: TrainerConfig
    seed: int = 0
    out_dir: str = "runs"  # conf/config.yaml's; suites too (out_dir=results publishes)
    name: str = ""
    resume: str = ""
    overrides: list[str] = field(default_factory=list)
    # "adhoc" (python -m bench run), "sweep" (python -m bench sweep), "suite:<name>" or "eval"
    # (python -m bench eval of saved weights)
    origin: str = "adhoc"

    def describe(self) -> dict:
        return {
            "task": {"name": self.task_name, "family": self.task_family,
                     "config": dataclasses.asdict(self.task)},
            "model": {"name": self.model_name, "family": self.model_family,
                      "config": dataclasses.asdict(self.model)},
            "trainer": {"name": self.trainer_name, "config": dataclasses.asdict(self.trainer)},
            "seed": self.seed, "name": self.name, "overrides": list(self.overrides),
            "origin": self.origin,
        }
