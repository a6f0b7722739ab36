"""python -m bench gpucheck: the GPU path checked in one call that fits a device lease.

    python -m bench gpucheck [sections=env,tiny,paper,ddp,warm,parity,speed,lm,text,suite]
                             [budget=450] [out=$OUT, else runs/gpucheck] [steps=20]
                             [suite=paper000_gpu] [suite_entries=1-3] [tokenizer_file=]

A lent GPU comes for minutes, starts bare and cold, and its output comes back cut to its end, so
this command is built to give figures from its first call:

- Sections run most valuable first, each in its own process group with a cap: at the cap the whole
  group (the section, the runs it started, their DDP ranks and loader workers) gets SIGTERM, then
  SIGKILL 5 s later, and the next section starts on a machine with nothing of it left. A section
  that would start with less than it needs of the budget is skipped and says so; on a machine
  without CUDA the CUDA-only sections say "needs CUDA" and the others run on the CPU (a rehearsal).
- Every figure is a row appended to `<out>/rows.jsonl` (flushed and synced) the moment it is
  measured, so a section killed mid-way keeps what it measured; `<out>/gpucheck.json` (written
  whole after every section) gathers the rows by section, `<out>/log.txt` keeps each section's
  output, `<out>/records.tar.gz` the records and logs of its runs (no weights). `out` defaults to
  `$OUT`, the folder a device call brings back. The printed summary ends with a table of every row
  short enough to survive a 12,000-character tail.
- Triton: one compile cache for the whole call (TRITON_CACHE_DIR) with autotuning results cached
  on disk (TRITON_CACHE_AUTOTUNING=1). A cold autotune of mamba-ssm's SSD kernel compiles ~110
  configurations per scan shape (forward and backward), minutes of one core (bench/
  triton_compile_cost.py measures it without a GPU), so `warm` compiles them for the shapes the
  later sections train in parallel processes first (process i compiles configuration i of every
  kernel, kernel_parity.pin_configs), and `parity` checks the arithmetic at one fixed
  configuration per kernel (the last, the fastest to compile), one process per shape.
- No hub: HF_HUB_OFFLINE=1; the language-model sections read Python's own help texts (task=pydoc)
  in a byte-level BPE the project trains on them with GPT-2's vocabulary size (50257), or a local
  tokenizer.json given as tokenizer_file.

Sections (what each measures):
- env:    device, driver, versions, whether mamba-ssm's kernel imports, the code version;
- tiny:   a short run of the paper's Markov config on the device, the pure-PyTorch scan: the
          whole path (sampling in loader workers, training, evaluation, record) and its step rate;
- paper:  `run trainer=paper` (paper 000 Table 7) with as many of its 10k steps as fit its cap at
          the tiny run's rate, and the projected time of all 10k;
- ddp:    two processes sharing the device (gloo over its tensors: DDP's all-reduce, the signal
          agreement, the evaluation's gather), SIGTERM to one rank of such a run once training
          has started (its own "training started" line), NCCL with devices=1 (CUDA), and SIGTERM
          to a one-process run;
- warm:   the parallel Triton compile above, then the autotuning of each shape on the compiled
          cache (how long a cold and a warm autotune take);
- parity: mamba-ssm's `mamba_chunk_scan_combined` vs our chunked scan vs the float64 sequential
          oracle, forward and backward, on the scans of `mamba`, `mambazero`, `mamba_lm14m` and a
          4-head 2-group one, as the models call it (float32 / bf16- / fp16-rounded inputs,
          computed in float32) and raw (bf16, fp16 inputs), against kernel_parity.CUDA_TOLERANCE;
- speed:  ms/step and tokens/s of the paper's Markov config and of a 4-layer d_model 256 Mamba at
          T 1024 for kernel torch / mamba_ssm x 32-true / bf16-mixed x compile off (then on),
          peak memory; the host synchronisations of one whole training step (bench.perf.speed
          step_profile, CUDA's sync debug mode); the sampler's cost;
- lm:     the language-model presets at T 256 in bf16: tokens/s, peak memory against the pre-run
          estimate, the projected time of suite paper000_text;
- text:   a short `mamba_lm14m` run on the text path;
- suite:  entries of `suite name=paper000_gpu` (or `suite=`) while the budget lasts.

mamba-ssm: a GPU check's machine installs the wheel built without its CUDA extension
(`MAMBA_SKIP_CUDA_BUILD=TRUE`, `--no-deps`: README.md, section GPUs), which the plain import of the
kernel (models/ssd.py) cannot import by itself: the package's `__init__` needs `selective_scan_cuda`
and `transformers`. Every section process gets the kernel parity harness's stand-ins for whichever
of the two is missing (bench/perf/kernel_parity.py `stand_in_env`; `stand_ins` in gpucheck.json)."""
from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SECTIONS = ("env", "tiny", "paper", "ddp", "warm", "parity", "speed", "lm", "text", "suite")
CUDA_ONLY = ("warm", "parity", "lm", "suite")
# Seconds a section needs at least (it is skipped with less of the budget left) and the most it
# may take. Seen on a cold H100 (2026-11-26, README section GPUs): env 18, tiny 28, paper 44,
# ddp 77, warm cut at its old cap of 120 s with 35 of 51 compile jobs done (so its autotune and
# the kernel's speed rows found nothing tuned), parity 67.
NEEDS = {"env": 10, "tiny": 25, "paper": 60, "ddp": 45, "warm": 60, "parity": 30, "speed": 40,
         "lm": 40, "text": 40, "suite": 60}
