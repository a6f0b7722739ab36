"""A placeholder for the `transformers` package, for the kernel parity harness only
(bench/perf/kernel_parity.py `stand_in_env` puts it on PYTHONPATH only where transformers is not
installed).

mamba-ssm's `__init__` imports its language-model classes, which import three names from
transformers at module level (mamba_ssm/utils/generation.py and utils/hf.py). The install the
harness uses leaves transformers out (`--no-deps`); these modules define just those names so that
`import mamba_ssm` succeeds. Nothing of ours calls them, and the one function among them raises.
"""
