"""Sections speed and lm: step times by kernel, precision and compile, host syncs of a training
step, the sampler's cost; the language-model presets' tokens/s and peak memory against the
estimate."""
from __future__ import annotations

import dataclasses

import torch

from bench.perf.gpucheck.kernel import tuned_shapes
from bench.perf.gpucheck.plan import MARKOV_PAPER, MAMBA_4x256
from bench.perf.gpucheck.rows import accelerator, emit, seconds_left, text_argv
from bench.perf.kernel_parity import pin_configs
from bench.perf.speed import (configured, lightning_step_time, sampler_cost, step_profile,
                              time_training)
from bench.training.checks import compose_checked
from bench.training.memory import memory_estimate
from bench.training.train import apply_tf32_policy, build
from models.ssd import mamba_ssm_available

SPEED_CONFIGS = {"markov_paper": MARKOV_PAPER, "mamba_4x256_T1024": MAMBA_4x256}


LM_MODELS = ("mamba_lm14m", "transformer_lm14m", "mamba_lm110m", "mamba_lm200m")


def speed_plan(cuda: bool, kernel: bool, tuned: set[str]) -> list[tuple[str, str, str, bool]]:
    """(config, kernel, precision, compile) in the order timed: what needs no Triton autotune
    first (the pure-PyTorch scan, compile off, then on), then mamba-ssm's kernel (tuned shapes
    before the rest; compile off, then on). A GPU call once lost every kernel row to a cold
    autotune met by the second row."""
    configs = list(SPEED_CONFIGS) if cuda else ["markov_paper"]  # CPU: minutes a 4x256 step
    kernels = ["torch"] + (["mamba_ssm"] if cuda and kernel else [])
    plan = []
    # the pure-PyTorch scan compiled before any kernel row: the kernel's rows compile Triton
    # configs first (~40 s pinned), which left call 1's compile rows past the section's cap
    for name in kernels:
        for compiled in ((False, True) if cuda else (False,)):  # CPU: ~80 s to compile
            ordered = sorted(configs, key=lambda c: name == "mamba_ssm" and c not in tuned)
            plan += [(c, name, p, compiled) for c in ordered for p in ("32-true", "bf16-mixed")]
    return plan