CAPS = {"env": 40, "tiny": 60, "paper": 110, "ddp": 110, "warm": 240, "parity": 90,
        "speed": 100, "lm": 80, "text": 70, "suite": 100000}
GRACE_S = 5  # between SIGTERM and SIGKILL of a section's process group at its cap
# warm stops compiling with this much of its cap left, for the autotune pass: it benchmarks each
# compiled config of three shapes, forward and backward (on the H100 a 40 s pass ended in none,
# with 16 of 51 configs still to compile)
TUNE_RESERVE_S = 90
MARKOV_PAPER = ["trainer=paper", "task.seq_len=256"]  # paper 000 Table 7: batch 64, lr 1e-3
MAMBA_4x256 = ["trainer=paper", "model.n_layers=4", "model.d_model=256", "model.headdim=64",
               "task.seq_len=1024"]
PAPER_STEPS = 10000
BPE_VOCAB = 50257  # GPT-2's vocabulary size: the language models' embedding as in the paper
OPTIONS = dict(sections=",".join(SECTIONS), budget="450", out="", steps="20",
               suite="paper000_gpu", suite_entries="1-3", tokenizer_file="")


# --- process groups ---------------------------------------------------------------------------

def _kill_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def start_group(argv: list[str], env: dict | None = None, cwd: Path = REPO):
    """argv started in a session (process group) of its own, its output to temporary files."""
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=err,
                               start_new_session=True)
    process.files = (out, err)
    return process


