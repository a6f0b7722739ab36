"""Trained weights kept beside the run records, and `python -m bench eval` of them.

A run that trains and scores well saves its model to <out_dir>/weights/<run_id>.pt (unless
trainer.save_weights=false): the model's state_dict (the eager model's parameter names) with what
made it (task, model, trainer, seed, the run's overrides and its `train` summary), and the
sha256 of the file beside it (<run_id>.pt.sha256), which eval checks before reading the file. A
file that cannot be written costs a warning, never the run's record.

`python -m bench eval weights=<file> [task.<field>=v ...]` scores such a model again on another
task configuration (seq_len, eval_rho, ...) through the same run path (bench.training.train.run
with the weights given: training is skipped, the evaluation and the record are the run's own). The
configuration is the weights' run's overrides with the new ones on top; only task fields and
evaluation-only trainer keys may change, so the record still describes the model that was
trained. Its origin is "eval": boards and claims never pool it with trained runs."""
from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import torch

from bench.config import ConfigError, RunConfig, first_line
from bench.training.checks import checked_run, checked_task, require_digest
from models import build_model
from models.backbone import IOSpec
from tasks.files import write_with_digest

WEIGHTS_FORMAT = "icl-bench/weights/1"
WEIGHTS_DIR = "weights"  # under out_dir
# Trainer keys an evaluation may set: how the held-out set is scored and how the process runs;
# none changes the model that was trained.
EVAL_MAY_CHANGE = ("eval_sequences", "eval_batch_size", "bootstrap", "reference_cache",
                   "progress", "threads")
# Top-level keys an evaluation may set (seed and resume belong to the trained run).
EVAL_TOP_KEYS = ("out_dir", "name")


def save_weights(out_dir: str, record: dict, model: torch.nn.Module) -> str | None:
    """Write the model's weights to out_dir/weights/<run_id>.pt with the sha256 of its bytes
    beside it (<run_id>.pt.sha256; write_with_digest: whole or not at all). Returns the path
    relative to out_dir, or None after a one-line warning when it cannot be written (a read-only
    folder, a full disk): the run goes on."""
    relative = os.path.join(WEIGHTS_DIR, f"{record['run_id']}.pt")
    path = os.path.join(out_dir, relative)
    payload = {"format": WEIGHTS_FORMAT, "run_id": record["run_id"],
               **{key: record.get(key) for key in ("task", "model", "trainer", "seed",
                                                   "overrides", "train")},
               "state_dict": {name: tensor.detach().cpu().clone()
                              for name, tensor in model.state_dict().items()}}
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_with_digest(Path(path), lambda tmp: _save(payload, tmp))
    except Exception as error:
        print(f"warning: the weights could not be saved to {path}: {type(error).__name__}: "
              f"{first_line(error)}; the record says weights null", file=sys.stderr)
        return None
    return relative


def _save(payload: dict, path: str) -> None:
    with open(path, "wb") as file:  # a file object: the archive inside is named "archive", not
        torch.save(payload, file)   # after the temporary file, so equal weights give equal bytes


def load_weights(path: str) -> dict:
    """The contents of a weights file this runner wrote, its bytes those it was written with
    (the digest beside it, checked before it is read: a flipped byte in a tensor would be scored
    in an `ok` record); ConfigError (one line) otherwise. A file without a digest (saved before
    digests existed, or copied without it) is refused, naming the command that writes one for a
    file the user trusts."""
    require_digest(path, "eval", "weights", "weights saved", "evaluate another copy of them")
    try:
        # weights_only: tensors, dicts, lists and plain values only; no code runs on loading
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise ConfigError(f"eval: cannot read weights '{path}': {type(error).__name__}: "
                          f"{first_line(error)}") from None
    if not isinstance(payload, dict) or payload.get("format") != WEIGHTS_FORMAT \
            or not isinstance(payload.get("state_dict"), dict) \
            or not isinstance(payload.get("overrides"), list):
        raise ConfigError(f"eval: '{path}' is not a weights file written by this runner (format "
                          f"{WEIGHTS_FORMAT})")
    return payload


def _key(override: str) -> str:
    return override.split("=", 1)[0]


def check_eval_overrides(argv: list[str]) -> None:
    """Only task.<field>, task=<name> (same family, checked once composed), the evaluation-only
    trainer keys and out_dir/name may be given: anything else would describe another model."""
    for arg in argv:
        if "=" not in arg:
            raise ConfigError(f"expected key=value, got '{arg}'")
        key = _key(arg)
        head, _, rest = key.partition(".")
        if head == "task" or key in EVAL_TOP_KEYS or (head == "trainer" and rest in EVAL_MAY_CHANGE):
            continue
        raise ConfigError(f"eval: '{key}' cannot change in an evaluation of trained weights (it "
                          "describes the model or its training); eval takes task.<field>, "
                          f"{', '.join(f'trainer.{k}' for k in EVAL_MAY_CHANGE)}, out_dir, name")


def eval_config(payload: dict, argv: list[str]) -> tuple[RunConfig, object]:
    """The weights' run's overrides with argv on top (a key given again replaces the saved one),
    composed and checked: same task family, and the same model, trainer and seed as the weights
    say (conf/ files may have changed since). Training logs are off: nothing is trained.
    Returns the config and the task the checks built (checked_run), which the evaluation uses."""
    check_eval_overrides(argv)
    given = {_key(arg) for arg in argv}
    saved = [str(o) for o in payload["overrides"]
             if _key(str(o)) not in given and _key(str(o)) not in ("resume", "trainer.logger")]
    config, task = checked_run([*saved, *argv, "trainer.logger=none"])
    trained = payload.get("task") or {}
    if config.task_family != trained.get("family"):
        raise ConfigError(f"eval: the weights were trained on task family {trained.get('family')!r}"
                          f", not {config.task_family!r}; the task family must stay the same")
    described = config.describe()
    skip = set(EVAL_MAY_CHANGE) | {"logger", "save_weights"}
    for group, then, now in (
            ("model", (payload.get("model") or {}).get("config"), described["model"]["config"]),
            ("trainer", {k: v for k, v in ((payload.get("trainer") or {}).get("config") or {}).items()
                         if k not in skip},
             {k: v for k, v in described["trainer"]["config"].items() if k not in skip}),
            ("seed", payload.get("seed"), config.seed)):
        if group == "trainer":
            now = {k: v for k, v in now.items() if k in then}  # fields newer than the file
        if then != now:
            raise ConfigError(f"eval: the {group} composed from the weights' overrides differs "
                              "from the one they were trained with (conf/ changed since?)")
    config.origin = "eval"
    return config, task


def check_weights_fit(config: RunConfig, payload: dict, task=None) -> None:
    """The state_dict loads into the model this configuration builds (strict: every name, every
    shape) for `task` (built here without it); ConfigError (one line) otherwise, before anything
    is written."""
    task = checked_task(config) if task is None else task
    io = IOSpec(task.kind, task.input_dim, task.output_dim, task.seq_len)
    model = build_model(config.model_family, dataclasses.replace(config.model), io)
    try:
        model.load_state_dict(payload["state_dict"], strict=True)
    except Exception as error:
        message = " ".join(first_line(error).split()) or type(error).__name__
        text = " ".join(str(error).split())
        raise ConfigError(f"eval: the weights do not fit the model {config.model_name} at this "
                          f"task config: {text[:300] if len(text) > len(message) else message}"
                          ) from None
