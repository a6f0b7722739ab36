"""Throughput of the training step of a configured run and of the task's sampler and oracle.

Timings exclude the first steps (allocation, lazy initialisation) and synchronise CUDA before
reading the clock."""
from __future__ import annotations

import time

import torch

from bench.config import RunConfig
from bench.train import build, masked_loss
from tasks.base import TRAIN_STREAM, make_generator


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, repeats: int, device: torch.device, warmup: int = 3) -> float:
    """Seconds per call of fn, after warm-up calls."""
    for _ in range(warmup):
        fn()
    _sync(device)
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    _sync(device)
    return (time.perf_counter() - start) / repeats


def measure(config: RunConfig, steps: int = 20) -> dict:
    accelerator = config.trainer.accelerator
    device = torch.device("cuda" if accelerator in ("gpu", "cuda", "auto")
                          and torch.cuda.is_available() else "cpu")
    task, model = build(config)
    model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.trainer.lr, betas=(0.9, 0.95))
    bs = config.trainer.batch_size
    counter = iter(range(10**9))

    def sample():
        return task.sample(bs, make_generator(TRAIN_STREAM, config.seed, 0, next(counter),
                                              device=device))

    batch = sample()

    def train_step():
        optimizer.zero_grad(set_to_none=True)
        loss = masked_loss(task, model(batch.inputs), batch)
        loss.backward()
        optimizer.step()

    step_s = _timed(train_step, steps, device)
    sample_s = _timed(sample, max(3, steps // 4), device)
    cpu_batch = batch.to("cpu")
    oracles = {name: _timed(lambda r=ref: r.predict(cpu_batch), max(3, steps // 4),
                            torch.device("cpu"))
               for name, ref in task.references().items()}
    tokens = bs * task.seq_len
    return {"task": config.task_name, "model": config.model_name, "device": str(device),
            "threads": torch.get_num_threads(), "batch_size": bs, "seq_len": task.seq_len,
            "params": model.num_parameters(), "train_step_s": step_s,
            "train_tokens_per_s": tokens / step_s, "train_steps_per_s": 1 / step_s,
            "sampler_tokens_per_s": tokens / sample_s,
            "oracle_tokens_per_s": {name: tokens / s for name, s in oracles.items()}}


def print_speed(r: dict) -> None:
    print(f"{r['model']} on {r['task']} ({r['device']}, {r['threads']} threads): batch "
          f"{r['batch_size']} x {r['seq_len']} positions, {r['params']} parameters")
    print(f"  training   {r['train_tokens_per_s']:>12,.0f} tokens/s   "
          f"{r['train_steps_per_s']:8.2f} steps/s   ({r['train_step_s'] * 1e3:.1f} ms/step, "
          "forward + backward + AdamW)")
    print(f"  sampler    {r['sampler_tokens_per_s']:>12,.0f} tokens/s")
    for name, rate in r["oracle_tokens_per_s"].items():
        print(f"  {name:<10} {rate:>12,.0f} tokens/s   (reference, CPU float64)")