def finish_group(process, timeout: float) -> dict:
    """Wait for a start_group process until `timeout` seconds; then SIGTERM to its whole group
    and SIGKILL GRACE_S later. Whatever is left of the group after it ended (an orphaned child)
    is killed too. Returns the exit status ("timeout" when killed), seconds and output."""
    start = time.perf_counter()
    try:
        code = process.wait(timeout=max(0.0, timeout))
    except subprocess.TimeoutExpired:
        code = "timeout"
        _kill_group(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            _kill_group(process.pid, signal.SIGKILL)
            process.wait()
    _kill_group(process.pid, signal.SIGKILL)
    texts = []
    for handle in process.files:
        handle.seek(0)
        texts.append(handle.read().decode(errors="replace"))
        handle.close()
    return {"exit": code, "wait_s": time.perf_counter() - start, "stdout": texts[0],
            "stderr": texts[1]}


def run_group(argv: list[str], timeout: float, env: dict | None = None) -> dict:
    start = time.perf_counter()
    process = start_group(argv, env)
    try:
        done = finish_group(process, timeout)
    except BaseException:  # the caller stopped (a signal): the group goes with it
        _kill_group(process.pid, signal.SIGKILL)
        raise
    done["wall_s"] = time.perf_counter() - start
    return done


class Stopped(Exception):
    """SIGTERM or SIGINT to the driver: the running section's group is killed, what was
    measured is saved, and the driver exits 128 + the signal's number."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop(signum, frame):
    raise Stopped(signum)


# --- rows: every figure written the moment it is measured ---------------------------------------

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


# --- helpers of the sections --------------------------------------------------------------------

def _records(out_dir: str) -> list[dict]:
    from bench.records.store import read_records
    return read_records(out_dir)[0] if os.path.isdir(out_dir) else []


def _summary(record: dict) -> dict:
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
            "perplexity": (metrics.get("perplexity") or {}).get("model")}


def _accelerator(args: dict) -> str:
    return "trainer.accelerator=" + ("gpu" if args["cuda"] else "cpu")


def _bench_argv(*argv: str) -> list[str]:
    return [sys.executable, "-m", "bench", *argv]


def _new_records(args: dict, before: set[str]) -> list[dict]:
    return [r for r in _records(args["runs"]) if r["run_id"] not in before]


def _run_row(args: dict, label: str, argv: list[str], timeout: float,
             env: dict | None = None) -> dict:
    """One `bench run` in its own process group; its records summarised in a row."""
    before = {r["run_id"] for r in _records(args["runs"])}
    done = run_group(_bench_argv("run", *argv, f"out_dir={args['runs']}",
                                 "trainer.progress=false"), timeout, env)
    records = [_summary(r) for r in _new_records(args, before)]
    row = {"label": label, "exit": done["exit"], "wall_s": done["wall_s"], "argv": argv,
           "records": len(records), **(records[0] if len(records) == 1 else {}),
           "all_records": records}
    if done["exit"] != 0:
        row["stderr"] = done["stderr"][-1500:]
    return emit(args, row)


def _left(args: dict) -> float:
    return args["deadline"] - time.monotonic()


def _text_argv(args: dict) -> list[str]:
    """Python's help texts (on every machine) in a tokenizer of GPT-2's vocabulary size, windows
    of 256: the project's BPE trained on them (once, cached in the call's scratch folder), or a
    local GPT-2 tokenizer.json. Never the hub."""
    tokenizer = (["task.tokenizer=gpt2", f"task.tokenizer_file={args['tokenizer_file']}"]
                 if args["tokenizer_file"] else ["task.tokenizer=bpe",
                                                 f"task.bpe_vocab_size={BPE_VOCAB}"])
    return ["task=pydoc", *tokenizer, f"task.cache_dir={args['scratch']}/text",
            "task.seq_len=256"]


def _compose(argv: list[str]):
    from bench.training.checks import compose_checked
    return compose_checked(argv)


# --- sections (each in its own process: python -m bench.perf.gpucheck <section> <json>) --------------

def section_env(args: dict) -> dict:
    from importlib import metadata

    import torch

    from bench.records.store import provenance
    from models import ssd
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
    row = _run_row(args, "paper config, short, kernel=torch", [
        *MARKOV_PAPER, _accelerator(args), f"trainer.max_steps={steps}",
        f"trainer.warmup_steps={steps // 10}", "model.kernel=torch", "trainer.log_every=50",
        "trainer.eval_sequences=256", "trainer.checkpoint_every=0"], _left(args))
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
    steps = int(min(PAPER_STEPS, max(100, 0.85 * rate * (_left(args) - overhead))))
    row = _run_row(args, f"trainer=paper, {steps} of {PAPER_STEPS} steps, kernel=torch", [
        *MARKOV_PAPER, _accelerator(args), f"trainer.max_steps={steps}",
        f"trainer.warmup_steps={max(10, 200 * steps // PAPER_STEPS)}", "model.kernel=torch",
        "trainer.checkpoint_every=0"], _left(args))
    if row.get("steps_per_s"):
        row = emit(args, {"label": "paper projection", "steps": steps,
                          "steps_per_s": row["steps_per_s"],
                          "projected_10k_s": PAPER_STEPS / row["steps_per_s"]
                          + row["wall_s"] - row["train_s"]})
    return {"steps": steps}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_ranks(args: dict, argv: list[str]) -> list:
    """Two processes of one run that share this machine's one device: Lightning's multi-node
    set-up (num_nodes=2, one device each) with the launcher's variables set by hand, so both
    use device 0; gloo's collectives run over its tensors."""
    port = _free_port()
    processes = []
    for rank in (0, 1):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2",
                   NODE_RANK=str(rank), LOCAL_RANK="0")
        processes.append(start_group(_bench_argv(
            "run", *argv, _accelerator(args), "trainer.strategy=ddp", "trainer.num_nodes=2",
            "trainer.devices=1", "trainer.process_group_backend=gloo",
            f"out_dir={args['runs']}"), env))
    return processes


