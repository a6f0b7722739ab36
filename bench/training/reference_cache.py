"""The held-out set and its reference scores, computed once per task configuration.

Every model of a task is scored on the same held-out sequences against the same references, so
both are a function of the task alone: of its family and configuration, the number of held-out
sequences, the code that samples and predicts (the `tasks` package and the scoring code) and the
torch version (whose random streams draw the set). Those make the key; the file holds the
held-out inputs, targets and mask (not the latent parameters: only the references need those,
and their scores are in the file) and the references' per-position scores.

Files live in <out_dir>/cache/references/, are written whole (a temporary file, then a rename)
so that concurrent runs and interrupted ones never leave a partial file, carry a digest of their
content, and are recomputed (and replaced) when unreadable or when their content does not match
the digest: a flipped byte must not become a Bayes loss. A cache that cannot be written costs the
next run the recomputation, never this run its result. Delete the folder to recompute
everything."""
from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import torch

import tasks
from bench.config import RunConfig, first_line
from bench.training import evaluate
from bench.training.evaluate import ReferenceScores, content_digest, reference_scores
from tasks.base import TEST_STREAM, Batch, Task
from tasks.files import write_atomic

FORMAT = "icl-bench/reference-cache/2"  # 2: with a content digest
CACHE_DIR = os.path.join("cache", "references")  # under out_dir


@functools.cache
def _source_digest() -> str:
    """A digest of the code the cached values depend on: every module of the `tasks` package,
    its subpackages (tasks/corpora) included (samplers and references), and the scoring code, as
    this process loaded it (read once: an edit while a suite runs must not send its later runs
    to another cache key)."""
    digest = hashlib.sha256()
    root = Path(tasks.__file__).parent
    files = sorted(root.rglob("*.py")) + [Path(evaluate.__file__)]
    for path in files:
        digest.update((path.relative_to(root).as_posix() if path.is_relative_to(root)
                       else path.name).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def cache_key(task: Task, n: int) -> str:
    description = {"format": FORMAT, "family": task.family, "config": task.config_dict(),
                   "sequences": n, "split": TEST_STREAM, "torch": torch.__version__,
                   "code": _source_digest(), "data": task.cache_identity()}
    return hashlib.sha256(json.dumps(description, sort_keys=True, default=str).encode()).hexdigest()


def cache_path(out_dir: str, task: Task, n: int) -> Path:
    return Path(out_dir) / CACHE_DIR / f"{task.family}-{cache_key(task, n)[:20]}.pt"


def load(out_dir: str, task: Task, n: int) -> tuple[Batch, ReferenceScores] | None:
    """The cached held-out set (without latent parameters) and reference scores, or None when
    there is no usable file (missing, unreadable, or written for another key)."""
    path = cache_path(out_dir, task, n)
    if not path.is_file():
        return None
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
        if data.get("format") != FORMAT or data.get("key") != cache_key(task, n):
            return None  # another format or key: not this run's cache, replaced quietly
        if data.get("digest") != content_digest(data["content"]):
            damaged(path, "does not match the digest it was written with")
            return None  # recomputed and replaced
        data = data["content"]
        batch = Batch(data["inputs"], data["targets"], data["loss_mask"])
        return batch, ReferenceScores(data["scores"], data["reference_probs"])
    except Exception as error:  # a damaged file is recomputed (and replaced) rather than trusted
        damaged(path, f"cannot be read ({type(error).__name__})")
        return None


def damaged(path: Path, why: str) -> None:
    """Says that a cache file is not used: its values are recomputed, and the file replaced."""
    print(f"warning: the reference cache {path} {why}; recomputing it", file=sys.stderr)


def save(out_dir: str, task: Task, n: int, batch: Batch, references: ReferenceScores) -> Path:
    """Write the cache file whole: a temporary file in the same folder, then an atomic rename."""
    path = cache_path(out_dir, task, n)
    path.parent.mkdir(parents=True, exist_ok=True)
    content = {"inputs": batch.inputs.cpu(), "targets": batch.targets.cpu(),
               "loss_mask": batch.loss_mask.cpu(), "scores": references.scores,
               "reference_probs": references.reference_probs}
    data = {"format": FORMAT, "key": cache_key(task, n), "digest": content_digest(content),
            "content": content}
    def write(temporary: str) -> None:
        with open(temporary, "wb") as file:  # a file object: a full disk is OSError ENOSPC, not
            torch.save(data, file)           # the archive writer's "enforce fail" RuntimeError
    write_atomic(path, write)
    return path


def held_out_set(config: RunConfig, task: Task) -> tuple[Batch, ReferenceScores | None]:
    """Fix the task's held-out set for Trainer.test: from the cache when it holds this task
    configuration (then with the references' scores), else sampled (scores None)."""
    n = config.trainer.eval_sequences
    cached = load(config.out_dir, task, n) if config.trainer.reference_cache else None
    batch = task.set_held_out(n, config.trainer.eval_batch_size,
                              batch=cached[0] if cached else None)
    return batch, cached[1] if cached else None


def complete(config: RunConfig, task: Task, batch: Batch,
             cached: ReferenceScores | None) -> ReferenceScores:
    """The references' scores on the held-out set: the cached ones, or computed now (and then
    cached, unless trainer.reference_cache=false)."""
    if cached is not None:
        return cached
    progress = config.trainer.progress
    if progress:  # a first run of lgssm waits about a minute here, after its bars have ended
        where = (f"; cached under {Path(config.out_dir) / CACHE_DIR} for the next "
                 "run" if config.trainer.reference_cache else "")
        print(f"references: computing {len(task.references())} references on "
              f"{len(batch.inputs)} held-out sequences (none cached yet{where})",
              file=sys.stderr, flush=True)
    began = time.perf_counter()
    references = reference_scores(task, batch)
    if progress:
        print(f"references: computed in {time.perf_counter() - began:.1f} s", file=sys.stderr,
              flush=True)
    if config.trainer.reference_cache:
        # keyed by the requested size, as held_out_set looks it up (a text task's split
        # decides its own number of windows)
        try:
            save(config.out_dir, task, config.trainer.eval_sequences, batch, references)
        except Exception as error:  # read-only, a file in the way, a full disk: not this run's loss
            print(f"warning: the reference cache was not written ({type(error).__name__}: "
                  f"{first_line(error)}); the next run of this task recomputes it",
                  file=sys.stderr)
    return references
