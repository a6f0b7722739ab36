"""The model contract: one backbone path for every architecture and every task kind.

    inputs ─► input adapter ─► core (the architecture's blocks) ─► output adapter ─► prediction

The input adapter is a token embedding (`tokens`) or a linear map of vectors (`vectors`); the
output adapter gives next-token logits or a predicted vector. A core maps (B, T, d_model) to
(B, T, d_model), is causal, owns its initialisation, and reports `state_size(seq_len)`: the
number of floats it must carry to continue the sequence (recurrent state, or KV cache at the
evaluated length). A core that needs the raw inputs (e.g. analytically constructed parameters)
sets `owns_io = True` and then maps inputs to predictions itself.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class IOSpec:
    """What the task feeds in and expects out."""

    kind: str  # "tokens" | "vectors"
    input_dim: int  # vocabulary size or input vector size
    output_dim: int  # vocabulary size or target vector size
    max_len: int  # longest sequence the model will see (learned positions, KV-cache size)


class Core(nn.Module, abc.ABC):
    """Base class of every architecture. Subclasses set the class attributes and implement
    `__init__(config, io)`, `forward(x)` and `state_size(seq_len)`."""

    family: ClassVar[str]
    Config: ClassVar[type]  # dataclass; must have an int field `d_model`
    description: ClassVar[str]
    owns_io: ClassVar[bool] = False

    def __init__(self, config, io: IOSpec):
        super().__init__()
        self.config = config
        self.io = io

    @abc.abstractmethod
    def state_size(self, seq_len: int) -> int:
        """Floats of state carried to continue a sequence of length seq_len."""


class Backbone(nn.Module):
    """Input adapter, core, output adapter. For `tokens` the forward pass returns logits; the
    prediction format of the task contract (log-probabilities) is `predict`."""

    def __init__(self, core: Core, io: IOSpec):
        super().__init__()
        self.io = io
        self.core = core
        if not core.owns_io:
            d_model = core.config.d_model
            self.encoder = (nn.Embedding(io.input_dim, d_model) if io.kind == "tokens"
                            else nn.Linear(io.input_dim, d_model))
            self.decoder = nn.Linear(d_model, io.output_dim)

    def forward(self, inputs: Tensor) -> Tensor:
        if self.core.owns_io:
            return self.core(inputs)
        return self.decoder(self.core(self.encoder(inputs)))

    def predict(self, inputs: Tensor) -> Tensor:
        """Predictions in the task contract's format: log-probabilities or vector means."""
        out = self(inputs)  # through __call__: the compiled forward when compiled
        if self.io.kind == "tokens" and not getattr(self.core, "outputs_log_probs", False):
            out = torch.log_softmax(out.float(), dim=-1)
        return out

    def state_size(self, seq_len: int) -> int:
        return self.core.state_size(seq_len)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
