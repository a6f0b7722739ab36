"""The suite runner: the entries of a suite or a sweep composed and checked before the first
runs, each run in turn unless a record already finishes it (finished_runs), and a sweep's table
at the end. `python -m bench suite` and `sweep` (bench/cli/main.py) parse their command lines and
call run_entries."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

from bench.config import MAX_RUNS, ConfigError, compose, entry_numbers, shown
from bench.config.formats import plural
from bench.records import store
from bench.records.store import (RunFailed, environment, read_record, read_records, record_matches,
                                 run_id_prefix)
from bench.reports.identities import fill_current, load_index
from bench.reports.report import config_table, headline
from bench.reports.selection import code_version


def origin_kind(origin) -> str:
    """"suite", "sweep" or "adhoc" (records without an origin predate it: ad hoc)."""
    return str(origin or "adhoc").split(":", 1)[0]


def finishes(record_origin, config_origin) -> bool:
    """Whether a record made as record_origin finishes a run about to be made as config_origin:
    a suite entry only a suite's record (any suite's: boards and claims pool suite records
    only, so an ad-hoc run's or a sweep's would leave a hole in them); a sweep entry any record
    of the run, ad hoc, a sweep's or a suite's (its table pools what exists); an ad-hoc run is
    never finished (`run` always trains)."""
    kind = origin_kind(config_origin)
    return kind == "sweep" or (kind == "suite" and origin_kind(record_origin) == "suite")


def finished_runs(configs: list) -> dict[int, str]:
    """{index in configs: record path} of the configs that have an `ok` record that finishes
    them (`finishes`) in their out_dir, with the same seed, in the
    environment the run would train in here (checks.planned_environment: a CPU record does not
    finish a GPU run, nor the reverse), made by the current code version (records.code_digest)
    from a clean checkout, or by code whose behavioural identity for the config is today's
    (<out_dir>/identities.json; today's identity is computed here, a few seconds per config,
    where such a record waits for it). Nothing counts as finished when the code version is
    unknown or dirty: then nobody can tell that the record's code is the code about to run."""
    from bench.training.checks import planned_environment
    here = store.provenance()  # looked up at the call: tests stand in other code versions
    if not here["code"] or here["dirty"] is not False:
        return {}
    by_dir: dict[str, list[dict]] = {}
    candidates: dict[int, list[dict]] = {}  # config -> its records, by whatever code
    pairs: dict[str, set] = {}  # a record matches only runs of its task and model: only
    for config in configs:  # theirs are read (results/ is 1,000 records, 8 s to read whole)
        pairs.setdefault(config.out_dir, set()).add((config.task_name, config.model_name))
    for i, config in enumerate(configs):
        planned = planned_environment(config)
        if config.out_dir not in by_dir:
            found, bad = read_records(config.out_dir, pairs[config.out_dir]) \
                if os.path.isdir(config.out_dir) else ([], [])
            for path, reason in bad:  # a damaged record's run runs again: say which file
                print(f"warning: skipped {path}: {reason}; it finishes no run", file=sys.stderr)
            by_dir[config.out_dir] = [r for r in found if r.get("status") == "ok"]
        for record in by_dir[config.out_dir]:
            try:
                same = (type(record.get("seed")) is int and record["seed"] == config.seed
                        and finishes(record.get("origin"), config.origin)
                        and record_matches(record, config)
                        and environment(record) == planned)
            except (KeyError, TypeError):  # a malformed record proves nothing
                same = False
            if same:
                candidates.setdefault(i, []).append(record)
    done = {}
    indexes = {}
    for i, records in candidates.items():
        out_dir = configs[i].out_dir
        if out_dir not in indexes:
            indexes[out_dir] = load_index(out_dir, today=here["code"])
        index = indexes[out_dir]
        for record in records:
            if code_version(record) == (here["code"], False):
                done[i] = record["_path"]
                break
        else:  # records of other code: done if today's code reproduces what theirs did
            known = [r for r in records if index.own(r) is not None]
            if known and fill_current(index, known, (here["code"], here["commit"])):
                print(f"computed today's identity of a config with records of other code in "
                      f"{out_dir}", file=sys.stderr)
            same = [r for r in known if index.is_current(r)]
            if same:
                done[i] = same[0]["_path"]
    return done


