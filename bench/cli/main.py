"""python -m bench <command> [key=value ...]

  run          train one model on one task, evaluate it against the task's references (to runs/)
  references   evaluate only the references on the held-out set (n=<sequences>)
  leaderboard  rewrite leaderboard.md from the run records in out_dir
  claims       write claims.md: every claim of the three papers, decided from the run records
  speed        training throughput of a model and throughput of the task's oracle
  suite        run every entry of a suite (conf/suite/, conf/papers/*/suites/) in turn; to runs/
  sweep        run the grid of comma lists and ranges (model=a,b seed=0-4) as a suite; to runs/
  list         the tasks and models, one line each
  gpucheck     every check of the GPU path (kernel parity, speed, end-to-end runs) in a budget
  plot         a figure of run records: training loss, gap by position (<record|dir> ...)
  eval         score a run's saved weights again on another task config (weights=<file>)
  compare      two runs on the same held-out set, paired by sequence (<A.json> <B.json>)
  identities   what each record's config does under its code and today's: which records are current

python -m bench <command> --help   that command's usage
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

try:  # Ctrl-C while Python is still importing: the same one line as later, no traceback
    from bench.config.commands import COMMANDS
    from bench.config import ConfigError, choices, describe_choice, first_line
except KeyboardInterrupt:
    print("error: interrupted", file=sys.stderr)
    raise SystemExit(130) from None

OVERRIDES = ("  task=<name> model=<name> trainer=<name>   a file of conf/task, conf/model, conf/trainer\n"
             "  task.<field>=v model.<field>=v trainer.<field>=v   one field of it\n"
             "  seed=<int> out_dir=<dir> name=<tag> resume=<checkpoint>")
USAGE = {
    "run": "python -m bench run [print_config=false] [key=value ...]\n  Train one model on one "
           "task, evaluate it on the held-out set, write a run record to out_dir (default runs/, "
           "git-ignored). print_config=true: print the composed config and the memory estimate "
           "as YAML and exit without training.\n" + OVERRIDES,
    "references": "python -m bench references [n=<sequences>] [key=value ...]\n  The task's "
                  "references alone on n held-out sequences (default trainer.eval_sequences); "
                  "no training.\n" + OVERRIDES,
    "leaderboard": "python -m bench leaderboard [out_dir=results] [out=leaderboard.md] "
                   "[include=suite|all]\n  Rewrite the leaderboard from the run records in "
                   "out_dir: the published leaderboard.md from results/ (it says so when it "
                   "rewrites that tracked file), <out_dir>/leaderboard.md from any other folder "
                   "(out_dir=runs: the table of a sweep).",
    "claims": "python -m bench claims [out_dir=results] [out=claims.md, else <out_dir>/claims.md] "
              "[include=suite|all] "
              "[rules=conf/papers] [check=false]\n  Decide every claim of the rules "
              "(conf/papers/<paper>/claims.yaml: each claim's quantities, record selectors and "
              "metric paths, its control and rule) on 95% intervals from the run records in "
              "out_dir and write claims.md: holds, holds at reduced scale, fails, not reached at "
              "reduced scale, undecided or not measured. check=true: the research checks of the "
              "records instead (a CPU claim left unmeasured, a verdict on a control that did not "
              "hold); exit 1 on a problem.\n"
              "python -m bench claims plan [out_dir=results] [out=<suite.yaml>] [budget_h=<hours>] "
              "[include=suite|all] [rules=conf/papers]\n  The power plan: each undecided claim "
              "with the seeds a power estimate says would decide it (its paired differences' "
              "mean and spread across seeds) and their CPU time from its records; out= writes "
              "the runs as a suite file (those within budget_h, cheapest claims first) for "
              "python -m bench suite name=<suite.yaml> out_dir=<out_dir>.",
    "speed": "python -m bench speed [steps=20] [kernels=all|<kernel>] [precisions=all|<precision>] "
             "[compile=all|on|off] [out=<file.json>] [key=value ...]\n  Training-step time of the "
             "configured model for every SSD kernel, precision and compile setting that applies "
             "here, the throughput of the task's sampler and references, and the share of a run "
             "spent outside training.\n" + OVERRIDES,
    "suite": "python -m bench suite name=<suite or file.yaml> [entries=1,4-6] [shard=i/n] "
             "[rerun=false] [key=value ...]\n  Every run of suite <suite> (conf/suite/ or a "
             "paper's conf/papers/<paper>/suites/; or of the suite file at that path: `runs:`, a "
             "list of override lists) in turn, or the entries given (numbered from 1 as the suite "
             "prints them); key=value overrides apply to every run. Records go to out_dir "
             "(default runs/, git-ignored; out_dir=results publishes them: the records the committed "
             "boards and claims read). A run whose `ok` suite record "
             "(same config and seed, made by the current code, not dirty, on the device and SSD "
             "kernel it would use here) is in out_dir already is skipped, so an interrupted suite "
             "goes on where it stopped; an ad-hoc run or a sweep of the same config does not "
             "count; rerun=true runs it again.\n  suites: "
             + ", ".join(choices("suite")),
    "sweep": "python -m bench sweep key=a,b,c seed=lo-hi [entries=1,4-6] [shard=i/n] "
             "[rerun=false] [key=value ...]\n  The grid of every comma list and range (the "
             "cartesian product, the first key varying slowest), run in turn as a suite is: "
             "numbered entries, entries=, shard= for parallel workers, and a run whose `ok` "
             "sweep record is in out_dir already is skipped. A value splits at commas outside "
             "brackets and quotes (task.gd_steps=[1,2] is one value); lo-hi (0 <= lo <= hi) is "
             "a range for seed and integer fields only; out_dir, name and resume are never "
             "split. At least one list or range, at most 1000 runs. Records go to out_dir "
             "(default runs/, git-ignored).\n"
             + OVERRIDES,
    "list": "python -m bench list\n  The tasks, models and trainer presets, one line each.",
    "plot": "python -m bench plot <record.json|dir> [...] [out=<file.png>]\n  One figure of the "
            "given run records (every `ok` record of a directory): training loss by step, the "
            "validation gap by step where recorded, and the gap to the Bayes reference by "
            "position with the first run's references dashed (a symlog axis when they are off "
            "the models' scale). out defaults to <record>.png beside a single record, else "
            "<dir>/curves.png or curves.png.",
    "eval": "python -m bench eval weights=<out_dir/weights/run.pt> [task.<field>=v ...] "
            "[task=<name>] [trainer.eval_sequences=n] [trainer.eval_batch_size=n] "
            "[trainer.bootstrap=n] [trainer.reference_cache=b] [trainer.progress=b] "
            "[trainer.threads=n] [out_dir=<dir>] [name=<tag>]\n  Score the model a run saved "
            "(trainer.save_weights) on the held-out set of another task config of the same "
            "family, without training: the weights' run's overrides with these on top. The "
            "record (origin eval) names the weights and carries the weights' run's training; "
            "leaderboard and claims never use it. Model, training and seed keys are refused.",
    "compare": "python -m bench compare <A.json> <B.json>\n  Two `ok` run records of the same "
               "task config (the same held-out sequences: metrics.held_out_digest): their gaps, "
               "the difference B − A of the models' mean losses with a 95% bootstrap interval "
               "over the paired sequences, and which is better or that they are not "
               "distinguishable; overall and by context-length band. Records without "
               "per-sequence losses (older ones, text) are refused.",
    "identities": "python -m bench identities [out_dir=results] [check=false]\n  The "
                  "behavioural identity (bench/reports/identity.py: training batches, held-out set, "
                  "references, initial parameters, schedule, three optimizer steps, scoring) of "
                  "every `ok` record's config under the commit that made it and under today's "
                  "code, kept in <out_dir>/identities.json, which the leaderboard, the claims and "
                  "the suite runner read: records whose identity today's code reproduces pool "
                  "with today's runs and count as current; the others are named as stale with "
                  "the parts that differ. Only what is missing is computed. check=true: compute "
                  "today's identities again and compare them with the index; exit 1 on a "
                  "difference.",
    "gpucheck": "python -m bench gpucheck [sections=env,tiny,paper,ddp,warm,parity,speed,lm,"
                "text,suite] [budget=450] [out=$OUT, else runs/gpucheck] [steps=20] "
                "[suite=paper000_gpu] [suite_entries=1-3] [tokenizer_file=<tokenizer.json>]\n"
                "  Every check of the GPU path in one call sized for a borrowed, cold GPU: "
                "sections most valuable first, each killed whole at its cap, every figure "
                "written to out/rows.jsonl as measured; without CUDA, a rehearsal of the "
                "sections that run on the CPU (bench/perf/gpucheck/).",
}


def fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def take_option(argv: list[str], key: str, default: str | None) -> tuple[list[str], str | None]:
    """Remove a command-specific `key=value` option from argv (given at most once)."""
    rest, values = [], []
    for arg in argv:
        (values if arg.startswith(f"{key}=") else rest).append(arg)
    if len(values) > 1:
        raise ConfigError(f"'{key}' is given twice; give each key once")
    return rest, values[0].split("=", 1)[1] if values else default


def positive_int(key: str, text: str, low: int = 1, high: int = 10 ** 9) -> int:
    """A command option's integer: plain decimal digits (not '²', which isdigit accepts, nor
    YAML 1.1's octal-looking '010') within [low, high]."""
    digits = text.strip()
    if (not re.fullmatch(r"[0-9]+", digits) or (len(digits) > 1 and digits[0] == "0")
            or int(digits) < low):
        raise ConfigError(f"{key}: invalid value '{text}'; expected an integer >= {low}")
    if int(digits) > high:
        raise ConfigError(f"{key}: {digits} is outside {low}..{high}")
    return int(digits)


