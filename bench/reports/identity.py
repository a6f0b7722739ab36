"""The behavioural identity of a run configuration under the code that runs it.

Records used to be grouped by a digest of the code's bytes, so any refactor made every result
stale. The identity is what the code *does* with a config instead, measured on the CPU in a few
seconds: when today's code reproduces every number an older code version's probe measured for a
config, up to TOLERANCE (a sum taken in another order is no change; a change that moves a result
is), the two ran the same experiment and their records pool (bench/reports/identities.py,
bench/reports/leaderboard.py). Numbers are kept as summaries (`summarize`: a float array as its
length, sum, norm and two fixed ±1 projections), in these parts:

- train_batches: the training batches of the first PROBE_STEPS steps (inputs, targets, mask), as
  the data loader gives them to the training step;
- held_out: the first PROBE_SEQUENCES sequences of the held-out set (as the task draws them for a
  held-out set of that size), and references: every reference's per-position scores on them;
- init: the model's parameters and buffers as built for seed 0 (in canonical_order: renaming
  or reordering submodules is no change); optimizer: each parameter's AdamW settings, however
  they are grouped; schedule: each parameter's learning rate at SCHEDULE_POINTS steps spread
  over trainer.max_steps;
- steps: the training loss of each of the first PROBE_STEPS optimizer steps, through the real
  Lightning path (ICLModule, the run's Trainer: gradient clipping, precision, scheduler), and
  the parameters after them (agreeing up to the scale of the whole model: Adam turns gradients
  that are rounding noise into steps of the learning rate's size);
- scoring: the run's metrics (bench.training.evaluate.score_predictions, the run's bootstrap) of
  that model on the probe's held-out sequences, through Trainer.test as a run scores.

What it cannot see: behaviour that only shows after step PROBE_STEPS (a change to the sampler of
late steps only, or to the model beyond what three steps exercise), on more held-out sequences,
on a GPU (kernels, bf16/16-mixed numerics: records of other environments never pool anyway), on
DDP ranks other than 0, in resumed runs and in live validation; and what a newer code version
adds (a metric, a reference) without changing what the older one measured, which older records
lack. Two records of one seed under one identity must then agree: the leaderboard compares them
and names an identity whose records disagree, so a blind spot shows instead of pooling silently.
The identity's name (`label`) is a digest of the summaries to 4 significant digits.

This file runs as a script (`python identity.py`, JSON specs on stdin, one JSON line per spec
on stdout) inside a checkout of any commit, old ones included (bench/reports/identities.py runs it
in a temporary worktree per commit): it imports the checkout's packages only inside functions, and
asks them only for what has not changed since the first committed records (bench.config's
RunConfig and TrainerConfig, train.build and make_trainer, ICLModule, the reference cache and
score_predictions, found where today's bench/ keeps them or where an old one did). What an old
checkout lacks makes its identity not computable, with the
reason; never a guess."""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib
import io
import json
import math
import os
import sys
import tempfile
import time

# The probe's format: the index keys stored identities by it (bench/reports/identities.py), so bump
# it whenever what the probe measures changes (a part, PROBE_STEPS, PROBE_SEQUENCES, summarize,
# the probe trainer); a refactor, a move or a comment leaves it, and every stored identity, as is.
FORMAT = "icl-bench/identity/2"
PROBE_STEPS = 3
PROBE_SEQUENCES = 8
SCHEDULE_POINTS = 16
PARTS = ("train_batches", "held_out", "references", "init", "optimizer", "schedule", "steps",
         "scoring")
# Two measurements agree when every number differs by at most TOLERANCE relative to its scale:
# a float32 sum taken in another order differs by ~1e-7, a planted change of 1e-3 in one of a
# 14M-parameter model's weights moves its summaries by ~1e-5.
TOLERANCE = 2e-6
# Trainer settings the probe overrides: it trains PROBE_STEPS steps on one CPU process, with no
# logs, checkpoints, caches or compilation (none of which changes a number).
PROBE_TRAINER = {"accelerator": "cpu", "devices": 1, "num_nodes": 1, "strategy": "auto",
                 "compile": False, "compile_mode": "default", "progress": False, "logger": "none",
                 "checkpoint_every": 0, "val_every": 0, "reference_cache": False, "threads": 0,
                 "loader_workers": 0, "save_weights": False}
