"""Lightning glue: the training step for any (model, task) pair, and one whole run.

A run that has started ends in exactly one of two ways: an `ok` record, or a `failed` record
(written by rank 0) and `RunFailed`. A non-finite training loss stops it at that step; SIGINT
and SIGTERM stop it at the next training batch (a second signal at once); any other exception
stops it where it happened. Nothing is written before a resume checkpoint has been validated."""
from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import threading
import time
import warnings

import lightning as L
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch import Tensor

from bench.config import ConfigError, RunConfig, TrainerConfig
from bench.evaluate import evaluate
from bench.records import SCHEMA, RunFailed, new_run_id, provenance, write_record
from models import build_model
from models.backbone import Backbone, IOSpec
from tasks import task_families
from tasks.base import Batch, Task

CHECKPOINT_FORMAT = "icl-bench/checkpoint/1"  # marks checkpoints this runner wrote
CHECKPOINT_KEY = "icl_bench"  # where the run's metadata sits in the Lightning checkpoint


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


class Diverged(FloatingPointError):
    """The training loss is not finite: every further step would only train on NaN."""

    def __init__(self, step: int, loss: float | None):
        where = f"loss {loss}" if loss is not None else "on another rank"
        super().__init__(f"diverged at step {step}: {where}")


class Interrupted(Exception):
    """SIGINT or SIGTERM asked the run to stop (an Exception, unlike KeyboardInterrupt and
    Lightning's SIGTERMException, so that Lightning tears down normally and re-raises it)."""

    def __init__(self, signum: int | None):
        self.signum = signum
        super().__init__(f"interrupted ({signal_name(signum)})")


def signal_name(signum: int | None) -> str:
    return signal.Signals(signum).name if signum is not None else "on another rank"


