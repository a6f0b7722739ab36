"""The behavioural identity of a run configuration under the code that runs it.

Records used to be grouped by a digest of the code's bytes, so any refactor made every result
stale. The identity is what the code *does* with a config instead, measured on the CPU in a few
seconds: two code versions whose identity agrees for a config ran the same experiment, and their
records pool (bench/leaderboard.py). It is a digest of these parts, each a digest of numbers
rounded to SIGNIFICANT significant digits (so a sum taken in another order does not count as a
change, and a change that moves a result in its 6th digit does):

- train_batches: the training batches of the first PROBE_STEPS steps, as the data loader gives
  them to the training step, and the batch of the run's last step (its generator's key);
- held_out: the first PROBE_SEQUENCES sequences of the held-out set (as the task draws them for a
  held-out set of that size), and references: every reference's per-position scores on them;
- init: the model's parameters as built for seed 0; optimizer: AdamW's groups (sizes and
  hyper-parameters); schedule: the learning-rate multiplier at SCHEDULE_POINTS steps spread
  over trainer.max_steps;
- steps: the training loss of each of the first PROBE_STEPS optimizer steps, through the real
  Lightning path (ICLModule, the run's Trainer: gradient clipping, precision, scheduler), and
  the parameters after them;
- scoring: the run's metrics (bench.evaluate.score_predictions, the run's bootstrap) of that
  model on the probe's held-out sequences, through Trainer.test as a run scores.

What it cannot see: behaviour that only shows after step PROBE_STEPS (a change to the sampler of
late steps only, or to the model beyond what three steps exercise), on more held-out sequences,
on a GPU (kernels, bf16/16-mixed numerics: records of other environments never pool anyway), on
DDP ranks other than 0, in resumed runs and in live validation. Two records of one seed under one
identity must then agree: the leaderboard compares them and names an identity whose records
disagree, so a blind spot shows instead of pooling silently.

This file runs as a script (`python identity.py`, JSON specs on stdin, one JSON line per spec
on stdout) inside a checkout of any commit, old ones included (bench/identities.py runs it in a
temporary worktree per commit): it imports the checkout's packages only inside functions, and
asks them only for what has not changed since the first committed records (bench.config's
RunConfig and TrainerConfig, bench.train.build and make_trainer, ICLModule, the reference cache
and score_predictions). What an old checkout lacks makes its identity not computable, with the
reason; never a guess."""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import math
import os
import sys
import tempfile
import time

FORMAT = "icl-bench/identity/1"
PROBE_STEPS = 3
PROBE_SEQUENCES = 8
SCHEDULE_POINTS = 16
SIGNIFICANT = 6
PARTS = ("train_batches", "held_out", "references", "init", "optimizer", "schedule", "steps",
         "scoring")
# Trainer settings the probe overrides: it trains PROBE_STEPS steps on one CPU process, with no
# logs, checkpoints, caches or compilation (none of which changes a number).
PROBE_TRAINER = {"accelerator": "cpu", "devices": 1, "num_nodes": 1, "strategy": "auto",
                 "compile": False, "progress": False, "logger": "none", "checkpoint_every": 0,
                 "val_every": 0, "reference_cache": False, "threads": 0, "loader_workers": 0,
                 "save_weights": False}
# Precisions a CPU trains in; the others (16-mixed) probe in float32.
CPU_PRECISIONS = ("32-true", "64-true", "bf16-mixed")