def _wait_for_training(process, timeout: float) -> bool:
    """Whether the run printed its "training started" line (progress on) within timeout."""
    end = time.monotonic() + timeout
    while time.monotonic() < end and process.poll() is None:
        process.files[1].seek(0)
        if b"training started:" in process.files[1].read():
            return True
        time.sleep(0.2)
    return False


def _signal_row(args: dict, label: str, processes: list, target, before: set[str]) -> dict:
    """SIGTERM to `target` once the first process says training started, and how the run
    ended; no signal at all (and the processes killed) if it never says so in time: a signal
    before the run's handlers are in place would test nothing of ours."""
    started = _wait_for_training(processes[0], min(60.0, _left(args) - 30))
    if not started:
        done = [finish_group(p, 0) for p in processes]
        return emit(args, {"label": label, "error": "no 'training started' line in time; "
                                                    "no signal sent",
                           "stderr": done[0]["stderr"][-800:]})
    time.sleep(1.0)  # well inside training
    sent = time.perf_counter()
    target.send_signal(signal.SIGTERM)
    done = [finish_group(p, min(60.0, _left(args) - 2)) for p in processes]
    records = [_summary(r) for r in _new_records(args, before)]
    return emit(args, {"label": label, "exit": [d["exit"] for d in done],
                       "exit_after_signal_s": time.perf_counter() - sent,
                       "records": len(records), "all_records": records,
                       **({"status": records[0]["status"], "reason": records[0]["reason"]}
                          if len(records) == 1 else {}),
                       "stderr": done[0]["stderr"][-800:]})


def section_ddp(args: dict) -> dict:
    steps = 150 if args["cuda"] else 30
    short = [*MARKOV_PAPER, f"trainer.max_steps={steps}", f"trainer.warmup_steps={steps // 10}",
             "model.kernel=torch", "trainer.eval_sequences=256", "trainer.log_every=25",
             "trainer.checkpoint_every=0"]
    # 1. two ranks to the end: one record, every collective on the device's tensors
    before = {r["run_id"] for r in _records(args["runs"])}
    start = time.perf_counter()
    done = [finish_group(p, _left(args) * 0.4)
            for p in _two_ranks(args, [*short, "trainer.progress=false"])]
    records = [_summary(r) for r in _new_records(args, before)]
    emit(args, {"label": "2 ranks on one device, gloo", "exit": [d["exit"] for d in done],
                "wall_s": time.perf_counter() - start, "records": len(records),
                **(records[0] if len(records) == 1 else {}), "all_records": records,
                **({"stderr": done[0]["stderr"][-1500:]} if any(d["exit"] for d in done)
                   else {})})
    # 2. NCCL, one process: the strategy a multi-GPU run uses
    if args["cuda"]:
        _run_row(args, "ddp, nccl, devices=1", [*short, "trainer.strategy=ddp",
                                                "trainer.devices=1", "trainer.accelerator=gpu",
                                                "trainer.process_group_backend=nccl"],
                 _left(args) * 0.3)
    else:
        emit(args, {"label": "ddp, nccl, devices=1", "skipped": "needs CUDA"})
    # 3. SIGTERM to rank 1 mid-training: both ranks stop together, one failed record
    long = [*MARKOV_PAPER, "model.kernel=torch", "trainer.checkpoint_every=0",
            "trainer.progress=true"]
    before = {r["run_id"] for r in _records(args["runs"])}
    processes = _two_ranks(args, long)
    _signal_row(args, "SIGTERM to rank 1 of 2", processes, processes[1], before)
    # 4. SIGTERM to a one-process run
    before = {r["run_id"] for r in _records(args["runs"])}
    process = start_group(_bench_argv("run", *long, _accelerator(args),
                                      f"out_dir={args['runs']}"))
    _signal_row(args, "SIGTERM to a one-process run", [process], process, before)
    return {}


def warm_shapes() -> dict[str, tuple[int, ...]]:
    """The scan shapes (batch, length, heads, headdim, groups, states, chunk) that the later
    sections run with the mamba_ssm kernel: speed's two configs and the 14.5M language model."""
    from bench.training.train import build
    from models.mamba import Mamba2Mixer
    shapes = {}
    for label, argv in (("markov_paper", MARKOV_PAPER), ("mamba_4x256_T1024", MAMBA_4x256),
                        ("mamba_lm14m", ["trainer=lm", "model=mamba_lm14m", "task=markov",
                                         "task.seq_len=256"])):
        config = _compose([*argv, "trainer.accelerator=cpu"])
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
        if _left(args) < TUNE_RESERVE_S:  # the autotune pass's time: the rest is not compiled
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
                      json.dumps({**args, "shapes": shapes})], _left(args) - 2, os.environ)
    if done["exit"] != 0:
        emit(args, {"label": "autotune on the compiled cache", "exit": done["exit"],
                    "stderr": done["stderr"][-800:]})
    return {}


