"""Sections warm and parity: mamba-ssm's Triton kernels compiled in parallel processes and autotuned
for the shapes later sections train, and their arithmetic against our chunked scan and the
float64 oracle."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

from bench.perf import kernel_parity as parity
from bench.perf.gpucheck.plan import MARKOV_PAPER, TUNE_RESERVE_S, MAMBA_4x256
from bench.perf.gpucheck.processes import finish_group, run_group, start_group
from bench.perf.gpucheck.rows import emit, read_rows, seconds_left
from bench.perf.kernel_parity import pin_configs
from bench.training.checks import compose_checked
from bench.training.train import apply_tf32_policy, build
from models import ssd
from models.mamba import Mamba2Mixer


def tuned_shapes(args: dict) -> set[str]:
    """The warm shapes (warm_shapes' labels) whose autotune finished earlier in this call: a
    process meeting one of them reads the tuned configs from Triton's cache."""
    return {r["label"].removeprefix("autotune ") for r in read_rows(Path(args["rows"]))
            if r["section"] == "warm" and str(r.get("label", "")).startswith("autotune ")
            and r.get("autotune_s") is not None and not r.get("error")}


def warm_shapes() -> dict[str, tuple[int, ...]]:
    """The scan shapes (batch, length, heads, headdim, groups, states, chunk) that the later
    sections run with the mamba_ssm kernel: speed's two configs and the 14.5M language model."""
    shapes = {}
    for label, argv in (("markov_paper", MARKOV_PAPER), ("mamba_4x256_T1024", MAMBA_4x256),
                        ("mamba_lm14m", ["trainer=lm", "model=mamba_lm14m", "task=markov",
                                         "task.seq_len=256"])):
        config = compose_checked([*argv, "trainer.accelerator=cpu"])
        task, model = build(config)
        mixer = next(m for m in model.modules() if isinstance(m, Mamba2Mixer))
        shapes[label] = (task.batch_size, task.seq_len, mixer.nheads, mixer.headdim,
                         mixer.ngroups, mixer.d_state, mixer.chunk_size)
    return shapes


def section_warm(args: dict) -> dict:
    """Compile every autotune configuration of the SSD kernel for each shape, in parallel
    processes (one per shape and configuration index, longest first, as many at once as there
    are cores), then autotune each shape on the compiled cache in one process."""
    shapes = warm_shapes()
    jobs = [(label, index) for index in range(17) for label in shapes]  # 17: the longest list
    slots = max(1, min(16, (os.cpu_count() or 2)))
    running, results, start = [], [], time.perf_counter()
    while jobs or running:
        while jobs and len(running) < slots:
            label, index = jobs.pop(0)
            spec = json.dumps({"shape": shapes[label], "index": index})
            running.append((label, index, start_group(
                [sys.executable, "-m", "bench.perf.gpucheck", "warm_one", spec], os.environ)))
        time.sleep(0.2)
        for item in [r for r in running if r[2].poll() is not None]:
            running.remove(item)
            done = finish_group(item[2], 0)
            result = (json.loads(done["stdout"].splitlines()[-1]) if done["exit"] == 0
                      and done["stdout"].strip() else {"error": done["stderr"][-300:]})
            results.append({"shape": item[0], "index": item[1], **result})
        if seconds_left(args) < TUNE_RESERVE_S:  # the autotune pass's time: the rest is not compiled
            for item in running:
                finish_group(item[2], 0)
            results += [{"shape": item[0], "index": item[1], "error": "killed: budget"}
                        for item in running]
            results += [{"shape": label, "index": index, "error": "not started: budget"}
                        for label, index in jobs]
            running, jobs = [], []
    for label in shapes:
        own = [r for r in results if r["shape"] == label]
        # a config that needs more shared memory than this GPU has: the autotuner skips it too
        too_big = [r for r in own if "OutOfResources" in r.get("error", "")]
        failed = [r for r in own if "error" in r and r not in too_big]
        emit(args, {"label": f"compile {label}", "shape": shapes[label], "jobs": len(own),
                    "compiled": len(own) - len(too_big) - len(failed),
                    "over_shared_memory": len(too_big), "not_compiled": len(failed),
                    "errors": sorted({r["error"][:200] for r in failed})[:3],
                    "compile_s": sum(r.get("seconds", 0.0) for r in own),
                    "longest_job_s": max((r.get("seconds", 0.0) for r in own), default=None)})
    emit(args, {"label": "parallel compile", "wall_s": time.perf_counter() - start,
                "slots": slots, "jobs": len(results)})
    done = run_group([sys.executable, "-m", "bench.perf.gpucheck", "tune",
                      json.dumps({**args, "shapes": shapes})], seconds_left(args) - 2, os.environ)
    if done["exit"] != 0:
        emit(args, {"label": "autotune on the compiled cache", "exit": done["exit"],
                    "stderr": done["stderr"][-800:]})
    return {}


def section_warm_one(spec: dict) -> dict:
    """One warm-up job: configuration `index` of every autotuned kernel at one scan shape."""
    pin_configs(spec["index"])
    start = time.perf_counter()
    reason = ssd._smoke_test_kernel(torch.device("cuda"), tuple(spec["shape"]))
    out = {"seconds": time.perf_counter() - start}
    if reason is not None:
        out["error"] = reason
    return out


def section_tune(args: dict) -> dict:
    """Each warm shape autotuned on the compiled cache (the cost every later process that meets
    the shape pays, less what TRITON_CACHE_AUTOTUNING keeps)."""
    for label, shape in args["shapes"].items():
        if seconds_left(args) < 5:
            emit(args, {"label": f"autotune {label}", "skipped": "budget"})
            continue
        start = time.perf_counter()
        reason = ssd._smoke_test_kernel(torch.device("cuda"), tuple(shape))
        emit(args, {"label": f"autotune {label}", "autotune_s": time.perf_counter() - start,
                    "error": reason})
    return {}


PARITY_JOBS = {  # one process each: a shape's compiled kernels serve its three model-path dtypes
    "mamba": [("mamba", d, False) for d in ("float32", "bfloat16", "float16")],
    "mambazero": [("mambazero", d, False) for d in ("float32", "bfloat16", "float16")],
    "mamba_lm14m": [("mamba_lm14m", d, False) for d in ("float32", "bfloat16", "float16")],
    "heads4_groups2": [("heads4_groups2", d, False) for d in ("float32", "bfloat16")],
    "mamba_lm14m-raw-bf16": [("mamba_lm14m", "bfloat16", True)],
    "mamba_lm14m-raw-fp16": [("mamba_lm14m", "float16", True)],
}


def section_parity(args: dict) -> dict:
    processes = {job: start_group([sys.executable, "-m", "bench.perf.gpucheck", "parity_one",
                                   json.dumps({**args, "job": job})], os.environ)
                 for job in PARITY_JOBS}
    for job, process in processes.items():
        done = finish_group(process, seconds_left(args) - 2)
        if done["exit"] != 0:
            emit(args, {"label": f"parity {job}", "exit": done["exit"],
                        "stderr": done["stderr"][-600:]})
    return {}


def section_parity_one(args: dict) -> dict:

    apply_tf32_policy(False)
    parity.pin_configs(-1)
    for name, dtype, raw in PARITY_JOBS[args["job"]]:
        label = f"parity {name} {dtype}{' raw' if raw else ''}"
        try:
            res = parity.parity(name, dtype, "cuda", initial_state=True, raw=raw)
            relative = parity.relative_errors(res)
            emit(args, {"label": label, "within_tolerance": parity.within_tolerance(
                            res, parity.CUDA_TOLERANCE[dtype]),
                        "tolerance": parity.CUDA_TOLERANCE[dtype],
                        "worst_relative": max(relative["kernel"].values()),
                        "relative": relative, "seconds": res["seconds"], "shape": res["shape"]})
        except Exception as error:  # a failing case is a finding, not the end
            emit(args, {"label": label, "error": f"{type(error).__name__}: {error}"[:500]})
        torch.cuda.empty_cache()
    return {}
