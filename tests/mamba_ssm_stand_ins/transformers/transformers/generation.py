"""Stand-in (see transformers/__init__.py): the two names mamba_ssm/utils/generation.py imports."""


class GenerateDecoderOnlyOutput:
    """Placeholder: mamba_ssm only names it in its generation utilities."""


class TextStreamer:
    """Placeholder: mamba_ssm only names it in its generation utilities."""
