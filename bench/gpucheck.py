"""python -m bench gpucheck: every check of the GPU path in one command, within a time budget.

    python -m bench gpucheck [sections=env,parity,speed,lm,paper,ddp,text,suite] [budget=540]
                             [out=gpucheck] [steps=20] [tokenizer_file=<GPT-2 tokenizer.json>]
                             [suite=paper000_gpu] [suite_entries=1-5]

Each section runs in its own process (a crash, a hang or a process-wide setting such as the TF32
policy stays inside it), in order, until the budget in seconds is spent; a section that would
start with less than its usual time left is skipped and says so. What each measures:

- env:    the device, driver, package versions, whether mamba-ssm's kernel imports and runs, the
          code version records will carry (git);
- parity: mamba-ssm's `mamba_chunk_scan_combined` vs our chunked scan vs the float64 sequential
          oracle, forward and backward, float32 / bfloat16 / float16, on the scan shapes of
          `mamba`, `mambazero`, `mamba_lm14m` (bench/kernel_parity.py), as the models call it
          (inputs upcast to float32) and raw (the kernel on bf16/fp16 inputs); with TF32 off
          and on; then the CUDA parity tests of tests/test_ssd.py;
- speed:  ms/step and tokens/s of the paper's Markov config (1 layer, batch 64, T 256) and of a
          4-layer d_model 256 Mamba at T 1024, for kernel torch / mamba_ssm x 32-true /
          bf16-mixed x compile off / on, with the peak GPU memory; the sampler's cost, the
          share of a step it would take, and the host synchronisations of one training step
          (bench.speed.step_profile, CUDA sync debug mode);
- lm:     the language-model presets (GPT-2 vocabulary: `tokenizer_file=`) at T 256 in bf16:
          tokens/s (compile off/on), peak memory against the pre-run estimate, the projected
          time of suite paper000_text;
- paper:  `python -m bench run trainer=paper` end to end (10k steps, order 1, batch 64);
- ddp:    `trainer=ddp trainer.devices=1` end to end (NCCL), and SIGTERM to a run on the GPU;
- text:   a short GPT-2-tokenised language-model run of `mamba_lm14m` on Python's own help
          texts (task=pydoc, on every machine), the whole text path on the GPU;
- suite:  entries of `suite name=paper000_gpu` (or `suite=<name>`) while the budget lasts.

Writes `<out>/gpucheck.json` (every figure), `<out>/records.tar.gz` (the run records and logs of
the runs it made) and prints a summary.

mamba-ssm: a GPU check's machine installs it from a wheel built without its CUDA extension
(`MAMBA_SKIP_CUDA_BUILD=TRUE`, `--no-deps`: README.md, section GPUs), which the plain import of the
kernel (models/ssd.py) cannot import by itself: the package's `__init__` needs the extension
`selective_scan_cuda` and `transformers`. So every section process (and every run or test it
starts, which inherit its environment) gets the kernel parity harness's stand-ins for whichever of
the two is missing on its PYTHONPATH (bench/kernel_parity.py `stand_in_env`, placeholders that
nothing of ours calls; `stand_ins` in gpucheck.json lists them). This is a check of the Triton
kernel, not of the install a user needs, which is the real one with the extension."""
from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SECTIONS = ("env", "parity", "speed", "lm", "paper", "ddp", "text", "suite")
# Seconds a section usually needs; one is skipped when less than this is left of the budget.
NEEDS = {"env": 20, "parity": 120, "speed": 150, "lm": 150, "paper": 150, "ddp": 90,
         "text": 90, "suite": 120}
# ... and the most it may take, so that one slow section leaves time for the next ones
CAPS = {"env": 60, "parity": 240, "speed": 300, "lm": 300, "paper": 400, "ddp": 200,
        "text": 240, "suite": 100000}
MARKOV_PAPER = ["trainer=paper", "task.seq_len=256"]  # paper 000 Table 7: batch 64, lr 1e-3
MAMBA_4x256 = ["trainer=paper", "model.n_layers=4", "model.d_model=256", "model.headdim=64",
               "task.seq_len=1024"]


def _bench(*args: str, timeout: float, env: dict | None = None) -> dict:
    """`python -m bench <args>` in a subprocess: exit status, wall seconds, output tails."""
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", "bench", *args], cwd=REPO, text=True,
                              capture_output=True, timeout=timeout, env=env)
        code, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as expired:
        code, out, err = "timeout", expired.stdout or "", expired.stderr or ""
        out, err = (t.decode() if isinstance(t, bytes) else t for t in (out, err))
    return {"command": "python -m bench " + " ".join(args), "exit": code,
            "wall_s": time.perf_counter() - start, "stdout": out[-3000:], "stderr": err[-3000:]}


