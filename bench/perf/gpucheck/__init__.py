"""python -m bench gpucheck: the GPU path checked in one call that fits a device lease.

    python -m bench gpucheck [sections=env,speed,lm,ddp,tiny,paper,warm,parity,text,suite]
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
- ddp:    NCCL with devices=1 (CUDA; first, in a time of its own), two processes sharing the
          device (gloo over its tensors: DDP's all-reduce, the signal agreement, the evaluation's
          gather), SIGTERM to one rank of such a run once training has started (its own
          "training started" line), and SIGTERM to a one-process run;
- warm:   the parallel Triton compile above, then the autotuning of each shape on the compiled
          cache (how long a cold and a warm autotune take);
- parity: mamba-ssm's `mamba_chunk_scan_combined` vs our chunked scan vs the float64 sequential
          oracle, forward and backward, on the scans of `mamba`, `mambazero`, `mamba_lm14m` and a
          4-head 2-group one, as the models call it (float32 / bf16- / fp16-rounded inputs,
          computed in float32) and raw (bf16, fp16 inputs), against kernel_parity.CUDA_TOLERANCE;
- speed:  ms/step and tokens/s of the paper's Markov config and of a 4-layer d_model 256 Mamba at
          T 1024, 32-true and bf16-mixed: the pure-PyTorch scan compile off then on, then
          mamba_ssm's kernel (off, on),
          peak memory; the host synchronisations of one whole training step (bench.perf.speed
          step_profile, CUDA's sync debug mode); the sampler's cost;
- lm:     the language-model presets at T 256 in bf16, each built with its planned kernel (never
          `auto`: its smoke test would autotune cold): tokens/s, peak memory against the pre-run
          estimate, the projected time of suite paper000_text;
- text:   a short `mamba_lm14m` run on the text path;
- suite:  entries of `suite name=paper000_gpu` (or `suite=`) while the budget lasts.

mamba-ssm: a GPU check's machine installs the wheel built without its CUDA extension
(`MAMBA_SKIP_CUDA_BUILD=TRUE`, `--no-deps`: README.md, section GPUs), which the plain import of the
kernel (models/ssd.py) cannot import by itself: the package's `__init__` needs `selective_scan_cuda`
and `transformers`. Every section process gets the kernel parity harness's stand-ins for whichever
of the two is missing (bench/perf/kernel_parity.py `stand_in_env`; `stand_ins` in gpucheck.json).

Modules: plan (sections, budgets, options), processes (process groups), rows (figures and the
runs behind them), driver (the
call), and the sections: runs (env, tiny, paper, text, suite), ddp, kernel (warm, parity),
throughput (speed, lm); __main__ runs one section in its own process."""