# Precisions a CPU trains in; the others (16-mixed) probe in float32.
CPU_PRECISIONS = ("32-true", "64-true", "bf16-mixed")
VECTOR = "v"  # the tag of a float array's summary
SCALE = "/scale"  # a part's entry: the scale its arrays agree up to (else each its own norm)


def summarize(value, path: str = "", out: dict | None = None) -> dict:
    """value (nested dicts, lists, tensors, numbers) flattened to {path: summary}: exact text
    for what is exact (integers, token tensors, strings, structure), a float for a float, and
    for a float array ["v", n, sum, norm, two ±1 projections] in float64 — enough to see any
    change beyond rounding without storing the array."""
    import torch
    out = {} if out is None else out
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu()
        if tensor.is_floating_point() and tensor.numel():
            out[path] = [VECTOR, *_vector(tensor.to(torch.float64).flatten())]
        else:
            digest = hashlib.sha256(tensor.to(torch.int64).contiguous().numpy().tobytes())
            out[path] = f"t{tuple(tensor.shape)}:{digest.hexdigest()[:16]}"
    elif isinstance(value, dict):  # its keys are in its leaves' paths: one added is no change
        if not value:
            out[path] = "{}"
        for key in value:
            summarize(value[key], f"{path}/{key}", out)
    elif isinstance(value, (list, tuple)):
        # a curve (None where a position is not scored: NaN, whose places count exactly)
        numbers = all(v is None or isinstance(v, (int, float)) and not isinstance(v, bool)
                      for v in value)
        if numbers and any(isinstance(v, float) for v in value) and len(value) > 4:
            summarize(torch.tensor([math.nan if v is None else v for v in value],
                                   dtype=torch.float64), path, out)
        else:
            out[path] = f"[{len(value)}]"
            for i, item in enumerate(value):
                summarize(item, f"{path}[{i}]", out)
    elif isinstance(value, float):
        out[path] = stored(value) if math.isfinite(value) else f"f{value}"
    elif isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        out[path] = f"{type(value).__name__}:{value}"
    else:
        out[path] = f"{type(value).__name__}:{value}"
    return out


def _vector(x) -> list:
    import torch
    finite = torch.isfinite(x)
    if not finite.all():  # where the non-finite entries are, exactly; the rest summarised
        digest = hashlib.sha256(finite.numpy().tobytes() + x[~finite].numpy().tobytes())
        x = torch.where(finite, x, 0.0)
        extra = [digest.hexdigest()[:16]]
    else:
        extra = []
    signs = torch.randint(0, 2, (2, x.numel()), generator=torch.Generator().manual_seed(0),
                          dtype=torch.int8).to(torch.float64) * 2 - 1
    projections = signs @ x
    return [x.numel(), *(stored(float(v)) for v in (x.sum(), x.norm(), *projections)), *extra]


def stored(value: float) -> float:
    """A float as the index keeps it: 10 significant digits, far finer than TOLERANCE."""
    return float(f"{value:.10g}")


def close(a: float, b: float, scale: float) -> bool:
    return abs(a - b) <= TOLERANCE * scale


def agrees(old, new, scale: float = 0.0) -> bool:
    """Whether two summaries of one path agree up to TOLERANCE (of `scale`, for arrays, where
    it exceeds their norm)."""
    if isinstance(old, list) and isinstance(new, list) and old[:1] == new[:1] == [VECTOR]:
        if old[1] != new[1] or old[6:] != new[6:]:  # length, non-finite pattern
            return False
        scale = max(old[3], new[3], scale, 1e-300)  # the norm: sums and projections are <= it
        return all(close(a, b, scale) for a, b in zip(old[2:6], new[2:6]))
    if isinstance(old, float) and isinstance(new, float):
        return close(old, new, max(abs(old), abs(new), 1e-12))
    return old == new