def _records(out_dir: str) -> list[dict]:
    from bench.records import read_records
    return read_records(out_dir)[0] if os.path.isdir(out_dir) else []


def _summary(record: dict) -> dict:
    """What a check reports of a run record."""
    train, evaluation = record.get("train", {}), record.get("eval", {})
    metrics = record.get("metrics", {})
    return {"run_id": record["run_id"], "status": record["status"],
            "reason": record.get("reason"), "task": record["task"]["name"],
            "model": record["model"]["name"], "seed": record["seed"],
            "steps": train.get("steps"), "train_s": train.get("wall_time_s"),
            "wall_s": record.get("wall_time_s"), "train_device": train.get("device"),
            "device_name": train.get("device_name"), "kernel": train.get("kernel"),
            "precision": train.get("precision"), "tf32": train.get("tf32"),
            "eval_device": evaluation.get("device"), "world_size": train.get("world_size"),
            "bayes_gap": metrics.get("bayes_gap"), "bayes_gap_ci": metrics.get("bayes_gap_ci"),
            "perplexity": metrics.get("perplexity"), "code": record.get("provenance", {})}


# --- sections (each runs in its own process: python -m bench.gpucheck <section> <json> ...) ----

def section_env(args: dict) -> dict:
    import torch

    from bench.records import provenance
    from models import ssd
    info = {"python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "cpus": os.cpu_count(),
            "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "devices": torch.cuda.device_count(), "provenance": provenance()}
    for name in ("lightning", "torchmetrics", "triton", "omegaconf", "datasets", "tokenizers",
                 "mamba_ssm"):
        try:
            from importlib import metadata
            info[name] = metadata.version(name.replace("_", "-"))
        except Exception as error:
            info[name] = f"missing ({type(error).__name__})"
    try:
        info["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError) as error:
        info["nvidia_smi"] = f"unavailable: {error}"
    info["kernel_import_error"] = ssd.mamba_ssm_kernel_error()
    if torch.cuda.is_available():
        info["kernel_auto"] = ssd.resolve_kernel("auto", torch.device("cuda"))
        info["kernel_fallback"] = ssd.kernel_fallback("cuda")
    return info


def section_parity(args: dict) -> dict:
    """Kernel parity tables, TF32 off (IEEE float32) and on, each in its own process."""
    result = {}
    for tf32 in (False, True):
        env = dict(os.environ, TRITON_F32_DEFAULT="tf32" if tf32 else "ieee")
        done = subprocess.run([sys.executable, "-m", "bench.gpucheck", "parity_tables",
                               json.dumps({"tf32": tf32})], cwd=REPO, env=env, text=True,
                              capture_output=True, timeout=args["timeout"])
        result[f"tf32_{'on' if tf32 else 'off'}"] = (
            json.loads(done.stdout.splitlines()[-1]) if done.returncode == 0
            else {"error": done.stderr[-3000:]})
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "tests/test_ssd.py",
                           "-k", "cuda"], cwd=REPO, text=True, capture_output=True,
                          timeout=args["timeout"])
    result["pytest_cuda"] = {"exit": done.returncode, "tail": done.stdout[-2500:]}
    return result


def section_parity_tables(args: dict) -> dict:
    import torch

    from bench import kernel_parity as parity
    torch.backends.cuda.matmul.allow_tf32 = args["tf32"]
    cases = {}
    dtypes = ("float32", "bfloat16", "float16") if not args["tf32"] else ("float32",)
    for name in parity.CUDA_CONFIGS + ("heads4_groups2",):
        for dtype in dtypes:
            for raw in ((False, True) if dtype != "float32" else (False,)):
                key = f"{name}-{dtype}{'-raw' if raw else ''}"
                try:
                    res = parity.parity(name, dtype, "cuda", initial_state=True, raw=raw)
                    cases[key] = {"relative": parity.relative_errors(res),
                                  "scale": res["scale"], "seconds": res["seconds"],
                                  "shape": res["shape"]}
                except Exception as error:  # a failing case is a finding, not the end
                    cases[key] = {"error": f"{type(error).__name__}: {error}"[:500]}
    return cases


def _compose(argv: list[str]):
    from bench.checks import compose_checked
    return compose_checked(argv)