class Fingerprint:
    """An incremental digest of nested values: numbers rounded to SIGNIFICANT significant
    digits, tensors by dtype kind, shape and rounded values, strings and structure exactly."""

    def __init__(self):
        self.hash = hashlib.sha256()

    def add(self, value) -> "Fingerprint":
        import torch
        if isinstance(value, torch.Tensor):
            self._tensor(value.detach().cpu())
        elif isinstance(value, dict):
            self._text("{")
            for key in sorted(value, key=str):
                self._text(str(key))
                self.add(value[key])
            self._text("}")
        elif isinstance(value, (list, tuple)):
            self._text("[")
            for item in value:
                self.add(item)
            self._text("]")
        elif isinstance(value, bool) or value is None:
            self._text(repr(value))
        elif isinstance(value, int):
            self._text(f"i{value}")
        elif isinstance(value, float):
            self._text(f"f{value:.{SIGNIFICANT}g}" if math.isfinite(value) else f"f{value}")
        else:
            self._text(f"s{value}")
        return self

    def _text(self, text: str) -> None:
        self.hash.update(text.encode() + b"\0")

    def _tensor(self, tensor) -> None:
        import torch
        self._text(f"t{'f' if tensor.is_floating_point() else 'i'}{tuple(tensor.shape)}")
        if not tensor.is_floating_point():
            self.hash.update(tensor.to(torch.int64).contiguous().numpy().tobytes())
            return
        x = tensor.to(torch.float64).flatten()
        finite = torch.isfinite(x)
        safe = torch.where(finite & (x != 0), x, torch.ones_like(x))
        exponent = torch.floor(torch.log10(safe.abs()))
        mantissa = torch.round(safe * torch.pow(10.0, SIGNIFICANT - 1 - exponent))
        # rounding can carry into the next power of ten (9.999995 -> 10.0000): renormalise
        carry = mantissa.abs() >= 10 ** SIGNIFICANT
        mantissa = torch.where(carry, torch.round(mantissa / 10), mantissa)
        exponent = exponent + carry
        code = torch.where(finite, torch.where(x == 0, 0.0, 1.0),
                           torch.where(torch.isnan(x), 2.0, torch.sign(x) * 3.0))
        self.hash.update(torch.stack([mantissa * (code == 1), exponent * (code == 1), code])
                         .to(torch.int64).contiguous().numpy().tobytes())

    def hexdigest(self, length: int = 16) -> str:
        return self.hash.hexdigest()[:length]


def fingerprint(*values) -> str:
    fp = Fingerprint()
    for value in values:
        fp.add(value)
    return fp.hexdigest()


def _dataclass(cls, values: dict):
    """cls built from a record's resolved values, as bench.config builds it from YAML (OmegaConf:
    lists typed as the schema says)."""
    from omegaconf import OmegaConf
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cls), OmegaConf.create(values)))


def probe_configs(spec: dict, out_dir: str):
    """(full, probe): the RunConfig of spec (a record's task, model and trainer sections) at
    seed 0, and the same with PROBE_TRAINER's settings and max_steps = PROBE_STEPS for the
    Trainer (the module keeps the full config: the schedule is the run's)."""
    from bench.config import RunConfig, TrainerConfig
    from models import model_families
    from tasks import task_families
    task_cls = task_families()[spec["task"]["family"]]
    model_cls = model_families()[spec["model"]["family"]]
    trainer_fields = {f.name for f in dataclasses.fields(TrainerConfig)}
    trainer = {k: v for k, v in spec["trainer"]["config"].items() if k in trainer_fields}
    if trainer.get("precision") not in CPU_PRECISIONS:
        trainer["precision"] = "32-true"
    probe_trainer = {**trainer, **{k: v for k, v in PROBE_TRAINER.items() if k in trainer_fields}}
    run_fields = {f.name for f in dataclasses.fields(RunConfig)}

    def run_config(trainer_values: dict):
        values = dict(task_name=spec["task"]["name"], task_family=spec["task"]["family"],
                      task=_dataclass(task_cls.Config, spec["task"]["config"]),
                      model_name=spec["model"]["name"], model_family=spec["model"]["family"],
                      model=_dataclass(model_cls.Config, spec["model"]["config"]),
                      trainer_name=spec["trainer"].get("name", "default"),
                      trainer=_dataclass(TrainerConfig, trainer_values), seed=0, out_dir=out_dir)
        return RunConfig(**{k: v for k, v in values.items() if k in run_fields})

    full = run_config({**probe_trainer, "max_steps": trainer.get("max_steps", 1)})
    probe = run_config({**probe_trainer, "max_steps": PROBE_STEPS})
    return full, probe


def _module_class():
    try:
        from bench.module import ICLModule
    except ImportError:  # before the module had a file of its own
        from bench.train import ICLModule
    return ICLModule


def _schedule(module, max_steps: int) -> list[float]:
    """The learning-rate multiplier of every parameter group at SCHEDULE_POINTS steps spread
    over the run, read from the scheduler the module configures (stepped as Lightning does)."""
    configured = module.configure_optimizers()
    if isinstance(configured, dict):
        optimizer = configured["optimizer"]
        scheduler = configured.get("lr_scheduler")
        scheduler = scheduler.get("scheduler") if isinstance(scheduler, dict) else scheduler
    else:
        optimizer, scheduler = configured, None
    base = [group["lr"] for group in optimizer.param_groups]
    points = sorted({round(i * (max_steps - 1) / (SCHEDULE_POINTS - 1))
                     for i in range(SCHEDULE_POINTS)})
    values, step = [], 0
    for point in points:
        while step < point:
            optimizer.step()  # no gradients: parameters unchanged; keeps torch from warning
            if scheduler is not None:
                scheduler.step()
            step += 1
        values.append([group["lr"] / lr for group, lr in zip(optimizer.param_groups, base)])
    groups = [{k: (v if k != "params" else [tuple(p.shape) for p in v]) for k, v in g.items()
               if k not in ("lr", "initial_lr")} for g in optimizer.param_groups]
    return values, {"groups": groups, "base_lr": base, "type": type(optimizer).__name__}