def run_entries(what: str, entries: list[list[str]], argv: list[str], shard: tuple[int, int],
                chosen: str | None, rerun: bool, origin: str, defaults: list[str] = (),
                dispatch=None, plan: tuple[int, int | None, bool] | None = None) -> int:
    """Runs the entries (override lists) of a suite or sweep chosen by `chosen` (entries=) and
    `shard`, each with argv's overrides over its own and `defaults` under both; all are
    composed and validated before the first one runs: here one after another, or by `dispatch`
    (bench/cli/launch.py: worker processes, a SLURM job array), which takes them as composed
    override lists and returns the exit status. With `plan` (plan=true: the workers and each
    one's CPU threads, None on GPUs) nothing runs: print_plan says what is done and what the
    rest would cost on them."""
    size = len(entries)
    if size > MAX_RUNS:  # what load_suite and the sweep's grid refuse, whoever made the list
        raise ConfigError(f"{what} has {size} runs; at most {MAX_RUNS}")
    numbers = entry_numbers(chosen, size) if chosen is not None else list(range(1, size + 1))
    index, count = shard
    numbers = numbers[index::count]
    if not numbers:
        raise ConfigError(f"shard {index}/{count} of {what} holds no run")
    keys = {arg.split("=", 1)[0] for arg in argv}

    def merged(entry: list[str]) -> list[str]:  # a command-line key replaces the entry's own
        return [arg for arg in entry if arg.split("=", 1)[0] not in keys] + argv

    def unless_given(entry: list[str]) -> list[str]:
        given = {arg.split("=", 1)[0] for arg in entry}
        return [arg for arg in defaults if arg.split("=", 1)[0] not in given]

    def twice(first: int, number: int, run: list[str]) -> ConfigError:
        why = (f"; the command line's {shown(' '.join(argv))} replaces what tells them apart"
               if argv else "")
        return ConfigError(f"entries {first} and {number} of {what} are the same run "
                           f"({shown(' '.join(run) or '(defaults)')}){why}; list each run once")

    runs = [merged(entries[n - 1]) for n in numbers]
    seen: dict = {}
    for number, entry in zip(numbers, runs):  # before composing: that is the slow part
        first = seen.setdefault(tuple(sorted([*unless_given(entry), *entry])), number)
        if first != number:
            raise twice(first, number, entry)

    def in_entry(number: int, error: ConfigError) -> ConfigError:
        own = " ".join(entries[number - 1])
        return ConfigError(f"entry {number} of {what}" + (f" ({shown(own)})" if own else "")
                           + f": {error}")

    configs = []
    for number, entry in zip(numbers, runs):  # composed first (no torch): a typo fails at once
        try:
            configs.append(compose([*unless_given(entry), *entry]))
        except ConfigError as error:
            raise in_entry(number, error) from None
    from bench.training.checks import checked_task_of
    tasks, composed = [], {}
    started = last = time.monotonic()
    for i, (number, entry, config) in enumerate(zip(numbers, runs, configs)):
        if time.monotonic() - last > 5:  # a long list: say it is being checked, not stuck
            last = time.monotonic()
            print(f"checking the entries of {what}: {i} of {len(numbers)} in "
                  f"{last - started:.0f} s", flush=True)
        try:
            tasks.append(checked_task_of(config))
        except ConfigError as error:
            raise in_entry(number, error) from None
        described = config.describe()
        described.pop("overrides")  # `task=markov` and the default task are one run
        first = composed.setdefault(json.dumps([described, config.out_dir, config.resume],
                                               sort_keys=True, default=str), number)
        if first != number:  # written differently (a default given): said, not refused, as a
            # shipped suite has such pairs (paper000_gpu: model.d_conv=4 is mamba's default)
            print(f"warning: entries {first} and {number} of {what} compose the same run "
                  f"({shown(' '.join(entry) or '(defaults)')}); both run", file=sys.stderr)
    for config in configs:
        config.origin = origin
    if plan is not None:
        print_plan(what, size, numbers, [entries[n - 1] for n in numbers], configs, rerun,
                   *plan, tasks=tasks)
        return 0
    if dispatch is not None:
        return dispatch(what, size, numbers, [[*unless_given(e), *e] for e in runs], origin,
                        rerun, [config.out_dir for config in configs])
    from bench.training.signals import end_distributed
    try:
        return run_suite(what, size, numbers, runs, configs, rerun, tasks)
    finally:
        end_distributed()


