"""The commands that train or measure: list, run, references, eval, speed, gpucheck, suite, sweep.
Each composes its config (bench.config, no torch) before it imports torch, the families or the
training path: a mistyped command line is answered in ~0.2 s of CPU instead of 3-7 s (README
"What a command costs"), so those imports stay inside the commands."""
from __future__ import annotations

import os
import sys

import yaml

from bench.cli.launch import dispatcher, take_launcher, worker_environments
from bench.cli.options import fail, positive_int, take_flag, take_option, take_selection
from bench.cli.suites import run_entries
from bench.config import (PRECISIONS, ConfigError, check_path, choices, compose, describe_choice,
                          load_suite, suite_label)
from bench.config.sweep import grid
from bench.records.store import output_path, write_json
from bench.reports.report import print_metrics, print_run
from models.configs import KERNELS


def cmd_list(argv: list[str]) -> int:
    if argv:
        return fail(f"list takes no arguments, got '{argv[0]}'")
    for group in ("task", "model", "trainer"):
        print(f"{group}s:")
        for name in choices(group):
            print(f"  {name:<22} {describe_choice(group, name)}")
    return 0


def cmd_run(argv: list[str]) -> int:
    argv, dry = take_flag(argv, "print_config")
    argv, details = take_flag(argv, "details")
    config, task = composed_and_checked(argv)
    if dry:
        print_config(config, task)
        return 0
    return run_and_print(config, task, details)  # the task the checks built


def run_and_print(config, task, details: bool = False, **weights) -> int:
    """One run (bench.training.train.run; `weights`: an evaluation of saved ones), its process
    group left whatever happens, and its result printed (`details`: the task's own metrics
    too)."""
    from bench.training.signals import end_distributed
    from bench.training.train import run
    try:
        record, path = run(config, task=task, **weights)
    finally:
        end_distributed()
    if path:
        print_run(record, path, details)
    return 0


def composed_and_checked(argv: list[str]) -> tuple:
    """The run's config and the task its checks built: composed first, without torch, so that a
    misspelt key or value is answered before the checks (which import torch and the task and
    model families, seconds of CPU) run; then every check a run makes before it starts."""
    config = compose(argv)
    from bench.training.checks import checked_task_of
    return config, checked_task_of(config)


def print_config(config, task) -> None:
    """The composed config and the memory estimate the run was checked against, as one YAML
    document: what `run` would do, seen before it spends anything."""
    from bench.training.checks import memory_summary
    described = config.describe()
    described.pop("overrides")
    document = {**described, "out_dir": config.out_dir, "resume": config.resume,
                "memory_estimate": memory_summary(config, task)}
    print(yaml.safe_dump(document, sort_keys=False), end="")


def cmd_references(argv: list[str]) -> int:
    argv, n = take_option(argv, "n", "")
    if n:
        argv = [*argv, f"trainer.eval_sequences={positive_int('n', n, low=2)}"]
    config, task = composed_and_checked(argv)  # the task the checks built, used as it is
    from bench.training import reference_cache
    from bench.training.evaluate import score_predictions
    from bench.training.train import build
    task, _ = build(config, task=task)
    held_out, references = reference_cache.held_out_set(config, task)
    references = reference_cache.complete(config, task, held_out, references)
    result = score_predictions(task, held_out, None, config.trainer.bootstrap, references)
    print(f"task {config.task_name} {task.config_dict()}  ({len(task.references())} references, "
          f"{result['metrics']['sequences']} held-out sequences)")
    print_metrics(result["metrics"])
    for name, reference in task.references().items():  # what each reference computes
        print(f"  {name:<20} {reference.description}")
    return 0


def cmd_eval(argv: list[str]) -> int:
    argv, weights = take_option(argv, "weights", "")
    argv, details = take_flag(argv, "details")
    if not weights:
        raise ConfigError("eval needs weights=<file> (a run's out_dir/weights/<run_id>.pt)")
    check_path("weights", weights)
    from bench.training.weights import check_eval_overrides, eval_config, load_weights
    check_eval_overrides(argv)  # a refused key is refused before the file is read
    payload = load_weights(weights)
    config, task = eval_config(payload, argv)
    return run_and_print(config, task, details, weights=payload, weights_path=weights)


