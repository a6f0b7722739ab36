"""What `python -m bench --help` and `python -m bench <command> --help` print."""
from __future__ import annotations

from bench.config import choices

HELP = """python -m bench <command> [key=value ...]

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
  compare      models on one held-out set: across shared seeds, or two runs by sequence
  export       every ok record of a folder as one table (out=records.csv|.parquet)
  identities   what each record's config does under its code and today's: which records are current

python -m bench <command> --help   that command's usage
"""

OVERRIDES = ("  task=<name> model=<name> trainer=<name>   a file of conf/task, conf/model, conf/trainer\n"
             "  task.<field>=v model.<field>=v trainer.<field>=v   one field of it\n"
             "  seed=<int> out_dir=<dir> name=<tag> resume=<checkpoint>")
LAUNCHER = ("  [launcher=local] [workers=N]: N worker processes, each on one GPU or its share of "
            "the cores, no entry run twice (docs/reference.md, suites on several processes).\n"
            "  launcher=slurm [slurm.partition=p] [slurm.time_min=240] [slurm.gpus_per_task=g] "
            "[slurm.cpus_per_task=2] [slurm.array_parallelism=k] [slurm.tasks=n] "
            "[slurm.sbatch=\"key=value;...\"]: one SLURM job array through submitit.")
PLAN = ("  [plan=true]: run nothing; say which runs are done and price the rest from the "
        "records in out_dir and results/ (a run's own record of other code, its config's other "
        "seeds, its task and model's time a step), with the wall time on workers=N. "
        "[measure=true]: also time the step here now (10 bare steps a setup) and price the "
        "runs' training by it, beside the records' prices.\n")