def pricing_folders(configs: list) -> list[str]:
    """Where entries are priced from: the entries' out_dirs, then results/ where it exists."""
    return list(dict.fromkeys([*(config.out_dir for config in configs),
                               *(["results"] if os.path.isdir("results") else [])]))


def entry_prices(configs: list, share: int | None, folders: list[str],
                 computing: list[bool] | None = None) -> tuple[list, list]:
    """Each config's Price (bench/reports/costs.py) from the records in `folders`, on its planned
    device; a CPU run at its trainer.threads, else at `share` threads (a launcher worker's share
    of the cores); and, where `computing` says the run computes its held-out set's references,
    their Price (references_price), else None. A price reads only runs of its own task and
    model, so only theirs are read."""
    from bench.reports.costs import price, references_price
    from bench.training.checks import planned_environment
    runs_of = {(config.task_name, config.model_name) for config in configs}
    records = [r for folder in folders if os.path.isdir(folder)
               for r in read_records(folder, runs_of)[0] if r.get("status") == "ok"]
    prices, references = [], []
    for config, computes in zip(configs, computing or [False] * len(configs)):
        device = planned_environment(config).device
        wanted = (config.trainer.threads or share) if device == "cpu" else None
        prices.append(price(config, records, device, wanted))
        references.append(references_price(config, records, device) if computes else None)
    return prices, references


def computes_references(configs: list, tasks: list) -> list[bool | None]:
    """Whether each run, in this order, would compute its held-out set's references: every run
    with trainer.reference_cache=false; else the first of those sharing a held-out set that
    out_dir's cache lacks (a file of its key: bench/training/reference_cache.py), the others
    reading what it cached. None where the cache key cannot be formed (the task's data)."""
    from bench.training import reference_cache
    seen, computes = set(), []
    for config, task in zip(configs, tasks):
        if not config.trainer.reference_cache:
            computes.append(True)
            continue
        try:
            path = reference_cache.cache_path(config.out_dir, task, config.trainer.eval_sequences)
        except (ConfigError, OSError):
            computes.append(None)
            continue
        computes.append(path not in seen and not path.is_file())
        seen.add(path)
    return computes


def measured_prices(configs: list, share: int | None) -> tuple[list[float | None], int]:
    """Each CPU config's training time at today's step on this machine now: its steps times the
    bare step (bench/perf/speed.py time_training: forward, backward and AdamW on one batch, 10
    after 3 of warm-up, at its threads or `share`), measured once per task, model, batch and
    precision; None for a run planned on a GPU. Also how many setups were measured."""
    import torch
    from bench.perf.speed import time_training
    from bench.training.checks import planned_environment
    step_s: dict[str, float] = {}
    prices: list[float | None] = []
    threads_before = torch.get_num_threads()
    try:
        for config in configs:
            if planned_environment(config).device != "cpu":
                prices.append(None)
                continue
            threads = config.trainer.threads or share or threads_before
            key = json.dumps([config.task_name, dataclasses.asdict(config.task),
                              config.model_name, dataclasses.asdict(config.model),
                              config.trainer.batch_size, config.trainer.precision, threads],
                             sort_keys=True, default=str)
            if key not in step_s:
                torch.set_num_threads(threads)
                step_s[key] = time_training(config, torch.device("cpu"), steps=10)["step_s"]
            prices.append(step_s[key] * config.trainer.max_steps)
    finally:
        torch.set_num_threads(threads_before)
    return prices, len(step_s)