class SignalGuard:
    """SIGINT and SIGTERM handlers for the duration of a run; the previous ones come back on exit.

    What a signal does depends on the phase (`mode`):
    - "flag" (training): only note it; the training step raises Interrupted at the next batch,
      so that no checkpoint or optimizer step is cut in half;
    - "raise" (building, evaluating: nothing is being written): raise Interrupted at once;
    - "defer" (writing the record): only note it, so the record is never half-written.
    A second signal while training raises at once, in case a step takes very long.
    Signal handlers can only be set in the main thread; elsewhere the guard does nothing, and
    an ignored signal stays ignored."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.signum: int | None = None
        self.mode = "raise"
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "SignalGuard":
        if threading.current_thread() is threading.main_thread():
            for signum in self.SIGNALS:
                # An ignored signal stays ignored (e.g. SIGINT of a shell's background job).
                if signal.getsignal(signum) is not signal.SIG_IGN:
                    self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        installed, self._previous = bool(self._previous), {}
        if installed and exc_type is None and self.signum is not None:
            # Noted while the record was written and the run ended well: hand the signal on to
            # the previous handler (e.g. a suite's Ctrl-C), instead of swallowing it.
            signal.raise_signal(self.signum)

    def __getstate__(self) -> dict:
        # Pickled with the module (ddp_spawn): handlers belong to the process that set them.
        return {"signum": None, "mode": "flag", "_previous": {}}

    def _handle(self, signum: int, frame) -> None:
        repeated = self.signum is not None
        if not repeated:
            self.signum = signum
        if self.mode == "raise" or (self.mode == "flag" and repeated):
            raise Interrupted(self.signum)

    @contextlib.contextmanager
    def phase(self, mode: str):
        previous, self.mode = self.mode, mode
        try:
            self.check()  # a signal that came in the previous phase
            yield
        finally:
            self.mode = previous

    def check(self) -> None:
        if self.signum is not None and self.mode != "defer":
            raise Interrupted(self.signum)


class ICLModule(L.LightningModule):
    """Trains a Backbone on fresh batches of a task (sampled on the device by the task).

    `run_info` (run_id and the task/model/trainer description) goes into every checkpoint with
    the loss curve and the training time so far, so a resumed run can report the whole run."""

    def __init__(self, model: Backbone, task: Task, config: TrainerConfig,
                 run_info: dict | None = None, signals: SignalGuard | None = None,
                 clock_start: float | None = None):
        super().__init__()
        self.model, self.task, self.config = model, task, config
        self.run_info = run_info or {}
        self.signals = signals
        self.clock_start = time.perf_counter() if clock_start is None else clock_start
        self.loss_curve: list[tuple[int, float]] = []
        self.prior_train_time = 0.0  # training seconds of the run(s) this one resumes
        self.resumed: dict | None = None  # the checkpoint's metadata, when resumed

    def train_time(self) -> float:
        return self.prior_train_time + time.perf_counter() - self.clock_start

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        loss = masked_loss(self.task, self.model(batch.inputs), batch)
        self._stop_if_asked(loss)
        self.log("loss", loss, prog_bar=True)
        if self.global_step % self.config.log_every == 0:
            self.loss_curve.append((int(self.global_step), float(loss.detach())))
        return loss

    def _stop_if_asked(self, loss: Tensor) -> None:
        """Raise before the backward pass if the loss is not finite or a signal came. Under DDP
        the ranks decide together: a rank that stopped alone would leave the others waiting in
        the gradient all-reduce."""
        diverged = not bool(torch.isfinite(loss.detach()))
        signalled = self.signals is not None and self.signals.signum is not None
        any_diverged, any_signalled = diverged, signalled
        if self.trainer.world_size > 1:
            flags = torch.tensor([float(diverged), float(signalled)], device=loss.device)
            flags = self.trainer.strategy.reduce(flags, reduce_op="sum")
            any_diverged, any_signalled = bool(flags[0] > 0), bool(flags[1] > 0)
        step = int(self.global_step)
        if any_diverged:
            value = float(loss.detach()) if diverged else None
            if diverged:
                self.loss_curve.append((step, value))  # the record shows what stopped it
            raise Diverged(step, value)
        if any_signalled:
            raise Interrupted(self.signals.signum if signalled else None)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint[CHECKPOINT_KEY] = {
            "format": CHECKPOINT_FORMAT, **self.run_info,
            "loss_curve": [list(point) for point in self.loss_curve],
            "train_wall_time_s": self.train_time()}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        meta = checkpoint.get(CHECKPOINT_KEY)
        if meta is None:  # run() validated the file; this is a checkpoint loaded by hand
            return
        # Steps from the checkpoint on are trained again by this run: keep only earlier ones.
        resume_step = int(checkpoint.get("global_step", 0))
        self.loss_curve = [(int(s), float(v)) for s, v in meta["loss_curve"] if s < resume_step]
        self.prior_train_time = float(meta["train_wall_time_s"])
        self.resumed = meta

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
                    ".*Total length of `DataLoader`.*", ".*IterableDataset.*",
                    # a resumed run needs the weights, optimizer and loop state, not the state
                    # of the ModelCheckpoint callback that wrote the file
                    ".*callbacks used to create the checkpoint need to be provided.*"):
        warnings.filterwarnings("ignore", message=pattern)
    import logging
    for name in ("lightning.pytorch", "lightning.fabric", "pytorch_lightning"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _first_line(error: BaseException) -> str:
    text = str(error)
    return text.splitlines()[0] if text.strip() else ""


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


def check_resume(config: RunConfig) -> dict:
    """Validate `resume=<checkpoint>` before anything runs or is written: the file exists and is
    readable, this runner wrote it, and it was made with the same task and model (name and
    config). Returns the checkpoint's run metadata; raises ConfigError (one line) otherwise."""
    path = config.resume
    if not os.path.isfile(path):
        raise ConfigError(f"resume: no checkpoint file '{path}'")
    try:
        # weights_only=False: Lightning checkpoints hold more than tensors (loop states, our
        # metadata); only load checkpoints you trust, as with any pickle.
        checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:  # unreadable, truncated, not a torch file: all one line
        raise ConfigError(f"resume: cannot read checkpoint '{path}': {type(error).__name__}: "
                          f"{_first_line(error)}") from None
    meta = checkpoint.get(CHECKPOINT_KEY) if isinstance(checkpoint, dict) else None
    if not isinstance(meta, dict) or meta.get("format") != CHECKPOINT_FORMAT:
        raise ConfigError(f"resume: '{path}' is not a checkpoint written by this runner "
                          f"(no '{CHECKPOINT_KEY}' metadata of format {CHECKPOINT_FORMAT})")
    described = config.describe()
    for group in ("task", "model"):
        diffs = _differences(meta.get(group), described[group], group)
        if diffs:
            more = f" (and {len(diffs) - 2} more)" if len(diffs) > 2 else ""
            raise ConfigError(f"resume: '{path}' was made with a different {group}: "
                              f"{'; '.join(diffs[:2])}{more}")
    return meta


def _global_zero(trainer: L.Trainer | None) -> bool:
    if trainer is not None:
        return trainer.is_global_zero
    # Before the Trainer exists: Lightning's launcher has put the rank in the environment.
    from lightning.pytorch.utilities.rank_zero import rank_zero_only
    return getattr(rank_zero_only, "rank", 0) == 0