USAGE = {
    "run": "python -m bench run [print_config=false] [details=false] [key=value ...]\n  Train "
           "one model on one task, evaluate it on the held-out set, write a run record to out_dir "
           "(default runs/, git-ignored). print_config=true: print the composed config and the "
           "memory estimate as YAML and exit without training. details=true: print the task's "
           "own metrics too (probes, per-length tables; always in the record).\n" + OVERRIDES,
    "references": "python -m bench references [n=<sequences>] [key=value ...]\n  The task's "
                  "references alone on n held-out sequences (default trainer.eval_sequences); "
                  "no training.\n" + OVERRIDES,
    "leaderboard": "python -m bench leaderboard [out_dir=results] [out=leaderboard.md] "
                   "[include=suite|all]\n  Rewrite the leaderboard from the run records in "
                   "out_dir: the published leaderboard.md from results/ (it says so when it "
                   "rewrites that tracked file), <out_dir>/leaderboard.md from any other folder "
                   "(out_dir=runs: the table of a sweep).",
    "claims": "python -m bench claims [out_dir=results] [out=claims.md, else <out_dir>/claims.md] "
              "[include=suite|all] [rules=conf/papers] [check=false] [against=<claims.md>]\n"
              "  Decide every claim of the rules "
              "(conf/papers/<paper>/claims.yaml: each claim's quantities, record selectors and "
              "metric paths, its control and rule) on 95% intervals from the run records in "
              "out_dir and write claims.md: holds, holds at reduced scale, fails, not reached at "
              "reduced scale, undecided or not measured. check=true: the research checks of the "
              "records instead (a CPU claim left unmeasured, a verdict on a control that did not "
              "hold; with against=<claims.md>, a verdict of that report the records do not "
              "give); exit 1 on a problem. Otherwise every verdict that differs from the report "
              "it rewrites, or from the report against= names, is listed.\n"
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
             "count; rerun=true runs it again.\n" + PLAN + LAUNCHER + "\n  suites: "
             + ", ".join(choices("suite")),
    "sweep": "python -m bench sweep key=a,b,c seed=lo-hi [entries=1,4-6] [shard=i/n] "
             "[rerun=false] [key=value ...]\n  The grid of every comma list and range (the "
             "cartesian product, the first key varying slowest), run in turn as a suite is: "
             "numbered entries, entries=, shard= for parallel workers, and a run whose `ok` "
             "record (a sweep's, an ad-hoc run's or a suite's) is in out_dir already is skipped. A value splits at commas outside "
             "brackets and quotes (task.gd_steps=[1,2] is one value); lo-hi (0 <= lo <= hi) is "
             "a range for seed and integer fields only; out_dir, name and resume are never "
             "split. At least one list or range, at most 1000 runs. Records go to out_dir "
             "(default runs/, git-ignored).\n" + PLAN + LAUNCHER + "\n"
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
            "[trainer.threads=n] [out_dir=<dir>] [name=<tag>] [details=false]\n  Score the model a run saved "
            "(trainer.save_weights) on the held-out set of another task config of the same "
            "family, without training: the weights' run's overrides with these on top. The "
            "record (origin eval) names the weights and carries the weights' run's training; "
            "leaderboard and claims never use it. Model, training and seed keys are refused.",
    "compare": "python -m bench compare <A.json> <B.json>\n"
               "python -m bench compare task=<task> model=<a>,<b>[,<c>...] [seed=N] "
               "[out_dir=runs] [key=value ...]\n  Two `ok` run records of the same "
               "task config (the same held-out sequences: metrics.held_out_digest): their gaps, "
               "the difference B − A of the models' mean losses with a 95% bootstrap interval "
               "over the paired sequences, and which model is better or that they are not "
               "distinguishable; overall and by context-length band. Records without "
               "per-sequence losses (older ones, text) are refused. By selection, one setting "
               "holds the values compared (model=mamba,transformer; any key), the others are "
               "shared, and the newest ok training record of each config in out_dir is used: "
               "with seed=N (two values), that seed's two runs by sequence as above; without, "
               "where every value has two or more seeds in common, a table of each value's "
               "mean gap over those seeds with its 95% t-interval, every pair's seed-paired "
               "difference with its interval and the better one named, and the best overall "
               "(else the newest seed both have, by sequence).",
    "export": "python -m bench export out=<records.csv|records.parquet> [out_dir=results] "
              "[include=suite|all]\n  Every ok run record the boards read as one table, a row "
              "per record (superseded code versions too, marked): run id, origin, task, model, "
              "seed, overrides, trainer preset, steps, device, SSD kernel, precision, compile, "
              "world size, parameters, state size, held-out sequences, the gap and its interval, "
              "relative gap, perplexity (text), wall time, commit, the version the board pools it "
              "by and whether today's code reproduces it, then loss.<predictor>, gap.<predictor> "
              "and accuracy.<predictor> for every predictor a record has. .parquet needs "
              "pyarrow. The file is replaced whole.",
    "identities": "python -m bench identities [out_dir=results] [check=false]\n  The "
                  "behavioural identity (bench/reports/identity.py: training batches, held-out "
                  "set, references, initial parameters, schedule, three optimizer steps, scoring) of "
                  "every `ok` record's config under the commit that made it and under today's "
                  "code, kept in <out_dir>/identities.json, which the leaderboard, the claims and "
                  "the suite runner read: records whose identity today's code reproduces pool "
                  "with today's runs and count as current; the others are named as stale with "
                  "the parts that differ. Only what is missing is computed. check=true: compute "
                  "today's identities again and compare them with the index; exit 1 on a "
                  "difference.",
    "gpucheck": "python -m bench gpucheck [sections=env,speed,lm,ddp,tiny,paper,warm,parity,"
                "text,suite] [budget=450] [out=$OUT, else runs/gpucheck] [steps=20] "
                "[suite=paper000_gpu] [suite_entries=1-3] [tokenizer_file=<tokenizer.json>]\n"
                "  Every check of the GPU path in one call sized for a borrowed, cold GPU: "
                "sections most valuable first, each killed whole at its cap, every figure "
                "written to out/rows.jsonl as measured; without CUDA, a rehearsal of the "
                "sections that run on the CPU (bench/perf/gpucheck/).",
}