def probe(spec: dict) -> dict:
    """The identity of one config (spec: a record's task, model and trainer sections) under the
    code this process imported: {"identity", "parts", "precision", "seconds"}. Deterministic:
    seed 0, one thread, the CPU."""
    import torch
    start = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _probe(spec, start)
    finally:
        torch.set_num_threads(threads)


def _probe(spec: dict, start: float) -> dict:
    import lightning as L
    from bench import train
    parts: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="icl-identity-") as out_dir, \
            contextlib.redirect_stdout(io.StringIO()):
        full, probe_config = probe_configs(spec, out_dir)
        train.quiet_lightning()
        task, model = train.build(full)
        parts["init"] = fingerprint(model.state_dict())
        ICLModule = _module_class()
        schedule, optimizer = _schedule(ICLModule(model, task, full.trainer),
                                        full.trainer.max_steps)
        parts["schedule"], parts["optimizer"] = fingerprint(schedule), fingerprint(optimizer)
        batches, losses = [], []

        class Capture(L.Callback):
            def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
                batches.append(batch)
                losses.append(outputs["loss"] if isinstance(outputs, dict) else outputs)

        module = ICLModule(model, task, full.trainer)
        trainer = train.make_trainer(probe_config, "identity-probe")
        trainer.callbacks.append(Capture())
        trainer.fit(module, datamodule=task)
        last = (task.training_batch(full.trainer.max_steps - 1)
                if hasattr(task, "training_batch") else None)
        parts["train_batches"] = fingerprint(batches, last)
        parts["steps"] = fingerprint(losses, model.state_dict())
        from bench import reference_cache
        from bench.evaluate import score_predictions
        probe_config.trainer.eval_sequences = PROBE_SEQUENCES
        held_out, references = reference_cache.held_out_set(probe_config, task)
        parts["held_out"] = fingerprint(held_out.inputs, held_out.targets, held_out.loss_mask)
        trainer.test(module, datamodule=task, verbose=False)
        references = reference_cache.complete(probe_config, task, held_out, references)
        parts["references"] = fingerprint(references.scores, references.reference_probs)
        scored = score_predictions(task, held_out, getattr(module, "test_predictions", None),
                                   full.trainer.bootstrap, references,
                                   getattr(module, "test_scores", None))
        parts["scoring"] = fingerprint(scored)
    return {"identity": fingerprint([parts[name] for name in PARTS]), "parts": parts,
            "precision": probe_config.trainer.precision,
            "seconds": round(time.perf_counter() - start, 2)}


def foreign_modules(tree: str) -> list[str]:
    """The project's modules this process loaded from outside `tree`, the checkout probed (an
    installed copy of the project answers for a module an old checkout lacks)."""
    root = os.path.realpath(tree) + os.sep
    return sorted(name for name, module in list(sys.modules.items())
                  if name.split(".")[0] in ("bench", "tasks", "models")
                  and getattr(module, "__file__", None)
                  and not os.path.realpath(module.__file__).startswith(root))


# What the probe calls that the first committed records' checkout did not have yet
NEEDED_FILES = ("bench/reference_cache.py", "bench/evaluate.py", "bench/train.py")


def main() -> int:
    """Script mode, in the checkout to probe (the working directory): a JSON list of {"key",
    "task", "model", "trainer"} on stdin; one JSON line per spec on stdout, {"key", ...probe()}
    or {"key", "error"}."""
    import warnings
    warnings.filterwarnings("ignore")
    specs = json.load(sys.stdin)
    out = sys.stdout
    lacking = [path for path in NEEDED_FILES if not os.path.isfile(path)]
    for spec in specs:
        if lacking:
            out.write(json.dumps({"key": spec["key"], "format": FORMAT,
                                  "error": f"the checkout has no {lacking[0]}"}) + "\n")
            continue
        try:
            result = probe(spec)
        except Exception as error:  # an old checkout that lacks what the probe needs
            message = str(error).strip().splitlines()
            result = {"error": f"{type(error).__name__}: {message[0] if message else ''}"
                      .rstrip(": ")}
        foreign = foreign_modules(os.getcwd())
        if foreign:  # the probe needs a module this checkout does not have
            result = {"error": f"the checkout lacks {foreign[0]}"}
        out.write(json.dumps({"key": spec["key"], "format": FORMAT, **result}) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