def section_warm_one(spec: dict) -> dict:
    """One warm-up job: configuration `index` of every autotuned kernel at one scan shape."""
    import torch

    from bench.perf.kernel_parity import pin_configs
    from models import ssd
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
    import torch

    from models import ssd
    for label, shape in args["shapes"].items():
        if _left(args) < 5:
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
        done = finish_group(process, _left(args) - 2)
        if done["exit"] != 0:
            emit(args, {"label": f"parity {job}", "exit": done["exit"],
                        "stderr": done["stderr"][-600:]})
    return {}


def section_parity_one(args: dict) -> dict:
    import torch

    from bench.perf import kernel_parity as parity
    from bench.training.train import apply_tf32_policy
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


SPEED_CONFIGS = {"markov_paper": MARKOV_PAPER, "mamba_4x256_T1024": MAMBA_4x256}
LM_MODELS = ("mamba_lm14m", "transformer_lm14m", "mamba_lm110m", "mamba_lm200m")


def tuned_shapes(args: dict) -> set[str]:
    """The warm shapes (warm_shapes' labels) whose autotune finished earlier in this call: a
    process meeting one of them reads the tuned configs from Triton's cache."""
    return {r["label"].removeprefix("autotune ") for r in read_rows(Path(args["rows"]))
            if r["section"] == "warm" and str(r.get("label", "")).startswith("autotune ")
            and r.get("autotune_s") is not None and not r.get("error")}


def speed_plan(cuda: bool, kernel: bool, tuned: set[str]) -> list[tuple[str, str, str, bool]]:
    """(config, kernel, precision, compile) in the order timed: what needs no Triton autotune
    first (the pure-PyTorch scan, compile off), then mamba-ssm's kernel (tuned shapes before
    the rest), then torch.compile. A GPU call once lost every kernel row to a cold autotune
    met by the second row."""
    configs = list(SPEED_CONFIGS) if cuda else ["markov_paper"]  # CPU: minutes a 4x256 step
    kernels = ["torch"] + (["mamba_ssm"] if cuda and kernel else [])
    plan = []
    for compiled in ((False, True) if cuda else (False,)):  # CPU: ~80 s to compile
        for name in kernels:
            ordered = sorted(configs, key=lambda c: name == "mamba_ssm" and c not in tuned)
            plan += [(c, name, p, compiled) for c in ordered for p in ("32-true", "bf16-mixed")]
    return plan


def section_speed(args: dict) -> dict:
    import torch

    from bench.perf.kernel_parity import pin_configs
    from bench.perf.speed import (configured, lightning_step_time, sampler_cost, step_profile,
                             time_training)
    from bench.training.train import apply_tf32_policy, build
    from models.ssd import mamba_ssm_available
    apply_tf32_policy(False)
    device = torch.device("cuda" if args["cuda"] else "cpu")
    if not args["cuda"]:
        emit(args, {"label": "mamba_4x256_T1024", "skipped": "needs CUDA"})
    tuned, pinned = tuned_shapes(args), False
    plan = speed_plan(args["cuda"], args["cuda"] and mamba_ssm_available(), tuned)
    configs = {label: _compose([*SPEED_CONFIGS[label], _accelerator(args)])
               for label in dict.fromkeys(label for label, *_ in plan)}
    last_plain = max(i for i, (_, kernel, _, compiled) in enumerate(plan)
                     if kernel == "torch" and not compiled)
    for index, (label, kernel, precision, compiled) in enumerate(plan):
        name = f"{label} kernel={kernel} {precision} compile={'on' if compiled else 'off'}"
        if _left(args) < 10:
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
        if index == last_plain and _left(args) > 15:
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
                task, _ = build(_on_cpu(config))
                emit(args, {"label": f"{profiled} sampler", **sampler_cost(task, 10)})
    return {}