def differing(old: dict, new: dict) -> list[str]:
    """The paths of `old` that `new` lacks or disagrees on (what new adds is not a difference:
    a metric added since cannot be in an older record, and nothing it holds changed)."""
    scale = old.get(SCALE, 0.0) if isinstance(old.get(SCALE), float) else 0.0
    return [path for path, value in old.items()
            if path not in new or (path != SCALE and not agrees(value, new[path], scale))]


def label(summaries: dict) -> str:
    """A short digest of summaries, numbers to 4 significant digits: the identity's name."""
    def rounded(value):
        if isinstance(value, list):
            return [rounded(v) for v in value]
        return f"{value:.4g}" if isinstance(value, float) else value
    text = json.dumps({path: rounded(value) for path, value in sorted(summaries.items())})
    return hashlib.sha256(text.encode()).hexdigest()[:16]


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
    return getattr(_first_module("bench.training.module", "bench.module", "bench.train"),
                   "ICLModule")


def canonical_order(model) -> list[str]:
    """The model's state (parameters and buffers) in an order that neither a renamed submodule
    nor a reordered one changes: by shape, then initial sum (6 digits), then name."""
    state = model.state_dict()
    return sorted(state, key=lambda name: (tuple(state[name].shape),
                                           f"{float(state[name].double().sum()):.6g}", name))


def _optimizer(module, model, order: list[str], max_steps: int) -> tuple[list, list]:
    """(settings, schedule) of the parameters in canonical order, whatever the grouping: the
    distinct AdamW settings (a group's, the learning rate included) and which one each parameter
    has, and each setting's learning rate at SCHEDULE_POINTS steps spread over the run, read
    from the optimizer and scheduler the module configures (stepped as Lightning steps it)."""
    configured = module.configure_optimizers()
    if isinstance(configured, dict):
        optimizer = configured["optimizer"]
        scheduler = configured.get("lr_scheduler")
        scheduler = scheduler.get("scheduler") if isinstance(scheduler, dict) else scheduler
    else:
        optimizer, scheduler = configured, None
    group_of = {id(p): group for group in optimizer.param_groups for p in group["params"]}
    named = dict(model.named_parameters())
    groups = [group_of[id(named[name])] for name in order
              if name in named and id(named[name]) in group_of]
    # the distinct settings in order of first use, and each parameter's (canonical either way)
    distinct, which = [], []
    for group in groups:
        setting = {**{k: v for k, v in group.items() if k not in ("params", "initial_lr")},
                   "optimizer": type(optimizer).__name__}
        if setting not in distinct:
            distinct.append(setting)
        which.append(distinct.index(setting))
    import torch
    settings = {"settings": distinct, "of_parameter": torch.tensor(which)}
    firsts = [which.index(i) for i in range(len(distinct))]  # a parameter of each setting
    points = sorted({round(i * (max_steps - 1) / (SCHEDULE_POINTS - 1))
                     for i in range(SCHEDULE_POINTS)})
    schedule, step = [], 0
    for point in points:
        while step < point:
            optimizer.step()  # no gradients: parameters unchanged; keeps torch from warning
            if scheduler is not None:
                scheduler.step()
            step += 1
        schedule.append([groups[i]["lr"] for i in firsts])
    return settings, schedule


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


def _datamodule(task):
    """The task as Lightning's data module: today's code wraps it (bench.training.datamodule);
    a checkout from before that module was one itself."""
    adapter = _first_module("bench.training.datamodule", optional=True)
    return task if adapter is None else adapter.TaskData(task)


