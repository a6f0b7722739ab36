"""LSTM baseline: a stack of `torch.nn.LSTM` layers of width d_model.

The classical gated non-linear RNN, a reference point for the linear recurrences (LRU, RG-LRU,
selective SSMs): its state update depends non-linearly on the previous state, so it has no
parallel scan, and it carries a hidden vector h and a cell vector c per layer.

Initialisation: input weights Glorot-uniform, recurrent weights orthogonal per gate (the linear
part of the recurrence preserves norms at the start), biases zero except the
forget gate's, set to 1 so that the cell starts out remembering.
"""
from __future__ import annotations


import torch
from torch import Tensor, nn

from models.backbone import Core, IOSpec
from models.configs import LSTMConfig


class LSTM(Core):
    family = "lstm"
    Config = LSTMConfig
    description = ("LSTM: stacked torch.nn.LSTM layers (hidden = d_model), forget-gate bias 1, "
                   "orthogonal recurrent weights; the non-linear RNN baseline")

    def __init__(self, config: LSTMConfig, io: IOSpec):
        super().__init__(config, io)
        self.lstm = nn.LSTM(config.d_model, config.d_model, config.n_layers, batch_first=True)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        hidden = self.config.d_model
        for layer in range(self.config.n_layers):
            nn.init.xavier_uniform_(getattr(self.lstm, f"weight_ih_l{layer}"))
            recurrent = getattr(self.lstm, f"weight_hh_l{layer}")
            for gate in recurrent.split(hidden, dim=0):  # PyTorch's gate order: i, f, g, o
                nn.init.orthogonal_(gate)
            bias_ih = getattr(self.lstm, f"bias_ih_l{layer}")
            nn.init.zeros_(bias_ih)
            nn.init.zeros_(getattr(self.lstm, f"bias_hh_l{layer}"))
            bias_ih[hidden:2 * hidden] = 1.0

    def forward(self, x: Tensor) -> Tensor:
        with torch.autocast(device_type=x.device.type, enabled=False):
            return self.lstm(self._input(x))[0]

    def _input(self, x: Tensor) -> Tensor:
        """The recurrence runs in the parameters' dtype with autocast off: under bf16 autocast
        the fused LSTM would carry the cell state c in bfloat16 and round it at every step
        (measured: 22% relative error after 1024 steps with forget gates near 1)."""
        return x.to(self.lstm.weight_ih_l0.dtype)

    def forward_sequential(self, x: Tensor) -> tuple[Tensor, list[Tensor]]:
        """One time step per call, carrying (h, c) between calls: the form that continues a
        sequence. Returns the outputs and the final [h, c], each (n_layers, B, d_model)."""
        state = None
        outputs = []
        with torch.autocast(device_type=x.device.type, enabled=False):
            x = self._input(x)
            for t in range(x.shape[1]):
                y, state = self.lstm(x[:, t:t + 1], state)
                outputs.append(y)
        return torch.cat(outputs, dim=1), list(state)

    def state_size(self, seq_len: int) -> int:
        """h and c of width d_model in every layer."""
        return 2 * self.config.d_model * self.config.n_layers