def print_plan(what: str, size: int, numbers: list[int], entries: list[list[str]],
               configs: list, rerun: bool, workers: int, share: int | None,
               measure: bool = False, tasks: list | None = None) -> None:
    """What `suite ... plan=true` prints: the entries finished already (finished_runs) with the
    run time their records took, and each entry still to run priced from the records in its
    out_dir and in results/ (bench/reports/costs.py: its own record of other code, its config's
    other seeds, its task and model's time a step), with the wall time that `workers` local
    workers would take for them, each with `share` CPU threads (the launcher's share of the
    cores); `measure`: also the training time at the step measured here now (measured_prices),
    beside them; a run that would compute its held-out set's references (computes_references:
    `tasks` are the configs' built tasks) has their price added, from the records that computed
    them. Trains nothing, writes nothing."""
    from bench.reports.costs import duration, launcher_wall, made_on, wall_time
    here = store.provenance()
    done = {} if rerun else finished_runs(configs)
    folders = pricing_folders(configs)

    def short(seconds: float) -> str:
        return f"{seconds:.0f} s" if seconds < 90 else duration(seconds)

    print(f"plan of {what}: {plural(len(numbers), 'run')}"
          + (f" of {size}" if len(numbers) != size else "")
          + f"; records read from {', '.join(folders)}")
    if rerun:
        why = " (rerun=true: every run runs again)"
    elif not here["code"] or here["dirty"] is not False:
        why = (" (this checkout has uncommitted changes, or no known code version: no record "
               "counts as finished, so every run would run)")
    else:
        finishing = [read_record(Path(path))[0] or {} for path in done.values()]
        took = sum(wall_time(record) or 0.0 for record in finishing)
        days = sorted(made_on(record) for record in finishing)
        span = " to ".join(dict.fromkeys(days[:1] + days[-1:]))
        why = f", whose records (made {span}) took {duration(took)} of run time" if done else ""
    print(f"  done: {len(done)}{why}")
    pending = [i for i in range(len(configs)) if i not in done]
    print(f"  to run: {len(pending)}")
    seconds, unknown, thread_counts = [0.0] * len(configs), 0, set()
    computing = computes_references([configs[i] for i in pending], [tasks[i] for i in pending]) \
        if tasks is not None else [False] * len(pending)
    prices, references = entry_prices([configs[i] for i in pending], share, folders, computing)
    now, setups = (measured_prices([configs[i] for i in pending], share) if measure
                   else ([None] * len(pending), 0))
    unpriced_references = 0
    for i, found, refs, computes, measured in zip(pending, prices, references, computing, now):
        seconds[i] = (found.seconds or 0.0) + (refs.seconds or 0.0 if refs else 0.0)
        unknown += found.seconds is None
        thread_counts |= found.threads
        cost = short(seconds[i]) if found.seconds is not None else "?"
        here_now = f"  now {short(measured):>7}" if measured is not None else ""
        print(f"    [{numbers[i]}/{size}] {cost:>7}{here_now}  "
              f"{' '.join(entries[i]) or '(defaults)'}  ({found.source})")
        if refs is not None:
            unpriced_references += refs.seconds is None
            said = f"{short(refs.seconds)} of it" if refs.seconds is not None else "not priced"
            where = f"not cached in {configs[i].out_dir}" if configs[i].trainer.reference_cache \
                else "trainer.reference_cache=false"
            print(f"            its held-out set's references, {where}: {said} ({refs.source})")
        elif computes is None:
            print(f"            whether its held-out set's references are cached in "
                  f"{configs[i].out_dir} is not known (not priced)")
    if not pending:
        return
    counts = " or ".join(map(str, sorted(thread_counts)))
    print(f"  priced at {duration(sum(seconds))} of run time"
          + (f" (records of {counts} thread(s) a run)" if counts else "")
          + (f"; {unknown} not priced: no record of their task and model" if unknown else "")
          + (f"; the references of {unpriced_references} held-out set(s) not priced"
             if unpriced_references else ""))
    print(f"  at workers={workers}: about {duration(launcher_wall(seconds, workers))} of wall "
          "time, the runs dealt as the launcher deals them (the records' machine and load, not "
          "a measurement here)")
    if setups:
        training = [0.0] * len(configs)  # the measured training, in entry order for the launcher
        for i, measured in zip(pending, now):
            training[i] = measured or 0.0
        both = [(found.seconds, measured) for found, measured in zip(prices, now)
                if found.seconds is not None and measured is not None]  # priced both ways
        ratio = sum(record for record, _ in both) / sum(step for _, step in both) if both else 0
        print(f"  measured here now ({plural(setups, 'setup')}, bare steps: forward, backward "
              "and AdamW; a floor, without start-up, evaluation, references or Lightning's own "
              f"work): {duration(sum(training))} of training, about "
              f"{duration(launcher_wall(training, workers))} of wall time at workers={workers}"
              + (f"; the records' prices are {ratio:.1f}x that" if both else ""))


