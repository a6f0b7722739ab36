"""Architectures. Each module here defines one or more families (`Core` subclasses with a
`family` name); they are discovered on first use, so adding one means a module and a YAML file."""
from __future__ import annotations

import importlib
import pkgutil

from models.backbone import Backbone, Core, IOSpec

__all__ = ["Backbone", "Core", "IOSpec", "model_families", "build_model"]


def model_families() -> dict[str, type[Core]]:
    """{family name: Core subclass} for every module of this package."""
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


def build_model(family: str, config, io: IOSpec) -> Backbone:
    return Backbone(model_families()[family](config, io), io)