def section_speed(args: dict) -> dict:
    import torch

    from bench.speed import (configured, sampler_cost, settings, step_profile, time_training)
    from bench.train import apply_tf32_policy
    apply_tf32_policy(False)
    out: dict = {}
    deadline = time.monotonic() + args["timeout"] - 15
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    configs = {"markov_paper": MARKOV_PAPER, "mamba_4x256_T1024": MAMBA_4x256}
    # every config without compilation first, then compiled (tens of seconds each to compile)
    for compiled in ("off", "on"):
        for label, argv in configs.items():
            config = _compose(argv)
            rows = out.setdefault(label, {"argv": argv, "training": []})["training"]
            for precision in ("32-true", "bf16-mixed"):
                for setting in settings(config, device, "all", precision, compiled):
                    if time.monotonic() > deadline:
                        rows.append({**setting, "skipped": "budget"})
                        continue
                    if device.type == "cuda":
                        torch.cuda.reset_peak_memory_stats()
                    try:
                        timing = time_training(configured(config, setting), device,
                                               args["steps"])
                        if device.type == "cuda":
                            timing["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
                    except Exception as error:
                        timing = {"error": f"{type(error).__name__}: {error}"[:500]}
                    rows.append({**setting, **timing})
                    print(f"speed {label} {setting}: {timing}", file=sys.stderr, flush=True)
            if compiled == "off":
                from bench.devices import loader_workers
                from bench.train import build
                task, _ = build(config)
                sampler = sampler_cost(task, 10)
                best = min((r["step_s"] for r in rows if "step_s" in r), default=None)
                out[label].update(
                    sampler=sampler, loader_workers=loader_workers(config),
                    sampler_share_in_process=(sampler["batch_s"] / (sampler["batch_s"] + best)
                                              if best else None),
                    step_profile=step_profile(config))
    return out


def section_lm(args: dict) -> dict:
    import torch

    from bench.memory import memory_estimate
    from bench.speed import configured, time_training
    from bench.train import apply_tf32_policy, build
    apply_tf32_policy(False)
    deadline = time.monotonic() + args["timeout"] - 10
    text = [*_gpt2_pydoc(args), "trainer=lm"]
    device = torch.device("cuda")
    rows = []
    for model in ("mamba_lm14m", "transformer_lm14m", "mamba_lm110m", "mamba_lm200m"):
        config = _compose([*text, f"model={model}"])
        task, _ = build(config)
        estimate = memory_estimate(config, task, "cuda")
        params = estimate.params
        estimate = {f"{side}_{phase}": estimate.need(side, phase) for side in estimate.sides
                    for phase in ("training", "evaluation")}
        for compiled in ((False, True) if model.endswith("14m") else (False,)):
            if time.monotonic() > deadline:
                rows.append({"model": model, "compile": compiled, "skipped": "budget"})
                continue
            setting = {"kernel": getattr(config.model, "kernel", None) and "auto",
                       "precision": "bf16-mixed", "compile": compiled}
            if setting["kernel"]:
                from models.ssd import resolve_kernel
                setting["kernel"] = resolve_kernel("auto", device)
            torch.cuda.reset_peak_memory_stats()
            try:
                timing = time_training(configured(config, setting), device, args["steps"])
                timing["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
            except Exception as error:
                timing = {"error": f"{type(error).__name__}: {error}"[:500]}
            rows.append({"model": model, **setting, **timing,
                         "estimate_gib": {k: v / 2**30 for k, v in estimate.items()},
                         "params": params})
            print(f"lm {model} {setting}: {timing}", file=sys.stderr, flush=True)
    # suite paper000_text: 6 runs of the 14.5M models, 3 of the 110M, 3 of the 200M, 30k steps
    step = {r["model"]: r["step_s"] for r in rows if "step_s" in r and not r["compile"]}
    runs = {"mamba_lm14m": 4, "transformer_lm14m": 2, "mamba_lm110m": 3, "mamba_lm200m": 3}
    projected = (sum(30000 * step[m] * n for m, n in runs.items())
                 if all(m in step for m in runs) else None)
    return {"rows": rows, "paper000_text_projected_h": projected / 3600 if projected else None}


def _run_section(argv: list[str], args: dict) -> dict:
    done = _bench("run", *argv, f"out_dir={args['runs']}", "trainer.progress=false",
                  timeout=args["timeout"])
    found = [r for r in _records(args["runs"]) if r["run_id"] in done["stdout"] + done["stderr"]]
    done["records"] = [_summary(r) for r in found]
    return done


def section_paper(args: dict) -> dict:
    return _run_section(["trainer=paper"], args)


def section_ddp(args: dict) -> dict:
    out = {"ddp": _run_section(["trainer=ddp", "trainer.devices=1", "trainer.max_steps=300",
                                "trainer.log_every=50"], args)}
    # SIGTERM to a GPU run mid-training: one failed record, exit 143
    before = {r["run_id"] for r in _records(args["runs"])}
    command = [sys.executable, "-m", "bench", "run", "trainer=paper", "trainer.progress=false",
               f"out_dir={args['runs']}"]
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=REPO, text=True, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    time.sleep(args.get("sigterm_after", 25))
    process.send_signal(signal.SIGTERM)
    sent = time.perf_counter()
    try:
        stdout, stderr = process.communicate(timeout=60)
        code = process.returncode
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
        code = "did not exit within 60 s"
    new = [r for r in _records(args["runs"]) if r["run_id"] not in before]
    out["sigterm"] = {"exit": code, "exit_after_signal_s": time.perf_counter() - sent,
                      "signal_at_s": sent - start, "stderr": stderr[-1500:],
                      "records": [_summary(r) for r in new]}
    return out


def _gpt2_pydoc(args: dict) -> list[str]:
    """Python's help texts in GPT-2's tokens, windows of 256: a language-modelling task with the
    paper's vocabulary on any machine (the tokenizer file must be given: no hub here)."""
    return ["task=pydoc", "task.tokenizer=gpt2", f"task.tokenizer_file={args['tokenizer_file']}",
            "task.seq_len=256"]


def section_text(args: dict) -> dict:
    return _run_section([
        *_gpt2_pydoc(args), "model=mamba_lm14m", "trainer=lm", "trainer.max_steps=300",
        "trainer.warmup_steps=30", "trainer.log_every=50", "trainer.checkpoint_every=0"], args)


def section_suite(args: dict) -> dict:
    done = _bench("suite", f"name={args['suite']}", f"entries={args['suite_entries']}",
                  f"out_dir={args['runs']}", "trainer.progress=false",
                  timeout=args["timeout"])
    done["records"] = [_summary(r) for r in _records(args["runs"])
                       if r.get("origin", "").startswith("suite:")]
    return done


# --- the driver -------------------------------------------------------------------------------

def main(argv: list[str]) -> int:
    options = dict(sections=",".join(SECTIONS), budget="540", out="gpucheck", steps="20",
                   suite="paper000_gpu", suite_entries="1-5", tokenizer_file="")
    for arg in argv:
        key, _, value = arg.partition("=")
        if key not in options or not value:
            print(f"error: unknown or empty option '{arg}'; options: {', '.join(options)}",
                  file=sys.stderr)
            return 2
        options[key] = value
    sections = options["sections"].split(",")
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        print(f"error: unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}",
              file=sys.stderr)
        return 2
    out = Path(options["out"])
    out.mkdir(parents=True, exist_ok=True)
    budget_end = time.monotonic() + float(options["budget"])
    scratch = Path(tempfile.mkdtemp(prefix="gpucheck-"))
    runs = scratch / "runs"
    from bench.kernel_parity import missing_stand_ins, stand_in_env
    env = stand_in_env(os.environ)  # for mamba-ssm's CUDA-less install (see the docstring)
    results: dict = {"options": options, "stand_ins": missing_stand_ins(), "sections": {}}
    for name in sections:
        left = budget_end - time.monotonic()
        if left < NEEDS[name]:
            results["sections"][name] = {"skipped": f"{left:.0f} s of the budget left, needs "
                                                    f"~{NEEDS[name]} s"}
            continue
        left = min(left, CAPS[name])
        args = {**options, "timeout": left - 5, "runs": str(runs), "steps": int(options["steps"])}
        start = time.perf_counter()
        print(f"== {name} ({left:.0f} s left)", flush=True)
        try:
            done = subprocess.run([sys.executable, "-m", "bench.gpucheck", name, json.dumps(args)],
                                  cwd=REPO, env=env, text=True, capture_output=True,
                                  timeout=left)
            section = (json.loads(done.stdout.splitlines()[-1]) if done.returncode == 0
                       and done.stdout.strip() else {"error": done.stderr[-4000:]})
            if done.returncode == 0:
                sys.stderr.write(done.stderr[-2000:])
        except subprocess.TimeoutExpired as expired:
            section = {"error": f"timed out after {left:.0f} s",
                       "stderr": str(expired.stderr)[-2000:]}
        section["section_s"] = time.perf_counter() - start
        results["sections"][name] = section
        print(json.dumps(section, indent=1, default=str)[:6000], flush=True)
        (out / "gpucheck.json").write_text(json.dumps(results, indent=1, default=str))
    if runs.is_dir():
        with tarfile.open(out / "records.tar.gz", "w:gz") as tar:
            tar.add(runs, arcname="runs")
    (out / "gpucheck.json").write_text(json.dumps(results, indent=1, default=str))
    return 0


SECTION_FUNCTIONS = {"env": section_env, "parity": section_parity,
                     "parity_tables": section_parity_tables, "speed": section_speed,
                     "lm": section_lm, "paper": section_paper, "ddp": section_ddp,
                     "text": section_text, "suite": section_suite}

if __name__ == "__main__":
    name, arguments = sys.argv[1], json.loads(sys.argv[2])
    result = SECTION_FUNCTIONS[name](arguments)
    print(json.dumps(result, default=str))
