"""Stand-in (see transformers/__init__.py): the two names mamba_ssm/utils/hf.py imports, with
transformers' values."""

WEIGHTS_NAME = "pytorch_model.bin"
CONFIG_NAME = "config.json"