def run_suite(what: str, size: int, numbers: list[int], suite: list[list[str]],
              configs: list, rerun: bool, tasks: list | None = None) -> int:
    """Runs the entries of a suite or sweep in turn (one process group for all of them under
    DDP), each unless finished_runs finds it done; `tasks`: each entry's task as the checks
    built it (checked_task_of), which its run trains on and then lets go (a pool of training
    tasks can be large).

    Each entry runs under its lock (bench/records/locks.py), as a launcher's workers' do: two
    runners on one out_dir (the same suite started twice, on two machines sharing a folder, or
    beside a launcher) never run one entry. An entry another living process holds is passed
    and come back to when its lock goes: skipped if that run finished it (unless rerun), else
    run. A DDP run's ranks run every entry together and take no lock."""
    from bench.records.locks import run_lock_key, try_lock
    from bench.training.devices import world_size
    listed = listings(configs)  # before the reading: a record written after it is seen new
    done = {} if rerun else finished_runs(configs)
    tasks = dict(enumerate(tasks)) if tasks is not None else {}
    failed, paths, announced = [], [], set()

    def skip(i: int, path: str) -> None:
        print(f"    done already -> {path}", flush=True)
        paths.append(path)
        tasks.pop(i, None)

    pending = list(range(len(configs)))
    while pending:
        held_elsewhere = []
        for i in pending:
            number, config = numbers[i], configs[i]
            header = f"[{number}/{size}] {' '.join(suite[i]) or '(defaults)'}"
            if i in done:
                print(header, flush=True)
                skip(i, done[i])
                continue
            alone = world_size(config) == 1
            lock = try_lock(config.out_dir, run_lock_key(config)) if alone else None
            if alone and lock is None:
                if i not in announced:
                    announced.add(i)
                    print(f"{header}: another process runs it; back to it when it is done",
                          flush=True)
                held_elsewhere.append(i)
                continue
            with lock or contextlib.nullcontext():
                print(header, flush=True)
                elsewhere = "" if rerun else finished_since(config, listed[config.out_dir])
                if elsewhere:  # another runner finished it since this one began
                    skip(i, elsewhere)
                    continue
                status, path = run_entry(config, tasks.pop(i, None), resume=not rerun)
            if status == "failed":
                failed.append(number)
            elif path:  # a DDP rank other than 0 has none: rank 0 reports
                paths.append(path)
        pending = held_elsewhere
        if pending:
            time.sleep(1.0)
    if what == "the sweep" and paths:  # what a sweep is for: its table, seeds pooled per config
        print_sweep_table(paths)
    if failed:
        print(f"error: {len(failed)} of {len(configs)} runs of {what} failed (entries "
              f"{', '.join(map(str, failed))}); their failed records say why", file=sys.stderr)
        return 1
    return 0


def listings(configs: list) -> dict[str, frozenset[str]]:
    """The names of the files in each config's out_dir now (none where it does not exist)."""
    return {out_dir: frozenset(os.listdir(out_dir)) if os.path.isdir(out_dir) else frozenset()
            for out_dir in {config.out_dir for config in configs}}


