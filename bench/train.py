"""Lightning glue: the training step for any (model, task) pair, and one whole run."""
from __future__ import annotations

import math
import os
import sys
import time
import warnings

import lightning as L
import torch
from torch import Tensor

from bench.config import RunConfig, TrainerConfig
from bench.evaluate import evaluate
from bench.records import SCHEMA, new_run_id, provenance, write_record
from models import build_model
from models.backbone import Backbone, IOSpec
from tasks import task_families
from tasks.base import Batch, Task


def masked_loss(task: Task, output: Tensor, batch: Batch) -> Tensor:
    """Mean training loss over the scored positions: cross-entropy of logits, or squared error."""
    mask = batch.loss_mask
    if task.kind == "tokens":
        return torch.nn.functional.cross_entropy(output[mask].float(), batch.targets[mask])
    return (output[mask].float() - batch.targets[mask]).pow(2).mean()


def cosine_with_warmup(step: int, warmup: int, total: int, floor: float) -> float:
    """Learning-rate multiplier: linear warm-up, then cosine from 1 down to `floor`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


class ICLModule(L.LightningModule):
    """Trains a Backbone on fresh batches of a task (sampled on the device by the task)."""

    def __init__(self, model: Backbone, task: Task, config: TrainerConfig):
        super().__init__()
        self.model, self.task, self.config = model, task, config
        self.loss_curve: list[tuple[int, float]] = []

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        loss = masked_loss(self.task, self.model(batch.inputs), batch)
        self.log("loss", loss, prog_bar=True)
        if self.global_step % self.config.log_every == 0:
            self.loss_curve.append((int(self.global_step), float(loss.detach())))
        return loss

    def configure_optimizers(self):
        # Decay matrices only: norms, biases, gains and SSM scalars (A_log, D, dt_bias) are not
        # weights whose size should shrink.
        params = [p for p in self.model.parameters() if p.requires_grad]
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": self.config.weight_decay},
             {"params": no_decay, "weight_decay": 0.0}],
            lr=self.config.lr, betas=(0.9, 0.95))
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: cosine_with_warmup(
            step, self.config.warmup_steps, self.config.max_steps, self.config.min_lr_ratio))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def build(config: RunConfig) -> tuple[Task, Backbone]:
    if config.trainer.threads > 0:
        torch.set_num_threads(config.trainer.threads)
    task = task_families()[config.task_family](config.task, batch_size=config.trainer.batch_size,
                                               seed=config.seed)
    io = IOSpec(task.kind, task.input_dim, task.output_dim, task.seq_len)
    torch.manual_seed(config.seed)  # parameter initialisation
    return task, build_model(config.model_family, config.model, io)


def make_trainer(config: RunConfig, run_id: str) -> L.Trainer:
    t = config.trainer
    # A terminal redraws the bar in place; a log file gets a line per refresh, so refresh less.
    callbacks: list = [L.pytorch.callbacks.TQDMProgressBar(
        refresh_rate=1 if sys.stdout.isatty() else max(1, t.max_steps // 20))] if t.progress else []
    if t.checkpoint_every > 0:
        callbacks.append(L.pytorch.callbacks.ModelCheckpoint(
            dirpath=os.path.join(config.out_dir, "checkpoints", run_id), save_last=True,
            every_n_train_steps=t.checkpoint_every, save_top_k=-1))
    return L.Trainer(max_steps=t.max_steps, accelerator=t.accelerator, devices=t.devices,
                     num_nodes=t.num_nodes, strategy=t.strategy, precision=t.precision,
                     gradient_clip_val=t.grad_clip or None, logger=False,
                     enable_checkpointing=t.checkpoint_every > 0, callbacks=callbacks,
                     enable_progress_bar=t.progress, enable_model_summary=False,
                     num_sanity_val_steps=0, limit_val_batches=0, log_every_n_steps=t.log_every,
                     use_distributed_sampler=False, deterministic=False)


def quiet_lightning() -> None:
    """Silence advice that does not apply here: the data loader yields step numbers only."""
    for pattern in (".*does not have many workers.*", ".*GPU available but not used.*",
                    ".*`isinstance\\(treespec, LeafSpec\\)`.*", ".*LeafSpec.*",
                    ".*Total length of `DataLoader`.*", ".*IterableDataset.*"):
        warnings.filterwarnings("ignore", message=pattern)
    import logging
    for name in ("lightning.pytorch", "lightning.fabric", "pytorch_lightning"):
        logging.getLogger(name).setLevel(logging.WARNING)


def run(config: RunConfig) -> tuple[dict, str]:
    """Train, evaluate on the held-out set, write the record. Returns (record, path)."""
    quiet_lightning()
    run_id = new_run_id(config.task_name, config.model_name, config.seed)
    record: dict = {"schema": SCHEMA, "run_id": run_id, **config.describe(),
                    "provenance": provenance(), "status": "running"}
    start = time.perf_counter()
    try:
        task, model = build(config)
        record["params"] = model.num_parameters()
        record["state_size"] = model.state_size(task.seq_len)
        module = ICLModule(model, task, config.trainer)
        trainer = make_trainer(config, run_id)
        trainer.fit(module, datamodule=task, ckpt_path=config.resume or None)
        train_time = time.perf_counter() - start
        record["train"] = {"steps": int(trainer.global_step), "wall_time_s": train_time,
                           "device": str(next(model.parameters()).device),
                           "world_size": trainer.world_size, "loss_curve": module.loss_curve}
        if not trainer.is_global_zero:  # evaluation and the record belong to rank 0
            return record, ""
        result = evaluate(task, model, config.trainer.eval_sequences,
                          config.trainer.eval_batch_size, config.trainer.bootstrap)
        record.update(result)
        record["eval_time_s"] = time.perf_counter() - start - train_time
        record["status"] = "ok"
    except (KeyboardInterrupt, Exception) as error:
        record["status"] = "failed"
        record["reason"] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        record["wall_time_s"] = time.perf_counter() - start
        write_record(config.out_dir, record)
        raise
    record["wall_time_s"] = time.perf_counter() - start
    return record, str(write_record(config.out_dir, record))