def _on_cpu(config):
    """The config on the CPU: a sampler's cost is measured where loader workers sample."""
    import dataclasses
    return dataclasses.replace(config, trainer=dataclasses.replace(config.trainer,
                                                                   accelerator="cpu"))


def lm_argv(args: dict, model: str) -> list[str]:
    return [*_text_argv(args), "trainer=lm", f"model={model}"]


def lm_plan(tuned: set[str]) -> list[tuple[str, bool, str | None]]:
    """(model, compile, kernel) in the order timed: compile off for every preset, then on for
    the two small ones; mamba-ssm's kernel only for a preset whose scan shape warm autotuned
    (warm_shapes has mamba_lm14m's), else the pure-PyTorch scan."""
    def kernel(model: str) -> str | None:
        return None if model.startswith("transformer") else (
            "mamba_ssm" if model in tuned else "torch")
    return ([(m, False, kernel(m)) for m in LM_MODELS]
            + [(m, True, kernel(m)) for m in LM_MODELS if m.endswith("14m")])


def section_lm(args: dict) -> dict:
    """The language-model presets at T 256 in bf16, compile off for all four, then on for the
    small two. mamba-ssm's kernel only where its shape was autotuned by warm (mamba_lm14m);
    elsewhere the pure-PyTorch scan, said in the row: a cold autotune costs minutes."""
    import torch

    from bench.training.memory import memory_estimate
    from bench.perf.speed import configured, time_training
    from bench.training.train import apply_tf32_policy, build
    from models.ssd import mamba_ssm_available
    apply_tf32_policy(False)
    device = torch.device("cuda")
    tuned = tuned_shapes(args) if mamba_ssm_available() else set()
    step: dict[str, float] = {}
    for model, compiled, kernel in lm_plan(tuned):
        label = f"{model} bf16-mixed compile={'on' if compiled else 'off'}"
        if _left(args) < 15 or (compiled and _left(args) < 40):
            emit(args, {"label": label, "skipped": "budget"})
            continue
        try:
            config = _compose(lm_argv(args, model))
            task, _ = build(config)
            estimate = memory_estimate(config, task, "cuda")
            setting = {"kernel": kernel, "precision": "bf16-mixed", "compile": compiled}
            torch.cuda.reset_peak_memory_stats()
            timing = time_training(configured(config, setting), device, args["steps"])
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


def section_text(args: dict) -> dict:
    steps = 300 if args["cuda"] else 10
    # on two cores: a few sequences, a few held-out windows (a 50257-token output layer)
    batch = [] if args["cuda"] else ["trainer.batch_size=4", "trainer.eval_batch_size=4",
                                     "task.eval_windows=8"]
    # mamba-ssm's kernel only if warm autotuned its shape: a cold autotune costs minutes
    kernel = "mamba_ssm" if args["cuda"] and "mamba_lm14m" in tuned_shapes(args) else "torch"
    _run_row(args, f"mamba_lm14m on pydoc, kernel={kernel}", [
        *_text_argv(args), "model=mamba_lm14m", f"model.kernel={kernel}", "trainer=lm",
        _accelerator(args), *batch,
        f"trainer.max_steps={steps}", f"trainer.warmup_steps={steps // 10}",
        "trainer.log_every=50", "trainer.checkpoint_every=0"], _left(args))
    return {}


def section_suite(args: dict) -> dict:
    before = {r["run_id"] for r in _records(args["runs"])}
    done = run_group(_bench_argv("suite", f"name={args['suite']}",
                                 f"entries={args['suite_entries']}", f"out_dir={args['runs']}",
                                 "trainer.progress=false"), _left(args) - 2)
    records = [_summary(r) for r in _new_records(args, before)]
    emit(args, {"label": f"suite {args['suite']} entries {args['suite_entries']}",
                "exit": done["exit"], "wall_s": done["wall_s"], "records": len(records),
                "all_records": records, "stdout": done["stdout"][-1500:]})
    return {}


SECTION_FUNCTIONS = {"env": section_env, "tiny": section_tiny, "paper": section_paper,
                     "ddp": section_ddp, "warm": section_warm, "warm_one": section_warm_one,
                     "tune": section_tune, "parity": section_parity,
                     "parity_one": section_parity_one, "speed": section_speed,
                     "lm": section_lm, "text": section_text, "suite": section_suite}


# --- the driver -------------------------------------------------------------------------------