def finished_since(config, names_before: frozenset[str]) -> str:
    """The record that finishes config (finished_runs) among those written since out_dir held
    `names_before`, by another runner or worker; "" when none. Only a new file named as a run of
    its task, model and seed is worth reading, so a runner that finds none reads nothing."""
    prefix = run_id_prefix(config.task_name, config.model_name, config.seed)
    if not any(name.startswith(prefix) and name.endswith(".json") and name not in names_before
               for name in listings([config])[config.out_dir]):
        return ""
    return finished_runs([config]).get(0, "")


def interrupted_checkpoint(config) -> str:
    """Where an interrupted earlier run of this entry can go on from: the newest checkpoint in
    out_dir/checkpoints/ of a run of its task, model and seed that was interrupted (a failed
    record that says so, or no record at all: killed, or preempted on SLURM) and that
    check_resume accepts for it (same task, model, seed, trainer settings, environment and
    code; its digest intact, so a checkpoint cut short by the kill is passed over). "" when
    there is none, when the entry resumes from a checkpoint of its own (resume=), or when its
    trainer writes none (trainer.checkpoint_every=0: the run starts again)."""
    if config.resume or config.trainer.checkpoint_every <= 0:
        return ""
    from bench.training.checks import check_resume  # torch: not at the CLI's import
    prefix = run_id_prefix(config.task_name, config.model_name, config.seed)
    runs = Path(config.out_dir) / "checkpoints"
    candidates = []
    for folder in runs.glob(f"{prefix}*") if runs.is_dir() else []:
        record, _ = read_record(Path(config.out_dir) / f"{folder.name}.json")
        if record is not None and not (record.get("status") == "failed" and str(
                record.get("reason", "")).startswith("interrupted")):
            continue  # finished, or failed for a reason a resume would meet again
        candidates += [p for p in folder.glob("*.ckpt") if p.is_file() and not p.is_symlink()]
    candidates.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    refused = []
    for path in candidates:
        try:
            check_resume(dataclasses.replace(config, resume=str(path)))
        except ConfigError as error:
            refused.append(error)
            continue
        return str(path)
    if refused:  # said once: the entry starts again
        print(f"    starting from step 0: {len(refused)} checkpoint(s) of an interrupted run "
              f"do not fit this entry ({refused[0]})", flush=True)
    return ""


def run_entry(config, task=None, stop_signals: tuple = (), resume: bool = False
              ) -> tuple[str, str]:
    """One entry's run, said in a line: ("ok", record path), ("failed", its failed record's path
    or ""); an interrupted run raises its RunFailed, as the whole suite is to stop. One run's
    failure (its record says why) does not cost the rest of the suite. `resume`: go on from an
    interrupted earlier run's checkpoint (interrupted_checkpoint) where there is one.
    `stop_signals`: signals besides SIGINT, SIGTERM and SIGHUP that stop the run at its next
    step (a SLURM array task's preemption signal)."""
    from bench.training.train import run
    checkpoint = interrupted_checkpoint(config) if resume else ""
    if checkpoint:
        print(f"    resuming the interrupted run from {checkpoint}", flush=True)
        config = dataclasses.replace(config, resume=checkpoint)
    try:
        record, path = run(config, task=task, stop_signals=stop_signals)
    except RunFailed as error:
        if error.exit_code > 128:  # interrupted: the user wants the whole suite to stop
            raise
        print(f"    failed: {error.reason}" + (f" -> {error.path}" if error.path else ""),
              flush=True)
        return "failed", error.path or ""
    if path:
        print(f"    {headline(record['metrics'])} in {record['wall_time_s']:.0f} s -> {path}",
              flush=True)
    return "ok", path


def print_sweep_table(paths: list[str]) -> None:
    records = [record for path in paths if (record := read_record(Path(path))[0]) is not None
               and record.get("status") == "ok"]
    if records:
        print("\n" + "\n".join(config_table(records)))
