"""Rows and the runs behind them: every figure a row appended and synced the moment it is measured;
one `bench run` in its own process group, summarised as a row; what every section shares."""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path

from bench.perf.gpucheck.plan import BPE_VOCAB
from bench.perf.gpucheck.processes import run_group
from bench.records.store import read_records


def emit(args: dict, row: dict) -> dict:
    """Append one row of figures to rows.jsonl (synced: a kill a moment later keeps it)."""
    row = {"section": args["section"], **row}
    with open(args["rows"], "a") as handle:
        handle.write(json.dumps(row, default=str) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    print(brief(row), file=sys.stderr, flush=True)
    return row


def read_rows(path: Path) -> list[dict]:
    rows = []
    if path.is_file():
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):  # a line cut by a kill
                rows.append(json.loads(line))
    return rows


BRIEF_KEYS = ("label", "status", "exit", "error", "skipped", "device", "steps", "steps_per_s",
              "projected_10k_s", "bayes_gap", "perplexity", "ms_per_step", "tokens_per_s",
              "peak_gib", "estimate_gib", "first_step_s", "host_syncs", "cuda_sync_warnings",
              "within_tolerance", "worst_relative", "compile_s", "autotune_s", "jobs", "wall_s",
              "exit_after_signal_s", "lightning_step_s", "batch_wait_share", "batch_s", "aten_calls", "projected_h", "records")


def brief(row: dict) -> str:
    """One line of a row's headline figures (the summary table)."""
    parts = [row.get("section", "?")]
    for key in BRIEF_KEYS:
        value = row.get(key)
        if value is None or key == "section":
            continue
        if isinstance(value, float):
            value = f"{value:.4g}"
        elif isinstance(value, (list, dict)):
            value = json.dumps(value, default=str)[:80]
        parts.append(f"{key}={value}" if key != "label" else str(value))
    return " ".join(str(p) for p in parts)[:220]


def records_in(out_dir: str) -> list[dict]:
    return read_records(out_dir)[0] if os.path.isdir(out_dir) else []


def summary(record: dict) -> dict:
    """What a check reports of a run record."""
    train, evaluation = record.get("train") or {}, record.get("eval") or {}
    metrics = record.get("metrics") or {}
    steps, seconds = train.get("steps"), train.get("wall_time_s")
    return {"run_id": record["run_id"], "status": record["status"],
            "reason": record.get("reason"), "task": record["task"]["name"],
            "model": record["model"]["name"], "steps": steps, "train_s": seconds,
            "steps_per_s": steps / seconds if steps and seconds else None,
            "run_wall_s": record.get("wall_time_s"), "device": train.get("device"),
            "device_name": train.get("device_name"), "kernel": train.get("kernel"),
            "kernel_fallback": train.get("kernel_fallback"),
            "precision": train.get("precision"), "world_size": train.get("world_size"),
            "eval_device": evaluation.get("device"), "eval_world_size": evaluation.get("world_size"),
            "bayes_gap": metrics.get("bayes_gap"), "bayes_gap_ci": metrics.get("bayes_gap_ci"),
            "perplexity": (metrics.get("perplexity") or {}).get("model"),
            "startup_s": record.get("startup_s"), "eval_s": evaluation.get("time_s")}


def startup_breakdown(row: dict) -> dict | None:
    """Where a `bench run` process's wall time went (a run_row of one record): before_run
    (imports, composing, checks), to_fit, to_train, first_batch (bench/training/train.py
    startup_times), the rest of training, each part of the evaluation, and what is left of the
    process's wall time after the record's (writing the record and weights, exiting). None
    without a record that has them (a record of older code)."""
    startup = row.get("startup_s")
    if not startup or row.get("run_wall_s") is None or row.get("wall_s") is None:
        return None
    known = [v for k, v in startup.items() if k != "before_run" and v is not None]
    parts = {**startup, "training_after_first_batch": (row["train_s"] or 0) - sum(known),
             **{f"eval_{name}": seconds for name, seconds in (row.get("eval_s") or {}).items()},
             "after_record": row["wall_s"] - row["run_wall_s"] - (startup["before_run"] or 0)}
    return {"process_wall_s": row["wall_s"], "parts_s": parts}


def accelerator(args: dict) -> str:
    return "trainer.accelerator=" + ("gpu" if args["cuda"] else "cpu")


def bench_argv(*argv: str) -> list[str]:
    return [sys.executable, "-m", "bench", *argv]


def new_records(args: dict, before: set[str]) -> list[dict]:
    return [r for r in records_in(args["runs"]) if r["run_id"] not in before]


def run_row(args: dict, label: str, argv: list[str], timeout: float,
             env: dict | None = None) -> dict:
    """One `bench run` in its own process group; its records summarised in a row."""
    before = {r["run_id"] for r in records_in(args["runs"])}
    done = run_group(bench_argv("run", *argv, f"out_dir={args['runs']}",
                                 "trainer.progress=false"), timeout, env)
    records = [summary(r) for r in new_records(args, before)]
    row = {"label": label, "exit": done["exit"], "wall_s": done["wall_s"], "argv": argv,
           "records": len(records), **(records[0] if len(records) == 1 else {}),
           "all_records": records}
    if done["exit"] != 0:
        row["stderr"] = done["stderr"][-1500:]
    return emit(args, row)


def seconds_left(args: dict) -> float:
    return args["deadline"] - time.monotonic()


def text_argv(args: dict) -> list[str]:
    """Python's help texts (on every machine) in a tokenizer of GPT-2's vocabulary size, windows
    of 256: the project's BPE trained on them (once, cached in the call's scratch folder), or a
    local GPT-2 tokenizer.json. Never the hub."""
    tokenizer = (["task.tokenizer=gpt2", f"task.tokenizer_file={args['tokenizer_file']}"]
                 if args["tokenizer_file"] else ["task.tokenizer=bpe",
                                                 f"task.bpe_vocab_size={BPE_VOCAB}"])
    return ["task=pydoc", *tokenizer, f"task.cache_dir={args['scratch']}/text",
            "task.seq_len=256"]