def cmd_speed(argv: list[str]) -> int:
    argv, steps = take_option(argv, "steps", "20")
    steps = positive_int("steps", steps, high=100_000)  # a bound: steps=10^30 never ended
    argv, kernels = take_option(argv, "kernels", "all")
    argv, precisions = take_option(argv, "precisions", "all")
    argv, compiles = take_option(argv, "compile", "all")
    argv, out = take_option(argv, "out", "")
    for key, value, allowed in (("kernels", kernels, ("all", *KERNELS)),
                                ("precisions", precisions, ("all", *PRECISIONS)),
                                ("compile", compiles, ("all", "on", "off"))):
        if value not in allowed:
            raise ConfigError(f"{key}: invalid value '{value}'; expected one of "
                              f"{', '.join(allowed)}")
    if out and not os.access(os.path.dirname(os.path.abspath(out)), os.W_OK):
        raise ConfigError(f"out={out}: its folder does not exist or is not writable")
    if out:
        output_path(out)  # a regular file or none: never through a symlink, FIFO or device
    # A single chosen setting is also the run's: composed with it, it is validated like a run
    # (kernel=mamba_ssm off CUDA, 16-mixed on the CPU, compile without a compiler are refused)
    chosen = ([f"model.kernel={kernels}"] if kernels != "all" else []) + \
        ([f"trainer.precision={precisions}"] if precisions != "all" else []) + \
        ([f"trainer.compile={compiles == 'on'}"] if compiles != "all" else [])
    from bench.training.checks import compose_checked
    config = compose_checked(argv)
    if kernels != "all" and not hasattr(config.model, "kernel"):
        raise ConfigError(f"kernels={kernels}: model {config.model_name} has no SSD kernel to "
                          "choose")
    config = compose_checked([*argv, *chosen])
    from bench.perf.speed import measure, print_speed
    result = measure(config, steps, kernels, precisions, compiles,
                     progress=lambda line: print(line, file=sys.stderr, flush=True))
    print_speed(result)
    if out:
        write_json(out, result)
        print(f"written: {out}")
    return 0


def cmd_gpucheck(argv: list[str]) -> int:
    from bench.perf.gpucheck.driver import main as gpucheck
    return gpucheck(argv)


def cmd_suite(argv: list[str]) -> int:
    """Each suite entry is a list of overrides; `argv` (e.g. out_dir=DIR) is added to every one.
    A suite writes to runs/ (git-ignored), like every run, unless out_dir= is given: maintainers
    publish with out_dir=results, the records the committed boards and claims read."""
    argv, name = take_option(argv, "name", "")
    argv, *selection = take_selection(argv)
    argv, launcher = take_launcher(argv)
    argv, plan = take_plan(argv, launcher)
    if not name:
        return fail(f"suite needs name=<suite> or name=<file.yaml>; suites: "
                    f"{', '.join(choices('suite'))}")
    return run_entries(f"suite {name}", load_suite(name), argv, *selection,
                       origin=f"suite:{suite_label(name)}", dispatch=dispatcher(launcher),
                       plan=plan)


def cmd_sweep(argv: list[str]) -> int:
    """The grid of the command line's comma lists and ranges (bench/config/sweep.py), run as a suite
    is: numbered entries, shard=, entries=, rerun=; records go to out_dir (default runs/)."""
    argv, *selection = take_selection(argv)
    argv, launcher = take_launcher(argv)
    argv, plan = take_plan(argv, launcher)
    entries, shared = grid(argv)
    return run_entries("the sweep", entries, shared, *selection, origin="sweep",
                       dispatch=dispatcher(launcher), plan=plan)


def take_plan(argv: list[str], launcher) -> tuple[list[str], tuple | None]:
    """plan=true (and measure=true): what print_plan prices the runs on, (workers, each one's CPU
    threads, whether to measure the step here now); None without plan=true."""
    argv, plan = take_flag(argv, "plan")
    argv, measure = take_flag(argv, "measure")
    if measure and not plan:
        raise ConfigError("measure=true measures the step for plan=true's prices: give plan=true "
                          "too")
    return argv, (*planned_workers(launcher), measure) if plan else None


def planned_workers(launcher) -> tuple[int, int | None]:
    """The processes that plan=true prices the runs on, and each one's CPU threads (None on
    GPUs), as launcher=local gives them (refusing what it refuses: more workers than cores or
    GPUs); a SLURM array's tasks run side by side as far as the cluster allows, which nobody
    can tell here."""
    if launcher.kind != "local":
        raise ConfigError("plan=true prices runs on this machine: give launcher=local "
                          "(workers=N), not launcher=slurm")
    share = worker_environments(launcher.workers)[0].get("OMP_NUM_THREADS")
    return launcher.workers, int(share) if share else None
