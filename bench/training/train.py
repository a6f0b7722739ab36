"""One whole run: the task and model built (build), the Trainer (make_trainer), training,
evaluation on the held-out set and the record (run). The training step is bench.training.module's.

A run that has started ends in exactly one of two ways: an `ok` record, or a `failed` record
(written by rank 0) and `RunFailed`. A non-finite training loss stops it at that step; SIGINT
and SIGTERM stop it at the next training batch (a second signal at once); any other exception
stops it where it happened. Nothing is written before a resume checkpoint has been validated."""
from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import sys
import time
import warnings
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.plugins import TorchCheckpointIO
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from bench.config import RunConfig, first_line
from bench.records.store import (SCHEMA, RunFailed, code_of_this_process, new_run_id, thread_wait,
                                 write_record)
from bench.training import reference_cache
from bench.training.checks import check_resume, planned_environment
from bench.training.datamodule import TaskData
from bench.training.devices import (loader_workers, local_rank, rank_task, training_device,
                                    world_size)
from bench.training.evaluate import probe_summary, score_predictions
from bench.training.module import ICLModule
from bench.training.runlog import RunLog, hyperparameters, make_logger, run_log_dir
from bench.training.signals import (Diverged, Interrupted, KeepSignalHandlers, SignalGuard,
                                    leave_run_together, signal_name)
from bench.training.validation import LiveValidation
from bench.training.weights import check_weights_fit, save_weights
from models import build_model
from models.backbone import Backbone, IOSpec
from models.mamba import Mamba2Mixer, resolve_scan_kernels
from models.ssd import kernel_fallback, resolve_kernel
from tasks import task_families
from tasks.base import Task
from tasks.files import DIGEST_SUFFIX, DamagedFile, check_digest, write_with_digest


class ReferenceNotFinite(ArithmeticError):
    """The gap reference's loss on the held-out set is not a number: so is every gap."""


def check_references(metrics: dict) -> None:
    """References whose held-out loss is not finite (a task configured beyond what they can
    compute: linreg inputs scaled by 1e30 gave gd5 NaN in an `ok` record, unflagged) are named
    in metrics.nonfinite_references and a warning; when the gap reference is one of them the run
    fails, as its gap would be undefined."""
    losses = metrics.get("loss") or {}
    broken = [name for name in metrics.get("roles") or {}
              if not isinstance(losses.get(name), (int, float)) or not math.isfinite(losses[name])]
    if not broken:
        return
    reference = metrics.get("gap_reference")
    if reference in broken:
        raise ReferenceNotFinite(f"the loss of the gap reference {reference} on the held-out set "
                                 "is not finite; the task's settings are beyond what it computes")
    metrics["nonfinite_references"] = broken
    print(f"warning: the held-out loss of {', '.join(broken)} is not finite (the task's settings "
          "are beyond what they compute); named in metrics.nonfinite_references", file=sys.stderr)


def build(config: RunConfig, task: Task | None = None) -> tuple[Task, Backbone]:
    """The run's task and model; `task`: the one the checks built
    (bench.training.checks.checked_run), else it is built here, as they build it."""
    if config.trainer.threads > 0:
        torch.set_num_threads(config.trainer.threads)
    if task is None:
        task = rank_task(config)
    task.progress = config.trainer.progress  # for tasks with long preparation (text: tokenizing)
    task.loader_workers = loader_workers(config)
    io = IOSpec(task.kind, task.input_dim, task.output_dim, task.seq_len)
    torch.manual_seed(config.seed)  # parameter initialisation
    model = build_model(config.model_family, config.model, io)
    if training_device(config) == "cuda":  # kernel=auto made concrete before any tracing
        dtype = torch.float64 if config.trainer.precision in ("64-true", "64") else torch.float32
        resolve_scan_kernels(model, torch.device("cuda", local_rank()), task.micro_batch_size,
                             task.seq_len, dtype)
    if config.trainer.compile:
        # in place: parameter names (checkpoints) stay those of the eager model
        mode = config.trainer.compile_mode
        model.compile(**({"mode": mode} if mode != "default" else {}))
    return task, model