def section_command(name: str, args: dict) -> list[str]:
    """The process of one section."""
    return [sys.executable, "-m", "bench.perf.gpucheck", name, json.dumps(args)]


def parse_options(argv: list[str]) -> dict:
    """The options, validated: a wrong one is a ValueError (bench.config.ConfigError is one)
    whose text is the error line. Nothing here needs a GPU or torch: a bad option is refused
    before a section (or a borrowed device's time) is spent."""
    from bench.config import ConfigError, check_path, entry_numbers, load_suite, shown
    options = dict(OPTIONS, out=os.environ.get("OUT") or str(Path("runs") / "gpucheck"))
    given = set()
    for arg in argv:
        key, _, value = arg.partition("=")
        if key not in options or not value and key != "tokenizer_file":
            raise ValueError(f"unknown or empty option '{shown(arg)}'; options: "
                             f"{', '.join(OPTIONS)}")
        if key in given:  # the second would win silently
            raise ValueError(f"'{key}' is given twice; give each option once")
        given.add(key)
        options[key] = value
    sections = options["sections"].split(",")
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        named = ", ".join(s or "'' (an empty name)" for s in unknown)
        raise ValueError(f"unknown section(s) {shown(named)}; choose from "
                         f"{', '.join(SECTIONS)}")
    twice = next((s for i, s in enumerate(sections) if s in sections[:i]), None)
    if twice is not None:  # one name, one result: the second run of a section has no place
        raise ValueError(f"section {twice} is listed twice; list each section once")
    try:
        budget = float(options["budget"])
    except ValueError:
        budget = math.nan
    if not math.isfinite(budget) or budget <= 0:
        raise ValueError(f"budget must be a positive number of seconds, got "
                         f"'{shown(options['budget'])}'")
    least = min(sections, key=NEEDS.__getitem__)
    if budget < NEEDS[least]:  # every section would be skipped: exit 0 having done nothing
        raise ValueError(f"budget={options['budget']} s is less than any section chosen "
                         f"needs (the least: {least}, ~{NEEDS[least]} s)")
    steps = options["steps"]  # isdigit() alone takes '²', which int() then refuses
    if not (steps.isascii() and steps.isdigit()) or steps[0] == "0" or len(steps) > 5 \
            or int(steps) > 10000:
        raise ValueError(f"steps must be an integer in [1, 10000], got '{shown(steps)}'")
    try:
        size = len(load_suite(options["suite"]))
        entry_numbers(options["suite_entries"], size)
    except ConfigError as error:
        raise ValueError(f"suite={shown(options['suite'])} "
                         f"suite_entries={shown(options['suite_entries'])}: {error}") from None
    check_path("out", options["out"], folder=True)
    if options["tokenizer_file"]:
        check_path("tokenizer_file", options["tokenizer_file"])
        if not Path(options["tokenizer_file"]).is_file():
            raise ValueError(f"tokenizer_file {options['tokenizer_file']} is not a file")
    return {**options, "sections": sections, "budget": budget, "steps": int(steps)}