def section_speed(args: dict) -> dict:

    apply_tf32_policy(False)
    device = torch.device("cuda" if args["cuda"] else "cpu")
    if not args["cuda"]:
        emit(args, {"label": "mamba_4x256_T1024", "skipped": "needs CUDA"})
    tuned, pinned = tuned_shapes(args), False
    plan = speed_plan(args["cuda"], args["cuda"] and mamba_ssm_available(), tuned)
    configs = {label: compose_checked([*SPEED_CONFIGS[label], accelerator(args)])
               for label in dict.fromkeys(label for label, *_ in plan)}
    last_plain = max(i for i, (_, kernel, _, compiled) in enumerate(plan)
                     if kernel == "torch" and not compiled)
    for index, (label, kernel, precision, compiled) in enumerate(plan):
        name = f"{label} kernel={kernel} {precision} compile={'on' if compiled else 'off'}"
        if seconds_left(args) < 10:
            emit(args, {"label": name, "skipped": "budget"})
            continue
        if kernel == "mamba_ssm" and label not in tuned and not pinned:
            pin_configs(-1)  # for the rest of this process: no cold autotune, a fixed config
            pinned = True
        setting = {"kernel": kernel, "precision": precision, "compile": compiled}
        tuning = ({"kernel_configs": "pinned (each kernel's last)" if pinned else "autotuned"}
                  if kernel == "mamba_ssm" else {})
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        try:
            timing = time_training(configured(configs[label], setting), device, args["steps"])
            timing["ms_per_step"] = timing.pop("step_s") * 1e3
            if device.type == "cuda":
                timing["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        except Exception as error:
            timing = {"error": f"{type(error).__name__}: {error}"[:500]}
        emit(args, {"label": name, **setting, **tuning, **timing})
        if index == last_plain and seconds_left(args) > 15:
            # after the pure-PyTorch rows: where a step's time goes, for each config
            for profiled, config in configs.items():
                config = configured(config, {"kernel": "torch", "precision": "32-true",
                                             "compile": False})
                profile = step_profile(config)
                emit(args, {"label": f"{profiled} one whole training step",
                            "host_syncs": profile["host_syncs"],
                            "cuda_sync_warnings": profile["cuda_sync_warnings"], **profile})
                emit(args, {"label": f"{profiled} steps as Lightning runs them",
                            **lightning_step_time(config, 40 if args["cuda"] else 12)})
                task, _ = build(on_cpu(config))
                emit(args, {"label": f"{profiled} sampler", **sampler_cost(task, 10)})
    return {}


def on_cpu(config):
    """The config on the CPU: a sampler's cost is measured where loader workers sample."""
    return dataclasses.replace(config, trainer=dataclasses.replace(config.trainer,
                                                                   accelerator="cpu"))


def lm_argv(args: dict, model: str) -> list[str]:
    return [*text_argv(args), "trainer=lm", f"model={model}"]


def lm_config(args: dict, model: str, setting: dict):
    """The preset's run config with the planned kernel, precision and compile, before anything
    is built: a preset left at kernel=auto would meet the kernel's smoke test on CUDA when built,
    a cold autotune of its shape (call 1's lm rows: minutes, past the section's cap)."""
    return configured(compose_checked(lm_argv(args, model)), setting)


def lm_plan(tuned: set[str]) -> list[tuple[str, bool, str | None]]:
    """(model, compile, kernel) in the order timed: each 14.5M preset compile off and then on
    (the tokens/s goal is the 14.5M preset's, compiled), then the large two compile off;
    mamba-ssm's kernel only for a preset whose scan shape warm autotuned (warm_shapes has
    mamba_lm14m's), else the pure-PyTorch scan."""
    def kernel(model: str) -> str | None:
        return None if model.startswith("transformer") else (
            "mamba_ssm" if model in tuned else "torch")
    return [(m, compiled, kernel(m)) for m in LM_MODELS
            for compiled in ((False, True) if m.endswith("14m") else (False,))]


def section_lm(args: dict) -> dict:
    """The language-model presets at T 256 in bf16, each 14.5M one compile off then on, the
    large two compile off. mamba-ssm's kernel only where its shape was autotuned by warm
    (mamba_lm14m); elsewhere the pure-PyTorch scan, said in the row: a cold autotune costs
    minutes."""
    apply_tf32_policy(False)
    device = torch.device("cuda")
    tuned = tuned_shapes(args) if mamba_ssm_available() else set()
    step: dict[str, float] = {}
    for model, compiled, kernel in lm_plan(tuned):
        label = f"{model} bf16-mixed compile={'on' if compiled else 'off'}"
        if seconds_left(args) < 15 or (compiled and seconds_left(args) < 40):
            emit(args, {"label": label, "skipped": "budget"})
            continue
        try:
            setting = {"kernel": kernel, "precision": "bf16-mixed", "compile": compiled}
            config = lm_config(args, model, setting)
            task, _ = build(config)
            estimate = memory_estimate(config, task, "cuda")
            torch.cuda.reset_peak_memory_stats()
            timing = time_training(config, device, args["steps"])
            timing["ms_per_step"] = timing.pop("step_s") * 1e3
            if not compiled:
                step[model] = timing["ms_per_step"] / 1e3
            emit(args, {"label": label, **setting, **timing, "params": estimate.params,
                        "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
                        "estimate_gib": {side: estimate.need(side, "training") / 2**30
                                         for side in estimate.sides}})
        except Exception as error:
            emit(args, {"label": label, "error": f"{type(error).__name__}: {error}"[:500]})
        torch.cuda.empty_cache()
    # suite paper000_text: 4 runs of mamba_lm14m, 2 of transformer_lm14m, 3 of each large one,
    # 30k steps each (conf/papers/000/suites/paper000_text.yaml)
    runs = {"mamba_lm14m": 4, "transformer_lm14m": 2, "mamba_lm110m": 3, "mamba_lm200m": 3}
    if all(m in step for m in runs):
        emit(args, {"label": "paper000_text projected",
                    "kernels": {m: k for m, c, k in lm_plan(tuned) if not c and k},
                    "projected_h": sum(30000 * step[m] * n for m, n in runs.items()) / 3600})
    return {}
