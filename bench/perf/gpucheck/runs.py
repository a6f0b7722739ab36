"""Sections that run `python -m bench run` on the device: env (versions, the kernel's import), tiny
(the whole path, short), paper (trainer=paper and its 10k-step projection), text and suite."""
from __future__ import annotations

import os
import platform
import subprocess
import time
from importlib import metadata
from pathlib import Path

import torch

from bench.perf.gpucheck.kernel import tuned_shapes
from bench.perf.gpucheck.plan import MARKOV_PAPER, PAPER_STEPS
from bench.perf.gpucheck.processes import run_group
from bench.perf.gpucheck.rows import (accelerator, bench_argv, emit, new_records, read_rows,
                                      records_in, run_row, seconds_left, startup_breakdown,
                                      summary, text_argv)
from bench.records.store import provenance
from models import ssd


def section_env(args: dict) -> dict:


    info = {"label": "environment", "python": platform.python_version(),
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "cuda_available": torch.cuda.is_available(), "cpus": os.cpu_count(),
            "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
            "devices": torch.cuda.device_count(), "provenance": provenance(),
            "triton_cache": os.environ.get("TRITON_CACHE_DIR"),
            "hub_offline": os.environ.get("HF_HUB_OFFLINE")}
    for name in ("lightning", "torchmetrics", "triton", "omegaconf", "datasets", "tokenizers",
                 "transformers", "mamba_ssm", "numpy"):
        try:
            info[name] = metadata.version(name.replace("_", "-"))
        except Exception as error:
            info[name] = f"missing ({type(error).__name__})"
    try:
        info["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError) as error:
        info["nvidia_smi"] = f"unavailable: {error}"
    start = time.perf_counter()
    info["kernel_import_error"] = ssd.mamba_ssm_kernel_error()
    info["kernel_import_s"] = time.perf_counter() - start
    emit(args, info)
    return {"cuda": info["cuda_available"]}


def section_tiny(args: dict) -> dict:
    steps = 200 if args["cuda"] else 30
    row = run_row(args, "paper config, short, kernel=torch", [
        *MARKOV_PAPER, accelerator(args), f"trainer.max_steps={steps}",
        f"trainer.warmup_steps={steps // 10}", "model.kernel=torch", "trainer.log_every=50",
        "trainer.eval_sequences=256", "trainer.checkpoint_every=0"], seconds_left(args))
    return {"steps_per_s": row.get("steps_per_s"), "overhead_s": (
        row["run_wall_s"] - row["train_s"] if row.get("run_wall_s") and row.get("train_s")
        else None)}


def section_paper(args: dict) -> dict:
    """trainer=paper with as many of its steps as fit: at the tiny run's rate, leaving time for
    start-up and the evaluation of its 2,048 held-out sequences."""
    tiny = next((r for r in read_rows(Path(args["rows"])) if r["section"] == "tiny"
                 and r.get("steps_per_s")), {})
    rate = tiny.get("steps_per_s") or 5.0
    overhead = 45.0 + (tiny.get("wall_s") or 30.0) - (tiny.get("train_s") or 0.0)
    steps = int(min(PAPER_STEPS, max(100, 0.85 * rate * (seconds_left(args) - overhead))))
    row = run_row(args, f"trainer=paper, {steps} of {PAPER_STEPS} steps, kernel=torch", [
        *MARKOV_PAPER, accelerator(args), f"trainer.max_steps={steps}",
        f"trainer.warmup_steps={max(10, 200 * steps // PAPER_STEPS)}", "model.kernel=torch",
        "trainer.checkpoint_every=0"], seconds_left(args))
    breakdown = startup_breakdown(row)
    if breakdown is not None:  # call 1: 21 s of 43.8 fell outside the run's own record
        emit(args, {"label": "paper start-up breakdown", **breakdown})
    if row.get("steps_per_s"):
        row = emit(args, {"label": "paper projection", "steps": steps,
                          "steps_per_s": row["steps_per_s"],
                          "projected_10k_s": PAPER_STEPS / row["steps_per_s"]
                          + row["wall_s"] - row["train_s"]})
    return {"steps": steps}


def section_text(args: dict) -> dict:
    steps = 300 if args["cuda"] else 10
    # on two cores: a few sequences, a few held-out windows (a 50257-token output layer)
    batch = [] if args["cuda"] else ["trainer.batch_size=4", "trainer.eval_batch_size=4",
                                     "task.eval_windows=8"]
    # mamba-ssm's kernel only if warm autotuned its shape: a cold autotune costs minutes
    kernel = "mamba_ssm" if args["cuda"] and "mamba_lm14m" in tuned_shapes(args) else "torch"
    run_row(args, f"mamba_lm14m on pydoc, kernel={kernel}", [
        *text_argv(args), "model=mamba_lm14m", f"model.kernel={kernel}", "trainer=lm",
        accelerator(args), *batch,
        f"trainer.max_steps={steps}", f"trainer.warmup_steps={steps // 10}",
        "trainer.log_every=50", "trainer.checkpoint_every=0"], seconds_left(args))
    return {}


def section_suite(args: dict) -> dict:
    before = {r["run_id"] for r in records_in(args["runs"])}
    done = run_group(bench_argv("suite", f"name={args['suite']}",
                                 f"entries={args['suite_entries']}", f"out_dir={args['runs']}",
                                 "trainer.progress=false"), seconds_left(args) - 2)
    records = [summary(r) for r in new_records(args, before)]
    emit(args, {"label": f"suite {args['suite']} entries {args['suite_entries']}",
                "exit": done["exit"], "wall_s": done["wall_s"], "records": len(records),
                "all_records": records, "stdout": done["stdout"][-1500:]})
    return {}