def _writable_folder(path: Path) -> None:
    """Create `path` if needed and check a file can be written there (before anything runs)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".gpucheck-probe-"):
            pass
    except OSError as error:
        raise ValueError(f"out={path} cannot be written: {error.strerror or error}") from None


def _environment(scratch: Path) -> dict:
    from bench.perf.kernel_parity import stand_in_env
    env = stand_in_env(os.environ)  # for mamba-ssm's CUDA-less install (see the docstring)
    env.setdefault("TRITON_CACHE_DIR", str(scratch / "triton"))
    env.update(TRITON_CACHE_AUTOTUNING="1", TRITON_F32_DEFAULT="ieee", HF_HUB_OFFLINE="1",
               HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    return env


def main(argv: list[str]) -> int:
    try:
        options = parse_options(argv)
        out = Path(options["out"])
        _writable_folder(out)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    import torch  # whether the CUDA-only sections can run
    cuda = torch.cuda.is_available()
    budget_end = time.monotonic() + options["budget"]
    scratch = Path(tempfile.mkdtemp(prefix="gpucheck-"))
    runs = scratch / "runs"
    env = _environment(scratch)
    rows_path, log_path = out / "rows.jsonl", out / "log.txt"
    for path in (rows_path, log_path):
        path.write_text("")
    from bench.perf.kernel_parity import missing_stand_ins
    from tasks.files import write_atomic
    results: dict = {"options": {**options, "sections": ",".join(options["sections"])},
                     "cuda": cuda, "stand_ins": missing_stand_ins(),
                     "triton_cache": env["TRITON_CACHE_DIR"], "sections": {}}

    def save() -> None:
        rows = read_rows(rows_path)
        for name, section in results["sections"].items():
            section["rows"] = [r for r in rows if r["section"] == name]
        write_atomic(out / "gpucheck.json",
                     lambda tmp: Path(tmp).write_text(json.dumps(results, indent=1, default=str)))

    print(f"gpucheck: {len(options['sections'])} sections, budget {options['budget']:.0f} s, "
          f"{'CUDA' if cuda else 'no CUDA: a CPU rehearsal'}; figures in {out}", flush=True)
    handlers = {s: signal.signal(s, _stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        run_sections(options, cuda, budget_end, scratch, env, results, save, out)
    except Stopped as stop:
        results["stopped"] = f"by {stop}"
        for section in results["sections"].values():
            if section.get("status") == "running":
                section["status"] = f"stopped by {stop}"
        save()
        print(f"gpucheck: stopped by {stop}; what was measured is in {out}", file=sys.stderr)
        return 128 + stop.signum
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    if runs.is_dir():
        with tarfile.open(out / "records.tar.gz", "w:gz") as tar:
            tar.add(runs, arcname="runs", filter=lambda info: None if any(
                part in ("weights", "checkpoints", "cache") for part in Path(info.name).parts)
                else info)
    save()
    print("\nrows (every figure: rows.jsonl; by section: gpucheck.json)")
    for row in read_rows(rows_path):
        print("  " + brief(row))
    return 0


def run_sections(options: dict, cuda: bool, budget_end: float, scratch: Path, env: dict,
                 results: dict, save, out: Path) -> None:
    """Each section in turn, within the budget (see the module's docstring)."""
    runs, rows_path, log_path = scratch / "runs", out / "rows.jsonl", out / "log.txt"
    for name in options["sections"]:
        left = budget_end - time.monotonic()
        if name in CUDA_ONLY and not cuda:
            results["sections"][name] = {"skipped": "needs CUDA"}
        elif left < NEEDS[name]:
            results["sections"][name] = {"skipped": f"{left:.0f} s of the budget left, needs "
                                                    f"~{NEEDS[name]} s"}
        if name in results["sections"]:
            print(f"== {name}: skipped ({results['sections'][name]['skipped']})", flush=True)
            save()
            continue
        cap = min(left, CAPS[name])
        args = {"section": name, "rows": str(rows_path.resolve()), "runs": str(runs),
                "scratch": str(scratch), "cuda": cuda, "deadline": time.monotonic() + cap - 3,
                "steps": options["steps"], "suite": options["suite"],
                "suite_entries": options["suite_entries"],
                "tokenizer_file": options["tokenizer_file"]}
        results["sections"][name] = {"status": "running"}  # what a stop mid-way says
        done = run_group(section_command(name, args), cap, env)
        summary = {}
        if done["exit"] == 0 and done["stdout"].strip():
            with contextlib.suppress(json.JSONDecodeError):
                summary = json.loads(done["stdout"].splitlines()[-1])
        status = ("ok" if done["exit"] == 0 else f"killed at its cap of {cap:.0f} s"
                  if done["exit"] == "timeout" else f"failed (exit {done['exit']})")
        section = {"status": status, "section_s": done["wall_s"], "summary": summary}
        if done["exit"] != 0:
            section["stderr"] = done["stderr"][-3000:]
        results["sections"][name] = section
        with open(log_path, "a") as log:
            log.write(f"===== {name}: {status} in {done['wall_s']:.0f} s\n--- stdout\n"
                      f"{done['stdout'][-20000:]}\n--- stderr\n{done['stderr'][-20000:]}\n")
        save()
        rows = results["sections"][name]["rows"]
        print(f"== {name}: {status} in {done['wall_s']:.0f} s, {len(rows)} rows", flush=True)
        if done["exit"] != 0:
            print("   " + done["stderr"].strip().splitlines()[-1][:300]
                  if done["stderr"].strip() else "   (no output)", flush=True)


if __name__ == "__main__":
    name, arguments = sys.argv[1], json.loads(sys.argv[2])
    result = SECTION_FUNCTIONS[name](arguments)
    print(json.dumps(result, default=str))