class StderrProgressBar(L.pytorch.callbacks.TQDMProgressBar):
    """Lightning's bars on stderr, not stdout: `run ... > log.txt` keeps only the results. Each
    bar is Lightning's own, made while sys.stdout names stderr (Lightning passes file=sys.stdout
    when it makes one)."""

    def get_metrics(self, trainer, pl_module) -> dict:
        """The bar's numbers: Lightning's, and the training loss of the last logging step as
        ICLModule read it back there (a Python float: logging it through self.log would keep a
        device tensor that the bar reads back with .item() at every step)."""
        metrics = super().get_metrics(trainer, pl_module)
        loss = getattr(pl_module, "logged_loss", None)
        if loss is not None:
            metrics["loss"] = loss
        return metrics

    def init_sanity_tqdm(self):
        with contextlib.redirect_stdout(sys.stderr):
            return super().init_sanity_tqdm()

    def init_train_tqdm(self):
        with contextlib.redirect_stdout(sys.stderr):
            return super().init_train_tqdm()

    def init_validation_tqdm(self):
        with contextlib.redirect_stdout(sys.stderr):
            return super().init_validation_tqdm()

    def init_test_tqdm(self):
        with contextlib.redirect_stdout(sys.stderr):
            return super().init_test_tqdm()

    def init_predict_tqdm(self):
        with contextlib.redirect_stdout(sys.stderr):
            return super().init_predict_tqdm()


