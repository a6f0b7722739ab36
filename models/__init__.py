"""Architectures. Each module here defines one or more families (`Core` subclasses with a
`family` name; their configs in models/configs.py); they are discovered on first use, so adding
one means a module, its config and a YAML file."""
from __future__ import annotations

import importlib
import pkgutil

CONTRACT = ("Backbone", "Core", "IOSpec")
__all__ = [*CONTRACT, "model_families", "build_model"]


def __getattr__(name: str):
    """The contract's names (models.backbone) load on first use: it imports torch, which the
    package's light module (configs, used to compose a command line) must not pull in."""
    if name in CONTRACT:
        return getattr(importlib.import_module("models.backbone"), name)
    raise AttributeError(f"module 'models' has no attribute {name!r}")


def model_families() -> dict[str, type]:
    """{family name: Core subclass} for every module of this package."""
    from models.backbone import Core
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    found: dict[str, type[Core]] = {}
    stack = list(Core.__subclasses__())
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        if "family" in cls.__dict__:
            found[cls.family] = cls
    return dict(sorted(found.items()))


def build_model(family: str, config, io):
    from models.backbone import Backbone
    return Backbone(model_families()[family](config, io), io)