def _probe(spec: dict, start: float) -> dict:
    import lightning as L
    train = _first_module("bench.training.train", "bench.train")
    parts: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="icl-identity-") as out_dir, \
            contextlib.redirect_stdout(io.StringIO()):
        full, probe_config = probe_configs(spec, out_dir)
        train.quiet_lightning()
        task, model = train.build(full)
        order = canonical_order(model)
        parts["init"] = summarize([model.state_dict()[name] for name in order])
        ICLModule = _module_class()
        optimizer, schedule = _optimizer(ICLModule(model, task, full.trainer), model, order,
                                         full.trainer.max_steps)
        parts["optimizer"], parts["schedule"] = summarize(optimizer), summarize(schedule)
        batches, losses = [], []

        class Capture(L.Callback):
            def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
                batches.append(batch)
                losses.append(outputs["loss"] if isinstance(outputs, dict) else outputs)

        module = ICLModule(model, task, full.trainer)
        trainer = train.make_trainer(probe_config, "identity-probe")
        trainer.callbacks.append(Capture())
        datamodule = _datamodule(task)
        trainer.fit(module, datamodule=datamodule)
        parts["train_batches"] = summarize([[b.inputs, b.targets, b.loss_mask] for b in batches])
        state = [model.state_dict()[name] for name in order]
        parts["steps"] = summarize([losses, state])
        # Adam turns a gradient that is rounding noise (a key bias under softmax) into steps of
        # the learning rate's size: the parameters agree up to the scale of the whole model
        parts["steps"][SCALE] = float(sum(float(t.double().norm()) ** 2 for t in state) ** 0.5)
        reference_cache = _first_module("bench.training.reference_cache", "bench.reference_cache")
        score_predictions = _first_module("bench.training.evaluate",
                                          "bench.evaluate").score_predictions
        probe_config.trainer.eval_sequences = PROBE_SEQUENCES
        held_out, references = reference_cache.held_out_set(probe_config, task)
        parts["held_out"] = summarize([held_out.inputs, held_out.targets, held_out.loss_mask])
        trainer.test(module, datamodule=datamodule, verbose=False)
        references = reference_cache.complete(probe_config, task, held_out, references)
        parts["references"] = summarize([references.scores, references.reference_probs])
        scored = score_predictions(task, held_out, getattr(module, "test_predictions", None),
                                   full.trainer.bootstrap, references,
                                   getattr(module, "test_scores", None))
        parts["scoring"] = summarize(scored)
    return {"identity": label({f"{name}{path}": value for name in PARTS
                               for path, value in parts[name].items()}), "parts": parts,
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
# (as bench/ has it today, as it had it before bench/training/), one entry per module
NEEDED_FILES = (("bench/training/reference_cache.py", "bench/reference_cache.py"),
                ("bench/training/evaluate.py", "bench/evaluate.py"),
                ("bench/training/train.py", "bench/train.py"))


def _in_checkout(name: str) -> bool:
    """Whether the checkout probed (the working directory) has module `name` and each package
    above it, found without importing any of them from elsewhere: an editable install of today's
    project answers for a package an old checkout lacks (bench.training), and importing it
    would mix today's code into the old one's probe."""
    import importlib.util
    root = os.path.realpath(os.getcwd()) + os.sep
    parts = name.split(".")
    for depth in range(1, len(parts) + 1):
        prefix = ".".join(parts[:depth])
        try:
            spec = importlib.util.find_spec(prefix)
        except (ImportError, ValueError):
            return False
        origin = spec.origin if spec is not None else None
        locations = [origin] if origin not in (None, "namespace") else \
            list(spec.submodule_search_locations or []) if spec is not None else []
        if spec is None or not locations or not all(
                os.path.realpath(location).startswith(root) for location in locations):
            return False
    return True


def _first_module(*names: str, optional: bool = False):
    """The first of `names` the checkout has: a module keeps its behaviour when it moves, and
    the probe reads old checkouts (bench/*.py) and today's (bench/<folder>/*.py) alike. None
    when it has none and `optional` (a module newer than the checkout)."""
    for name in names:
        if not _in_checkout(name):
            continue
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name is None or not name.startswith(error.name):
                raise  # a module that is there but imports something missing: not ours to hide
    if optional:
        return None
    raise ModuleNotFoundError(f"the checkout has none of {', '.join(names)}")


def main() -> int:
    """Script mode, in the checkout to probe (the working directory): a JSON list of {"key",
    "task", "model", "trainer"} on stdin; one JSON line per spec on stdout, {"key", ...probe()}
    or {"key", "error"}."""
    import warnings
    warnings.filterwarnings("ignore")
    specs = json.load(sys.stdin)
    out = sys.stdout
    lacking = [paths[-1] for paths in NEEDED_FILES if not any(map(os.path.isfile, paths))]
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
