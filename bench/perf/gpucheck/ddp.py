"""Section ddp: NCCL with one device (first: never measured yet), two ranks sharing the device
over gloo, SIGTERM to one rank once training has started, and SIGTERM to a one-process run."""
from __future__ import annotations

import os
import signal
import socket
import time

from bench.perf.gpucheck.plan import MARKOV_PAPER, NCCL_S
from bench.perf.gpucheck.processes import finish_group, start_group
from bench.perf.gpucheck.rows import (accelerator, bench_argv, emit, new_records, records_in,
                                      run_row, seconds_left, summary)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_ranks(args: dict, argv: list[str]) -> list:
    """Two processes of one run that share this machine's one device: Lightning's multi-node
    set-up (num_nodes=2, one device each) with the launcher's variables set by hand, so both
    use device 0; gloo's collectives run over its tensors."""
    port = free_port()
    processes = []
    for rank in (0, 1):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2",
                   NODE_RANK=str(rank), LOCAL_RANK="0")
        processes.append(start_group(bench_argv(
            "run", *argv, accelerator(args), "trainer.strategy=ddp", "trainer.num_nodes=2",
            "trainer.devices=1", "trainer.process_group_backend=gloo",
            f"out_dir={args['runs']}"), env))
    return processes


def wait_for_training(process, timeout: float) -> bool:
    """Whether the run printed its "training started" line (progress on) within timeout."""
    end = time.monotonic() + timeout
    while time.monotonic() < end and process.poll() is None:
        process.files[1].seek(0)
        if b"training started:" in process.files[1].read():
            return True
        time.sleep(0.2)
    return False


def signal_row(args: dict, label: str, processes: list, target, before: set[str]) -> dict:
    """SIGTERM to `target` once the first process says training started, and how the run
    ended; no signal at all (and the processes killed) if it never says so in time: a signal
    before the run's handlers are in place would test nothing of ours."""
    started = wait_for_training(processes[0], min(60.0, seconds_left(args) - 30))
    if not started:
        done = [finish_group(p, 0) for p in processes]
        return emit(args, {"label": label, "error": "no 'training started' line in time; "
                                                    "no signal sent",
                           "stderr": done[0]["stderr"][-800:]})
    time.sleep(1.0)  # well inside training
    sent = time.perf_counter()
    target.send_signal(signal.SIGTERM)
    done = [finish_group(p, min(60.0, seconds_left(args) - 2)) for p in processes]
    records = [summary(r) for r in new_records(args, before)]
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
    # 1. NCCL, one process: the strategy a multi-GPU run uses, never measured yet, so first and
    # with a time of its own (a `bench run` of this config took ~27 s on call 1's H100; it had
    # 0.3 of what was left, ~25 s)
    if args["cuda"]:
        run_row(args, "ddp, nccl, devices=1", [*short, "trainer.strategy=ddp",
                                                "trainer.devices=1", "trainer.accelerator=gpu",
                                                "trainer.process_group_backend=nccl"],
                min(NCCL_S, seconds_left(args) - 5))
    else:
        emit(args, {"label": "ddp, nccl, devices=1", "skipped": "needs CUDA"})
    # 2. two ranks to the end: one record, every collective on the device's tensors
    before = {r["run_id"] for r in records_in(args["runs"])}
    start = time.perf_counter()
    done = [finish_group(p, seconds_left(args) * 0.4)
            for p in two_ranks(args, [*short, "trainer.progress=false"])]
    records = [summary(r) for r in new_records(args, before)]
    emit(args, {"label": "2 ranks on one device, gloo", "exit": [d["exit"] for d in done],
                "wall_s": time.perf_counter() - start, "records": len(records),
                **(records[0] if len(records) == 1 else {}), "all_records": records,
                **({"stderr": done[0]["stderr"][-1500:]} if any(d["exit"] for d in done)
                   else {})})
    # 3. SIGTERM to rank 1 mid-training: both ranks stop together, one failed record
    long = [*MARKOV_PAPER, "model.kernel=torch", "trainer.checkpoint_every=0",
            "trainer.progress=true"]
    before = {r["run_id"] for r in records_in(args["runs"])}
    processes = two_ranks(args, long)
    signal_row(args, "SIGTERM to rank 1 of 2", processes, processes[1], before)
    # 4. SIGTERM to a one-process run
    before = {r["run_id"] for r in records_in(args["runs"])}
    process = start_group(bench_argv("run", *long, accelerator(args),
                                      f"out_dir={args['runs']}"))
    signal_row(args, "SIGTERM to a one-process run", [process], process, before)
    return {}