def cmd_list(argv: list[str]) -> int:
    if argv:
        return fail(f"list takes no arguments, got '{argv[0]}'")
    for group in ("task", "model", "trainer"):
        print(f"{group}s:")
        for name in choices(group):
            print(f"  {name:<22} {describe_choice(group, name)}")
    return 0


def cmd_run(argv: list[str]) -> int:
    argv, dry = take_option(argv, "print_config", "false")
    if dry not in ("true", "false"):
        raise ConfigError(f"print_config must be true or false, got '{dry}'")
    config, task = composed_and_checked(argv)
    if dry == "true":
        print_config(config, task)
        return 0
    from bench.reports.report import print_run
    from bench.training.signals import end_distributed
    from bench.training.train import run
    try:
        record, path = run(config, task=task)  # the task the checks built
    finally:
        end_distributed()
    if path:
        print_run(record, path)
    return 0


def composed_and_checked(argv: list[str]) -> tuple:
    """The run's config and the task its checks built: composed first, without torch, so that a
    misspelt key or value is answered before the checks (which import torch and the task and
    model families, seconds of CPU) run; then every check a run makes before it starts."""
    from bench.config import compose
    config = compose(argv)
    from bench.training.checks import checked_task_of
    return config, checked_task_of(config)


def print_config(config, task) -> None:
    """The composed config and the memory estimate the run was checked against, as one YAML
    document: what `run` would do, seen before it spends anything."""
    import yaml
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
    from bench.reports.report import print_metrics
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