class DigestCheckpointIO(TorchCheckpointIO):
    """Lightning's torch checkpoints written whole (a temporary file, then a rename) with the
    sha256 of their bytes beside them (<file>.sha256: tasks.files.write_with_digest), and checked
    against it again when Lightning loads one: a byte that changed on disk would otherwise
    resume into an `ok` record. check_resume checks it before the run starts; this catches a
    file replaced since."""

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        if storage_options is not None:  # Lightning's own refusal (TypeError)
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)

        def write(temporary: str) -> None:
            with open(temporary, "wb") as file:  # a file object: the archive is named "archive",
                torch.save(checkpoint, file)      # not after the temporary file
        write_with_digest(path, write)

    def load_checkpoint(self, path, *args, **kwargs) -> dict:
        try:
            check_digest(path)
        except DamagedFile as error:
            raise DamagedFile(f"checkpoint {path} {error}", error.missing) from None
        return super().load_checkpoint(path, *args, **kwargs)

    def remove_checkpoint(self, path) -> None:
        super().remove_checkpoint(path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{path}{DIGEST_SUFFIX}")


def make_trainer(config: RunConfig, run_id: str, log_dir: str | None = None,
                 signals: SignalGuard | None = None, resume_step: int = 0) -> L.Trainer:
    """The Trainer of a run; its training log goes to out_dir/<log_dir> (default
    logs/<run_id>) unless trainer.logger=none, continued from `resume_step` when resumed;
    `signals`' handlers are kept over Lightning's."""
    t = config.trainer
    # A terminal redraws the bar in place; a log file gets a line per refresh, so refresh less.
    callbacks: list = [StderrProgressBar(
        refresh_rate=1 if sys.stderr.isatty() else max(1, t.max_steps // 20))] if t.progress else []
    if t.checkpoint_every > 0:
        callbacks.append(L.pytorch.callbacks.ModelCheckpoint(
            dirpath=os.path.join(config.out_dir, "checkpoints", run_id), save_last=True,
            every_n_train_steps=t.checkpoint_every, save_top_k=-1))
    if signals is not None:
        callbacks.append(KeepSignalHandlers(signals))
    log_dir = log_dir or run_log_dir(run_id)
    logger = make_logger(config, log_dir, resume_step)
    run_log = None
    if logger is not None:
        run_log = RunLog(logger, t.log_every, os.path.join(config.out_dir, log_dir),
                         hyperparameters(config.describe(), run_id))
        callbacks.append(run_log)
    if t.val_every > 0:  # before RunLog, whose on_train_end closes the log
        callbacks.insert(len(callbacks) - (run_log is not None), LiveValidation(t, run_log))
    # Inductor's CPU code adds the embedding's gradient with atomic adds across threads, so two
    # compiled runs of one seed differed by ~1e-9; deterministic algorithms make it fall back to
    # aten's index_put (no cost measured, docs/profile-cpu-step.md). Not on CUDA, where eager
    # ops such as cumsum have no deterministic kernel. run() puts the flag back when it ends.
    deterministic = t.compile and training_device(config) == "cpu"
    strategy = t.strategy
    if t.process_group_backend != "auto" and t.strategy.startswith("ddp"):
        strategy = L.pytorch.strategies.DDPStrategy(
            process_group_backend=t.process_group_backend,
            find_unused_parameters=t.strategy == "ddp_find_unused_parameters_true")
    return L.Trainer(max_steps=t.max_steps, accelerator=t.accelerator, devices=t.devices,
                     num_nodes=t.num_nodes, strategy=strategy, precision=t.precision,
                     accumulate_grad_batches=t.accumulate_grad_batches,
                     gradient_clip_val=t.grad_clip or None, logger=False,
                     enable_checkpointing=t.checkpoint_every > 0, callbacks=callbacks,
                     enable_progress_bar=t.progress, enable_model_summary=False,
                     num_sanity_val_steps=0, limit_val_batches=0, log_every_n_steps=t.log_every,
                     use_distributed_sampler=False, deterministic=deterministic,
                     plugins=[DigestCheckpointIO()])


def quiet_lightning() -> None:
    """Silence advice that does not apply here: the data loader yields step numbers only."""
    for pattern in (".*does not have many workers.*", ".*GPU available but not used.*",
                    ".*`isinstance\\(treespec, LeafSpec\\)`.*", ".*LeafSpec.*",
                    ".*Total length of `DataLoader`.*", ".*IterableDataset.*",
                    # a resumed run needs the weights, optimizer and loop state, not the state
                    # of the ModelCheckpoint callback that wrote the file
                    ".*callbacks used to create the checkpoint need to be provided.*",
                    # a resume into another out_dir: its checkpoints go to the new one, and the
                    # best-model bookkeeping the warning is about is not used here
                    ".*dirpath has changed.*"):
        warnings.filterwarnings("ignore", message=pattern)
    for name in ("lightning.pytorch", "lightning.fabric", "pytorch_lightning"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _global_zero(trainer: L.Trainer | None) -> bool:
    if trainer is not None:
        return trainer.is_global_zero
    # Before the Trainer exists: Lightning's launcher has put the rank in the environment.
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
    return f"{type(error).__name__}: {first_line(error)}".rstrip(": "), 1


def run(config: RunConfig, weights: dict | None = None, weights_path: str = "",
        task: Task | None = None, stop_signals: tuple = ()) -> tuple[dict, str]:
    """Train, evaluate on the held-out set, write the record. Returns (record, path); path is
    "" on ranks other than 0. A run that fails after it started writes a `failed` record (rank
    0) and raises RunFailed; a bad resume checkpoint raises ConfigError before anything runs.

    With `weights` (bench.training.weights.load_weights of `weights_path`) the model starts from
    them and is not trained: `python -m bench eval`. The record's `train` is the weights' run's,
    and it names the file (`evaluated_weights`, `weights_run_id`); weights that do not fit the model
    raise ConfigError before anything runs. A trained run saves its weights (trainer.save_weights)
    to out_dir/weights/<run_id>.pt just before its ok record, which names the file (`weights`).

    `task`: the one the checks built (bench.training.checks.checked_run), so that the run does not
    build it again; built here without it. `stop_signals`: signals that stop the run as SIGINT,
    SIGTERM and SIGHUP do (SignalGuard), such as a SLURM array task's preemption signal.

    A SystemExit that no signal of ours caused (another library's signal handler calling
    sys.exit mid-step, as submitit's requeue does) is recorded as failed and then raised as it
    was: the process was told to exit, and a suite must not carry on as if one run had failed."""
    quiet_lightning()
    t = config.trainer
    if weights is not None:
        check_weights_fit(config, weights, task)
    elif t.warmup_steps > t.max_steps and _global_zero(None):  # legal (a study of warm-up),
        # but rarely what is meant; said once, not once per rank of a DDP run
        print(f"warning: trainer.warmup_steps={t.warmup_steps} > trainer.max_steps="
              f"{t.max_steps}: the learning rate stays in its warm-up and never reaches "
              f"trainer.lr={t.lr}", file=sys.stderr)
    warn_unused_eval_size(config)
    resumed = check_resume(config) if config.resume else None
    run_id = new_run_id(config.task_name, config.model_name, config.seed,
                        evaluation=weights is not None)
    described = config.describe()
    record: dict = {"schema": SCHEMA, "run_id": run_id, **described,
                    "provenance": code_of_this_process(), "status": "running"}
    if resumed is not None:
        record["resumed_from"] = os.path.abspath(config.resume)
        record["resumed_run_id"] = resumed.get("run_id")
    if weights is not None:
        record["evaluated_weights"] = os.path.abspath(weights_path) if weights_path else None
        record["weights_run_id"] = weights.get("run_id")
    record["weights"] = None  # the saved weights' path relative to out_dir, once written
    log_dir = run_log_dir(run_id, resumed)  # relative to out_dir
    record["log_dir"] = log_dir if config.trainer.logger != "none" else None
    run_info = {"run_id": run_id, **{k: described[k] for k in ("task", "model", "trainer", "seed")},
                "log_dir": log_dir, "environment": planned_environment(config)._asdict(),
                "code": record["provenance"]["code"]}
    start = time.perf_counter()
    # a suite's later entries run in the same process: its age says nothing of their start-up
    before_run = process_age_s() if not _RUNS_STARTED else None
    _RUNS_STARTED.append(run_id)
    trainer = module = model = None
    path, failure = "", None
    with SignalGuard(stop_signals) as signals, deterministic_flag_restored():
        signals.distributed = world_size(config) > 1
        try:
            apply_tf32_policy(config.trainer.tf32)
            task, model = build(config, task)
            record["params"] = model.num_parameters()
            record["state_size"] = model.state_size(task.seq_len)
            if weights is not None:  # an evaluation: the model as trained by the weights' run
                model.load_state_dict(weights["state_dict"])
                record["train"] = weights.get("train")
            module = ICLModule(model, task, config.trainer, run_info, signals, start)
            trainer = make_trainer(config, run_id, log_dir, signals,
                                   resumed["resume_step"] if resumed else 0)
            if weights is None:
                with signals.phase("flag"):
                    trainer.fit(module, datamodule=TaskData(task), ckpt_path=config.resume or None)
                record["train"] = _train_summary(trainer, module, model)
            clock = [time.perf_counter()]

            def lap() -> float:
                clock.append(time.perf_counter())
                return clock[-1] - clock[-2]

            held_out, references = reference_cache.held_out_set(config, task)
            times = {"held_out": lap()}
            # Under DDP the ranks agree on a signal at the end of evaluation (ICLModule);
            # alone, a signal stops it at once (a signal after the last step included).
            # eager even when trainer.compile: one pass over the held-out set would pay a
            # recompile for the evaluation batches (20 s for the default model on the CPU,
            # against 0.7 s for the whole eager evaluation)
            with signals.phase("flag" if signals.distributed else "raise"), \
                    torch.compiler.set_stance("force_eager"):
                trainer.test(module, datamodule=TaskData(task), verbose=False)
            times["model"] = lap()
            if trainer.is_global_zero:  # the record belongs to rank 0
                cached = references is not None
                references = reference_cache.complete(config, task, held_out, references)
                times["references"] = lap()
                record.update(score_predictions(
                    task, held_out, getattr(module, "test_predictions", None),
                    config.trainer.bootstrap, references, getattr(module, "test_scores", None)))
                times["scoring"] = lap()
                check_references(record["metrics"])
                probe = probe_summary(task, model, held_out, config.trainer.eval_batch_size)
                if probe is not None:
                    record["metrics"]["probe"] = probe
                    times["probe"] = lap()
                run_log = next((c for c in trainer.callbacks if isinstance(c, RunLog)), None)
                if run_log is not None and weights is None:  # the trained run's log
                    run_log.log_final(record["metrics"], int(trainer.global_step))
                # predicted under the training precision (autocast for *-mixed), as trained
                record["eval"] = {"device": module.eval_device, "world_size": trainer.world_size,
                                  "precision": str(trainer.precision),
                                  "compile": False,  # eager (above)
                                  "kernel": scan_kernels(model, module.eval_device),
                                  "dtype": module.eval_dtype, "references_cached": cached,
                                  "time_s": times}
                record["eval_time_s"] = clock[-1] - clock[0]
                record["startup_s"] = startup_times(module, start, before_run)
                record["status"] = "ok"
                record["wall_time_s"] = module.prior_train_time + time.perf_counter() - start
                signals.mode = "defer"  # the record is written whole; a signal now waits for it
                if weights is None and config.trainer.save_weights:
                    record["weights"] = save_weights(config.out_dir, record, model)
                path = str(write_record(config.out_dir, record))
                signals.completed = path  # a signal noted meanwhile must not say otherwise
            signals.mode = "defer"  # the other ranks: waiting for rank 0, a signal is noted
        except BaseException as error:
            # Everything after the run started, SystemExit and KeyboardInterrupt included
            # (Lightning turns Ctrl-C into sys.exit(1), SIGTERM into a SystemExit subclass),
            # ends here: one failed record, then RunFailed.
            signals.mode = "defer"  # from here on a signal must not cut the record in half
            step = int(trainer.global_step) if trainer is not None else 0
            reason, exit_code = _failure(error, signals, step)
            record["status"], record["reason"] = "failed", reason
            # the per-position and per-sequence losses are for boards and comparisons of ok
            # runs: without them a failed record is smaller than the ok one it replaces (which
            # a full disk could not take)
            for bulky in ("per_position", "per_position_stderr", "per_sequence"):
                record.pop(bulky, None)
            prior = module.prior_train_time if module is not None else 0.0
            record["wall_time_s"] = prior + time.perf_counter() - start
            if module is not None and "train" not in record and weights is None:
                record["train"] = _train_summary(trainer, module, model)
            if _global_zero(trainer):
                try:
                    path = str(write_record(config.out_dir, record))
                except Exception as write_error:
                    reason += (f"; its failed record could not be written: "
                               f"{type(write_error).__name__}: {first_line(write_error)}")
            failure = RunFailed(reason, path or None, exit_code)
            failure.__cause__ = error
        if trainer is not None and trainer.world_size > 1 and torch.distributed.is_initialized():
            failure = leave_run_together(trainer, signals, failure, path)
        if failure is not None:
            cause = failure.__cause__
            if (isinstance(cause, SystemExit) and not isinstance(cause, SIGTERMException)
                    and signals.signum is None):
                raise cause  # the process was told to exit (see the docstring)
            raise failure
        return record, path


@contextlib.contextmanager
def deterministic_flag_restored():
    """torch's deterministic-algorithms flag as it was before: Lightning sets it, process-wide,
    for each Trainer (make_trainer: on for a compiled CPU run), and what runs after the run in
    the same process (a test, `bench speed`'s other rows) must not inherit it."""
    before = (torch.are_deterministic_algorithms_enabled(),
              torch.is_deterministic_algorithms_warn_only_enabled())
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def warn_unused_eval_size(config: RunConfig) -> None:
    """A trainer.eval_sequences given to a task whose data sizes its held-out set (text: the
    evaluation split in windows, task.eval_windows caps them) is said to do nothing, once (rank
    0): the user asked for a number of sequences the record will not have."""
    option = task_families()[config.task_family].eval_size_option
    given = any(o.split("=", 1)[0].lstrip("+") == "trainer.eval_sequences"
                for o in config.overrides)
    if given and option != "trainer.eval_sequences" and _global_zero(None):
        print(f"warning: trainer.eval_sequences does not size the held-out set of a "
              f"{config.task_family} task (its evaluation split does; {option} caps it); the "
              "record's metrics.sequences says how many it scored", file=sys.stderr)


def apply_tf32_policy(enabled: bool) -> None:
    """Whether float32 matrix products and convolutions on CUDA may use TF32 tensor cores (10
    mantissa bits): torch's matmuls, cuDNN's convolutions and LSTMs, and Triton's float32 dot
    products (the mamba_ssm kernel; TRITON_F32_DEFAULT is read when a kernel is compiled, and is
    part of Triton's cache key, so a process keeps the policy of its first compiled kernel).
    Off by default (trainer.tf32=false): 32-true then means IEEE float32. Recorded as
    train.tf32."""
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
    os.environ["TRITON_F32_DEFAULT"] = "tf32" if enabled else "ieee"


def scan_kernels(model: Backbone, device: str) -> str | None:
    """The SSD scan implementation(s) the model's Mamba mixers ran on `device` (torch, sequential,
    mamba_ssm), "+"-joined if they differ; None for models without one."""
    used = sorted({resolve_kernel(module.scan_kernel(device), torch.device(device))
                   for module in model.modules() if isinstance(module, Mamba2Mixer)})
    return "+".join(used) or None


def device_name(device: str) -> str:
    """"cpu", or the CUDA device's name (e.g. "NVIDIA H100 80GB HBM3"): part of what a record
    says about where it ran, and of its identity when records are pooled."""
    device = torch.device(device)
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


_RUNS_STARTED: list[str] = []  # the runs this process has started (startup_times' before_run)


def process_age_s() -> float | None:
    """Seconds since this process started (Linux's /proc; None elsewhere)."""
    try:
        stat = Path("/proc/self/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, starttime, in clock ticks
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def startup_times(module: ICLModule, start: float, before_run: float | None) -> dict:
    """Where a run's time before its training steps went, in seconds: before_run (from the
    process's start: imports, composing, the checks; the process's first run only), to_fit
    (building the task and model, the Trainer), to_train (Lightning's set-up: strategy, devices,
    the data loader) and first_batch (the first training batch: fetching it, compiling,
    autotuning); None where not reached."""
    marks = module.marks

    def between(first: str | None, last: str) -> float | None:
        begin = start if first is None else marks.get(first)
        return None if begin is None or last not in marks else marks[last] - begin

    return {"before_run": before_run, "to_fit": between(None, "fit_start"),
            "to_train": between("fit_start", "train_start"),
            "first_batch": between("train_start", "first_batch_end")}


def _train_summary(trainer: L.Trainer | None, module: ICLModule, model: Backbone) -> dict:
    """The training part of the record, the resumed part of the run included."""
    trained_on = getattr(module, "train_device", None)  # None: training never started
    return {"steps": int(trainer.global_step) if trainer is not None else 0,
            "wall_time_s": module.train_time(),
            "device": trained_on or str(next(model.parameters()).device),
            "device_name": device_name(trained_on or "cpu"),
            # the intra-op threads it trained with: trainer.threads, else torch's default
            # (OMP_NUM_THREADS: a launcher's worker has its share of the cores); they move a
            # run's numbers at the level of float rounding
            "threads": torch.get_num_threads(),
            "thread_wait": thread_wait(),  # how those threads waited: the wall times depend on it
            "world_size": trainer.world_size if trainer is not None else None,
            "precision": str(trainer.precision) if trainer is not None else None,
            "tf32": module.config.tf32,
            "compile": module.config.compile,
            "deterministic": torch.are_deterministic_algorithms_enabled(),  # make_trainer's
            "kernel": scan_kernels(model, trained_on or "cpu"),
            "kernel_fallback": kernel_fallback(trained_on or "cpu"),
            "loss_curve": [list(point) for point in module.loss_curve],
            "val_curve": [list(point) for point in module.val_curve]}
