"""What the language-model loss costs, torch's against the chunked one (bench/training/cross_entropy.py):

    python -m bench.perf.lm_loss [model=mamba_lm14m] [batch=2] [seq_len=256] [vocab=50257]
                                 [reps=5] [out=f.json]

One training step of the preset on random GPT-2-sized tokens (forward, the loss, backward,
AdamW), in 32-true and under bf16 autocast (bf16-mixed), with the loss taken either way:
"torch" is the masked loss as it was (cross_entropy of all the logits cast to float32),
"chunked" today's. Per precision and loss: the peak bytes the step's ops allocate (counted by
bench.training.memory.Allocations: exact, whatever else the machine runs) and the median ms
per step over `reps` steps, the two losses alternated step by step so that drift on a shared
machine falls on both. On a CUDA machine the model runs there and the peak is also read from
torch.cuda.max_memory_allocated."""
from __future__ import annotations

import contextlib
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from bench.config import ConfigError, compose
from bench.records.store import output_path, write_json
from bench.training.cross_entropy import chunked_cross_entropy
from bench.training.memory import Allocations
from models import IOSpec, build_model

LOSSES = {
    "torch": lambda logits, targets: F.cross_entropy(logits.float(), targets, reduction="none"),
    "chunked": chunked_cross_entropy,
}
PRECISIONS = {"32-true": None, "bf16-mixed": torch.bfloat16}
OPTIONS = {"model": "mamba_lm14m", "batch": "2", "seq_len": "256", "vocab": "50257",
           "reps": "5", "out": ""}


def measure(model_name: str, batch: int, seq_len: int, vocab: int, reps: int) -> dict:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    config = compose([f"model={model_name}"])
    model = build_model(config.model_family, config.model,
                        IOSpec("tokens", vocab, vocab, seq_len)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randint(vocab, (batch, seq_len), generator=generator).to(device)
    targets = torch.randint(vocab, (batch * seq_len,), generator=generator).to(device)

    def step(loss_of, half) -> float:
        autocast = (torch.autocast(device.type, dtype=half) if half is not None
                    else contextlib.nullcontext())
        start = time.perf_counter()
        with autocast:
            logits = model(inputs).flatten(0, -2)
        loss_of(logits, targets).mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    result = {"model": model_name, "parameters": sum(p.numel() for p in model.parameters()),
              "batch": batch, "seq_len": seq_len, "vocab": vocab, "device": device.type,
              "threads": torch.get_num_threads(), "steps": {}}
    for precision, half in PRECISIONS.items():
        for name, loss_of in LOSSES.items():
            step(loss_of, half)  # AdamW's state exists before the counted step
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            with Allocations() as allocated:
                step(loss_of, half)
            entry = {"peak_allocated_mib": round(allocated.peak / 2**20, 1)}
            if device.type == "cuda":
                entry["cuda_max_allocated_mib"] = round(torch.cuda.max_memory_allocated()
                                                        / 2**20, 1)
            result["steps"][f"{precision} {name}"] = entry
        times = {name: [] for name in LOSSES}
        for _ in range(reps):
            for name, loss_of in LOSSES.items():
                times[name].append(step(loss_of, half))
        for name in LOSSES:
            result["steps"][f"{precision} {name}"]["ms_per_step"] = round(
                1000 * statistics.median(times[name]), 1)
    return result


def main(argv: list[str]) -> int:
    options = dict(OPTIONS)
    for arg in argv:
        key, _, value = arg.partition("=")
        if key not in options or not value and key != "out":
            raise ConfigError(f"lm_loss takes {', '.join(f'{k}=' for k in OPTIONS)}; got '{arg}'")
        options[key] = value
    try:
        sizes = {key: int(options[key]) for key in ("batch", "seq_len", "vocab", "reps")}
    except ValueError:
        raise ConfigError("lm_loss: batch, seq_len, vocab and reps are integers") from None
    if options["out"]:
        output_path(options["out"])  # refused now, not after the minutes of measuring
    result = measure(options["model"], **sizes)
    print(f"{result['model']} ({result['parameters']:,} parameters), batch {result['batch']} x "
          f"{result['seq_len']} tokens, vocabulary {result['vocab']:,}, {result['device']}, "
          f"{result['threads']} threads")
    print(f"{'precision and loss':<22} {'peak MiB':>9} {'ms/step':>8}")
    for name, entry in result["steps"].items():
        print(f"{name:<22} {entry['peak_allocated_mib']:>9.1f} {entry['ms_per_step']:>8.1f}")
    if options["out"]:
        write_json(options["out"], result)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