def default_report(out_dir: str, name: str) -> str:
    """Where leaderboard and claims write without out=: the published report at the top of the
    repository (leaderboard.md, claims.md) from the published records (out_dir=results), and a
    report of any other records beside them (runs/leaderboard.md), never over the published."""
    return name if Path(out_dir) == Path("results") else str(Path(out_dir) / name)


def previous_text(path: str) -> str | None:
    """The text of the report at `path` before it is rewritten: only a regular file's, never
    through a link, a FIFO or a device (which the writer refuses anyway), and at most 64 MiB."""
    import stat
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return None
        with open(path, "rb") as handle:
            return handle.read(64 << 20).decode(errors="replace")
    except OSError:
        return None


def tracked_note(path: Path, before: str | None) -> None:
    """One line when a report rewrote a file that git tracks (a published report)."""
    import subprocess
    try:
        tracked = subprocess.run(["git", "ls-files", "--error-unmatch", "--", path.name],
                                 cwd=path.resolve().parent, capture_output=True,
                                 timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return
    if tracked:
        after = previous_text(str(path))
        what = ("unchanged" if after == before else "rewritten: `git diff` shows what changed")
        print(f"note: {path} is tracked by git (a published report), {what}")


def cmd_leaderboard(argv: list[str]) -> int:
    argv, out_dir = take_option(argv, "out_dir", "results")
    argv, out = take_option(argv, "out", default_report(out_dir, "leaderboard.md"))
    argv, include = take_option(argv, "include", "suite")  # suite: suite records only
    if argv:
        raise ConfigError(f"unknown argument '{argv[0]}'; leaderboard takes out_dir=<dir>, "
                          "out=<file>, include=suite|all")
    from bench.reports.leaderboard import select_runs, write_leaderboard
    selection = select_runs(out_dir, include)
    for line in selection.warnings():  # before a possible error: they may be why it is empty
        print(line, file=sys.stderr)
    before = previous_text(out)
    path = write_leaderboard(selection, out)
    print(f"{path}: {selection.summary()}")
    tracked_note(Path(path), before)
    return 0


def check_paths(**paths: str) -> None:
    """The path options given (not empty) are paths the file system can take (check_path)."""
    from bench.config import check_path
    for option, path in paths.items():
        if path:
            check_path(option, path, folder=option == "out_dir")


def cmd_claims_plan(argv: list[str]) -> int:
    given = [a for a in argv if not a.startswith("out=")]  # named in the suite file it writes
    argv, out_dir = take_option(argv, "out_dir", "results")
    argv, out = take_option(argv, "out", "")
    argv, include = take_option(argv, "include", "suite")
    argv, rules = take_option(argv, "rules", "")
    argv, budget = take_option(argv, "budget_h", "")
    if argv:
        raise ConfigError(f"unknown argument '{argv[0]}'; claims plan takes out_dir=<dir>, "
                          "out=<suite.yaml>, budget_h=<hours>, include=suite|all, "
                          "rules=<file or folder>")
    check_paths(out_dir=out_dir, out=out, rules=rules)
    import math
    from bench.records.store import output_path
    budget_s = None
    if budget:
        try:
            budget_s = float(budget) * 3600
        except ValueError:
            budget_s = math.nan
        if not (math.isfinite(budget_s) and budget_s > 0):
            raise ConfigError(f"budget_h: invalid value '{budget}'; expected a positive number "
                              "of hours")
    if out and not out.endswith((".yaml", ".yml")):
        raise ConfigError(f"out '{out}' must be a suite file ending in .yaml")
    out_path = output_path(out) if out else None
    from bench.reports.claims import decide_all, load_claims
    from bench.reports.claims.plan import power_plan
    from bench.reports.leaderboard import select_runs
    claims = load_claims(rules or None)
    selection = select_runs(out_dir, include)
    for line in selection.warnings():
        print(line, file=sys.stderr)
    command = " ".join(["python -m bench claims plan", *given])
    print(power_plan(decide_all(claims, selection), budget_s, out_path, command, out_dir))
    return 0


def cmd_claims(argv: list[str]) -> int:
    if argv[:1] == ["plan"]:
        return cmd_claims_plan(argv[1:])
    argv, out_dir = take_option(argv, "out_dir", "results")
    argv, out = take_option(argv, "out", default_report(out_dir, "claims.md"))
    argv, include = take_option(argv, "include", "suite")
    argv, rules = take_option(argv, "rules", "")
    argv, check = take_option(argv, "check", "false")
    if argv:
        raise ConfigError(f"unknown argument '{argv[0]}'; claims takes out_dir=<dir>, "
                          "out=<file>, include=suite|all, rules=<file or folder>, "
                          "check=true|false")
    check_paths(out_dir=out_dir, out=out, rules=rules)
    if check not in ("true", "false"):
        raise ConfigError(f"check must be true or false, got '{check}'")
    from bench.reports.claims import decide_all, load_claims, write_claims
    from bench.reports.claims.check import problems
    from bench.reports.claims.render import verdict_counts
    from bench.reports.leaderboard import plural, select_runs
    claims = load_claims(rules or None)  # bad rules are reported before the records are read
    selection = select_runs(out_dir, include)
    for line in selection.warnings():
        print(line, file=sys.stderr)
    if check == "true":  # the research checks of the records; claims.md is not written
        found = problems(decide_all(claims, selection))
        for problem in found:
            print(f"error: {problem}", file=sys.stderr)
        print(f"{plural(len(claims), 'claim')} checked against {selection.summary()}: "
              f"{plural(len(found), 'problem')}")
        return 1 if found else 0
    before = previous_text(out)
    path, decisions = write_claims(selection, out, rules or None, claims)
    print(f"{path}: {verdict_counts(decisions)} from {selection.summary()}")
    tracked_note(Path(path), before)
    return 0


def cmd_speed(argv: list[str]) -> int:
    argv, steps = take_option(argv, "steps", "20")
    steps = positive_int("steps", steps, high=100_000)  # a bound: steps=10^30 never ended
    argv, kernels = take_option(argv, "kernels", "all")
    argv, precisions = take_option(argv, "precisions", "all")
    argv, compiles = take_option(argv, "compile", "all")
    argv, out = take_option(argv, "out", "")
    from bench.config import PRECISIONS
    from models.configs import KERNELS
    for key, value, allowed in (("kernels", kernels, ("all", *KERNELS)),
                                ("precisions", precisions, ("all", *PRECISIONS)),
                                ("compile", compiles, ("all", "on", "off"))):
        if value not in allowed:
            raise ConfigError(f"{key}: invalid value '{value}'; expected one of "
                              f"{', '.join(allowed)}")
    if out and not os.access(os.path.dirname(os.path.abspath(out)), os.W_OK):
        raise ConfigError(f"out={out}: its folder does not exist or is not writable")
    if out:
        from bench.records.store import output_path
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
        from bench.records.store import write_json
        write_json(out, result)
        print(f"written: {out}")
    return 0


def cmd_eval(argv: list[str]) -> int:
    argv, weights = take_option(argv, "weights", "")
    if not weights:
        raise ConfigError("eval needs weights=<file> (a run's out_dir/weights/<run_id>.pt)")
    from bench.config import check_path
    check_path("weights", weights)
    from bench.training.weights import check_eval_overrides, eval_config, load_weights
    check_eval_overrides(argv)  # a refused key is refused before the file is read
    payload = load_weights(weights)
    config, task = eval_config(payload, argv)
    from bench.reports.report import print_run
    from bench.training.signals import end_distributed
    from bench.training.train import run
    try:
        record, path = run(config, weights=payload, weights_path=weights, task=task)
    finally:
        end_distributed()
    if path:
        print_run(record, path)
    return 0


def cmd_compare(argv: list[str]) -> int:
    from bench.reports.compare import compare, print_comparison, select_pair
    options = [arg for arg in argv if "=" in arg and not os.path.exists(arg)]
    if options and len(options) == len(argv):  # by selection: model=mamba,transformer ...
        print_comparison(compare(*select_pair(argv)))
        return 0
    if options:
        raise ConfigError(f"unknown argument '{options[0]}'; compare takes two record files, "
                          "or settings that select them (model=mamba,transformer ...)")
    if len(argv) != 2:
        raise ConfigError(f"compare needs two run records (A.json B.json), got {len(argv)}; or "
                          "settings that select them: compare task=<task> model=<a>,<b> [seed=N]")
    print_comparison(compare(*argv))
    return 0


def cmd_gpucheck(argv: list[str]) -> int:
    from bench.perf.gpucheck.driver import main as gpucheck
    return gpucheck(argv)


def cmd_identities(argv: list[str]) -> int:
    argv, out_dir = take_option(argv, "out_dir", "results")
    argv, check = take_option(argv, "check", "false")
    if argv:
        raise ConfigError(f"unknown argument '{argv[0]}'; identities takes out_dir=<dir>, "
                          "check=true|false")
    if check not in ("true", "false"):
        raise ConfigError(f"check must be true or false, got '{check}'")
    if not os.path.isdir(out_dir):
        raise ConfigError(f"out_dir '{out_dir}' is not a directory")
    from bench.reports.identities import report_identities
    return report_identities(out_dir, check == "true")


def cmd_plot(argv: list[str]) -> int:
    argv, out = take_option(argv, "out", "")
    options = [arg for arg in argv if "=" in arg and not os.path.exists(arg)]
    if options:
        raise ConfigError(f"unknown argument '{options[0]}'; plot takes record files or "
                          "directories and out=<file.png>")
    if not argv:
        raise ConfigError("plot needs a run record (.json) or a directory of them")
    from bench.reports.plot import plot_runs
    from bench.records.store import output_path, read_record, read_records
    records, bad = [], []
    for arg in argv:
        path = Path(arg)
        if path.is_dir():
            found, skipped = read_records(path)
            records += found
            bad += skipped
        elif path.is_file():
            record, reason = read_record(path)
            (records.append(record) if record else bad.append((arg, reason)))
        else:
            raise ConfigError(f"plot: '{arg}' is neither a record file nor a directory")
    usable = []
    for record in records:
        why = f"status {record.get('status')!r}" if record.get("status") != "ok" else None
        (bad.append((record["_path"], why)) if why else usable.append(record))
    for path, reason in bad:
        print(f"warning: skipped {path}: {reason}", file=sys.stderr)
    if not usable:
        raise ConfigError("plot: no usable `ok` run record among the paths given")
    if not out:
        first = Path(argv[0])
        out = str(first.with_suffix(".png") if first.is_file() and len(usable) == 1
                  else (first / "curves.png" if first.is_dir() else Path("curves.png")))
    print(plot_runs(usable, output_path(out)))
    return 0


def take_selection(argv: list[str]) -> tuple[list[str], tuple[int, int], str | None, bool]:
    """The options a suite and a sweep share: shard=i/n, entries=1,4-6 and rerun=true|false."""
    argv, shard = take_option(argv, "shard", "0/1")  # i/n: entries i, i+n, ... (parallel workers)
    argv, rerun = take_option(argv, "rerun", "false")
    argv, entries = take_option(argv, "entries", None)  # None: every entry; "": refused
    if rerun not in ("true", "false"):
        raise ConfigError(f"rerun must be true or false, got '{rerun}'")
    found = re.fullmatch(r"([0-9]+)/([0-9]+)", shard)  # not int(): it reads '１', ' 1', '1_0'
    if found is None or not 0 <= int(found[1]) < int(found[2]):
        raise ConfigError(f"shard must be i/n with 0 <= i < n, got '{shard}'")
    return argv, (int(found[1]), int(found[2])), entries, rerun == "true"


def cmd_suite(argv: list[str]) -> int:
    """Each suite entry is a list of overrides; `argv` (e.g. out_dir=DIR) is added to every one.
    A suite writes to runs/ (git-ignored), like every run, unless out_dir= is given: maintainers
    publish with out_dir=results, the records the committed boards and claims read."""
    argv, name = take_option(argv, "name", "")
    argv, *selection = take_selection(argv)
    from bench.config import load_suite, suite_label
    if not name:
        return fail(f"suite needs name=<suite> or name=<file.yaml>; suites: "
                    f"{', '.join(choices('suite'))}")
    from bench.cli.suites import run_entries
    return run_entries(f"suite {name}", load_suite(name), argv, *selection,
                       origin=f"suite:{suite_label(name)}")


def cmd_sweep(argv: list[str]) -> int:
    """The grid of the command line's comma lists and ranges (bench/config/sweep.py), run as a suite
    is: numbered entries, shard=, entries=, rerun=; records go to out_dir (default runs/)."""
    argv, *selection = take_selection(argv)
    from bench.cli.suites import run_entries
    from bench.config.sweep import grid
    entries, shared = grid(argv)
    return run_entries("the sweep", entries, shared, *selection, origin="sweep")


def main(argv: list[str] | None = None) -> int:
    # Idle OpenMP threads sleep instead of spinning. Torch's CPU threads spin-wait between the
    # many small ops of these models; when another process shares the cores, spinning threads
    # steal each other's time and a run is ~5x slower (README "Threads"). The OpenMP runtime
    # reads it once, when torch loads it: `python -m bench` has loaded only bench, bench.config.commands
    # and bench.config (no torch) when main starts, so it is set first thing here, not at import
    # (importing bench changes no environment). A value in the environment wins.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(__doc__.strip())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        return fail(f"unknown command '{command}'; choose one of: {', '.join(COMMANDS)}")
    if any(arg in ("-h", "--help", "help") for arg in rest):
        print(USAGE[command])
        return 0
    flag = next((arg for arg in rest if arg.startswith("-")), None)
    if flag is not None:
        return fail(f"unknown option '{flag}'; arguments are key=value (python -m bench "
                    f"{command} --help)")
    from bench.records.store import RunFailed, SignalAfterRecord
    try:
        code = {"run": cmd_run, "references": cmd_references, "leaderboard": cmd_leaderboard,
                "claims": cmd_claims, "speed": cmd_speed, "suite": cmd_suite, "sweep": cmd_sweep,
                "list": cmd_list, "gpucheck": cmd_gpucheck, "plot": cmd_plot,
                "eval": cmd_eval, "compare": cmd_compare,
                "identities": cmd_identities}[command](rest)
        if code and command in ("suite", "sweep"):
            from bench.training.signals import wait_for_rank_zero
            wait_for_rank_zero()  # a DDP rank leaves after rank 0, so rank 0's exit is its own
        return code
    except ConfigError as error:
        return fail(str(error))
    except RunFailed as error:  # the run started: its `failed` record says the rest
        where = f" (record: {error.path})" if error.path else ""
        print(f"error: run failed: {error.reason}{where}", file=sys.stderr)
        from bench.training.signals import wait_for_rank_zero
        wait_for_rank_zero()  # a DDP rank leaves after rank 0, so rank 0's exit is its own
        return error.exit_code
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except SignalAfterRecord as error:  # the run ended well; the signal stops the rest
        print(f"error: {error}", file=sys.stderr)
        return 128 + error.signum
    except BrokenPipeError:  # `python -m bench list | head`: the reader left, nothing to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except Exception as error:  # a bug, not a user error: one line unless asked for the trace
        if os.environ.get("BENCH_DEBUG"):
            raise
        print(f"error: internal error: {type(error).__name__}: {first_line(error)} "
              "(BENCH_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