def _failure(error: BaseException, signals: SignalGuard, step: int) -> tuple[str, int]:
    """The record's reason and the process's exit status for an exception that ended a run."""
    if isinstance(error, Diverged):
        return str(error), 1
    signum = error.signum if isinstance(error, Interrupted) else signals.signum
    if signum is None and isinstance(error, KeyboardInterrupt):
        signum = signal.SIGINT  # no handler of ours (run() was called outside the main thread)
    if signum is None and isinstance(error, SIGTERMException):
        signum = signal.SIGTERM
    if signum is not None or isinstance(error, Interrupted):
        return (f"interrupted ({signal_name(signum)}) at step {step}",
                128 + signum if signum is not None else 1)
    return f"{type(error).__name__}: {_first_line(error)}".rstrip(": "), 1


def run(config: RunConfig) -> tuple[dict, str]:
    """Train, evaluate on the held-out set, write the record. Returns (record, path); path is
    "" on ranks other than 0. A run that fails after it started writes a `failed` record (rank
    0) and raises RunFailed; a bad resume checkpoint raises ConfigError before anything runs."""
    quiet_lightning()
    resumed = check_resume(config) if config.resume else None
    run_id = new_run_id(config.task_name, config.model_name, config.seed)
    described = config.describe()
    record: dict = {"schema": SCHEMA, "run_id": run_id, **described,
                    "provenance": provenance(), "status": "running"}
    if resumed is not None:
        record["resumed_from"] = os.path.abspath(config.resume)
        record["resumed_run_id"] = resumed.get("run_id")
    run_info = {"run_id": run_id, **{k: described[k] for k in ("task", "model", "trainer", "seed")}}
    start = time.perf_counter()
    trainer = module = model = None
    with SignalGuard() as signals:
        try:
            task, model = build(config)
            record["params"] = model.num_parameters()
            record["state_size"] = model.state_size(task.seq_len)
            module = ICLModule(model, task, config.trainer, run_info, signals, start)
            trainer = make_trainer(config, run_id)
            with signals.phase("flag"):
                trainer.fit(module, datamodule=task, ckpt_path=config.resume or None)
            record["train"] = _train_summary(trainer, module, model)
            if not trainer.is_global_zero:  # evaluation and the record belong to rank 0
                return record, ""
            signals.check()  # a signal after the last training step
            eval_start = time.perf_counter()
            result = evaluate(task, model, config.trainer.eval_sequences,
                              config.trainer.eval_batch_size, config.trainer.bootstrap)
            record.update(result)
            # The held-out predictions come from the weights as they are, without autocast:
            # float32 master weights after bf16-mixed or 16-mixed training.
            record["eval_dtype"] = str(next(model.parameters()).dtype).removeprefix("torch.")
            record["eval_time_s"] = time.perf_counter() - eval_start
            record["status"] = "ok"
            record["wall_time_s"] = module.prior_train_time + time.perf_counter() - start
            signals.mode = "defer"  # the record is written whole; a signal now waits for it
            return record, str(write_record(config.out_dir, record))
        except BaseException as error:
            # Everything after the run started, SystemExit and KeyboardInterrupt included
            # (Lightning turns Ctrl-C into sys.exit(1), SIGTERM into a SystemExit subclass),
            # ends here: one failed record, then RunFailed.
            signals.mode = "defer"  # from here on a signal must not cut the record in half
            step = int(trainer.global_step) if trainer is not None else 0
            reason, exit_code = _failure(error, signals, step)
            record["status"], record["reason"] = "failed", reason
            prior = module.prior_train_time if module is not None else 0.0
            record["wall_time_s"] = prior + time.perf_counter() - start
            if module is not None and "train" not in record:
                record["train"] = _train_summary(trainer, module, model)
            path = None
            if _global_zero(trainer):
                try:
                    path = str(write_record(config.out_dir, record))
                except Exception as write_error:
                    reason += (f"; its failed record could not be written: "
                               f"{type(write_error).__name__}: {_first_line(write_error)}")
            raise RunFailed(reason, path, exit_code) from error


def _train_summary(trainer: L.Trainer | None, module: ICLModule, model: Backbone) -> dict:
    """The training part of the record, the resumed part of the run included."""
    return {"steps": int(trainer.global_step) if trainer is not None else 0,
            "wall_time_s": module.train_time(),
            "device": str(next(model.parameters()).device),
            "world_size": trainer.world_size if trainer is not None else None,
            "precision": str(trainer.precision) if trainer is not None else None,
            "loss_curve": [list(point) for point in module.loss_curve]}
