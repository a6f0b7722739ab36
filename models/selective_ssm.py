"""The simplified selective SSM of paper 004 (§3.1, App. B.1) and its non-selective ablation.

Each layer keeps a diagonal state h_t ∈ R^n (n = d_model) and updates it as

    s_t = SiLU(U x_t + b)                    selective projection
    Ā_t = W_A s_t + b_A,  B̄_t = W_B s_t + b_B  selective linear maps (App. B.1)
    h_t = Ā_t ⊙ h_{t-1} + B̄_t ⊙ x_t          h_{-1} = 0

and the prediction is a linear read-out of h_t (the Backbone's output adapter). Paper 004 writes
Ā_t h_{t-1} with Ā_t the output of an n×n linear map of s_t, i.e. an n-vector: the state is
diagonal. x_t is the layer input (the input adapter's d_model-vector), so B̄_t x_t is element-wise.

Variants:
- `selective=False`: the App. B.2 ablation, Ā and B̄ are fixed learned vectors (no s_t at all).
- `transition="exp"`: Ā_t = exp(-softplus(W_A s_t + b_A)) ∈ (0, 1), the Mamba-style positive,
  contractive decay; the paper's `"linear"` map is unconstrained (it may leave [-1, 1] during
  training), this one cannot.
- `n_layers > 1`: layers are composed, the states of one being the inputs of the next.

`forward` computes all states at once with the associative (Hillis-Steele) scan
`models.scan.linear_scan` over the pairs (Ā_t, B̄_t ⊙ x_t), valid for decays of any sign;
`forward_sequential` (`models.scan.sequential_scan`) is its step-by-step twin and the test
oracle, and returns the final states, which is what `state_size` counts.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.backbone import Core, IOSpec, mark_recurrent
from models.scan import linear_scan, sequential_scan

TRANSITIONS = ("linear", "exp")
SCANS = ("parallel", "sequential")


@dataclass
class SelectiveSSMConfig:
    d_model: int = 16  # n: the state size of a layer (paper 004 App. B.1: n = 16)
    n_layers: int = 1
    selective: bool = True  # False: fixed Ā, B̄ (the non-selective ablation of App. B.2)
    transition: str = "linear"  # "linear": Ā_t = W_A s_t + b_A (App. B.1); "exp": exp(-softplus(.))
    scan: str = "parallel"  # "parallel" (associative scan) | "sequential" (step-by-step twin)

    def __post_init__(self):
        if self.d_model < 1 or self.n_layers < 1:
            raise ValueError(f"selective_ssm: d_model and n_layers must be positive, got "
                             f"{self.d_model}, {self.n_layers}")
        if self.transition not in TRANSITIONS:
            raise ValueError(f"selective_ssm: transition={self.transition!r} is not one of "
                             f"{', '.join(TRANSITIONS)}")
        if self.scan not in SCANS:
            raise ValueError(f"selective_ssm: scan={self.scan!r} is not one of {', '.join(SCANS)}")


def initial_decays(n: int, max_len: int) -> Tensor:
    """Decays 1 - 1/τ with memory time-scales τ log-uniform on [2, max(2, max_len)] steps: from
    the shortest non-trivial memory to the whole sequence."""
    longest = max(2.0, float(max_len))
    tau = torch.exp(torch.rand(n) * (math.log(longest) - math.log(2.0)) + math.log(2.0))
    return 1.0 - 1.0 / tau


class SelectiveSSMLayer(nn.Module):
    """One diagonal (selective) recurrence of width d_model."""

    def __init__(self, config: SelectiveSSMConfig, max_len: int):
        super().__init__()
        n = config.d_model
        self.selective = config.selective
        self.transition = config.transition
        if config.selective:
            self.in_proj = nn.Linear(n, n)  # U, b
            self.a_proj = nn.Linear(n, n)  # W_A, b_A
            self.b_proj = nn.Linear(n, n)  # W_B, b_B
        else:
            self.a_bar = nn.Parameter(torch.empty(n))
            mark_recurrent(self.a_bar)
            self.b_bar = nn.Parameter(torch.empty(n))
        self.reset_parameters(max_len)

    @torch.no_grad()
    def reset_parameters(self, max_len: int) -> None:
        """Ā starts at decays spread over all memory time-scales (`initial_decays`) and B̄ at
        1 - Ā, so each state entry starts as an exponential moving average of its input (unit
        gain at frequency 0) and no entry grows. The selective weights W_A, W_B start small
        (std 0.1/sqrt(n)) so the input moves Ā_t, B̄_t by a few percent at first; U, b keep
        PyTorch's default initialisation."""
        n = self.a_proj.in_features if self.selective else self.a_bar.numel()
        decay = initial_decays(n, max_len)
        # The parameter that gives this decay: itself (linear) or softplus⁻¹(-log decay) (exp).
        a_raw = decay if self.transition == "linear" else torch.log(torch.expm1(-torch.log(decay)))
        if self.selective:
            nn.init.normal_(self.a_proj.weight, 0.0, 0.1 / math.sqrt(n))
            nn.init.normal_(self.b_proj.weight, 0.0, 0.1 / math.sqrt(n))
            self.a_proj.bias.copy_(a_raw)
            self.b_proj.bias.copy_(1.0 - decay)
        else:
            self.a_bar.copy_(a_raw)
            self.b_bar.copy_(1.0 - decay)

    def coefficients(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Ā_t and B̄_t ⊙ x_t for x of shape (B, T, n) (or (B, n) for one step), in at least
        float32 with autocast off: Ā_t are decays near 1 (1 - 1/τ up to τ = max_len), which
        bfloat16 cannot hold (0.998 rounds to 0.996, 0.999 to 1.0: a different memory or none
        lost at all), and the scan multiplies them over the whole sequence."""
        dtype = torch.promote_types(x.dtype, torch.float32)
        with torch.autocast(device_type=x.device.type, enabled=False):
            x = x.to(dtype)
            if self.selective:
                s = F.silu(F.linear(x, self.in_proj.weight.to(dtype), self.in_proj.bias.to(dtype)))
                a_raw = F.linear(s, self.a_proj.weight.to(dtype), self.a_proj.bias.to(dtype))
                b_bar = F.linear(s, self.b_proj.weight.to(dtype), self.b_proj.bias.to(dtype))
            else:
                a_raw, b_bar = self.a_bar.to(dtype).expand_as(x), self.b_bar.to(dtype)
            a_bar = a_raw if self.transition == "linear" else torch.exp(-F.softplus(a_raw))
            return a_bar, b_bar * x

    def forward(self, x: Tensor) -> Tensor:
        return linear_scan(*self.coefficients(x))  # float32 (or float64) coefficients

    def forward_sequential(self, x: Tensor, state: Tensor | None = None) -> tuple[Tensor, Tensor]:
        decay, drive = self.coefficients(x)
        return sequential_scan(decay, drive, None if state is None else state.to(drive.dtype))


class SelectiveSSM(Core):
    family = "selective_ssm"
    Config = SelectiveSSMConfig
    description = ("simplified selective SSM of paper 004 (§3.1, App. B.1): diagonal state "
                   "h_t = Ā_t ⊙ h_{t-1} + B̄_t ⊙ x_t with Ā_t, B̄_t selective linear maps of "
                   "s_t = SiLU(U x_t + b), linear read-out; selective=false is the fixed-Ā, B̄ "
                   "ablation (App. B.2)")

    def __init__(self, config: SelectiveSSMConfig, io: IOSpec):
        super().__init__(config, io)
        self.layers = nn.ModuleList(SelectiveSSMLayer(config, io.max_len)
                                    for _ in range(config.n_layers))

    def forward(self, x: Tensor) -> Tensor:
        if self.config.scan == "sequential":
            return self.forward_sequential(x)[0]
        for layer in self.layers:
            x = layer(x)
        return x

    def forward_sequential(self, x: Tensor, states: list[Tensor] | None = None
                           ) -> tuple[Tensor, list[Tensor]]:
        """Step-by-step twin of `forward`, continuing from `states` (one (B, d_model) tensor per
        layer; zeros if None). Returns the outputs and the final state of every layer: all that
        must be carried to continue the sequence."""
        finals = []
        for i, layer in enumerate(self.layers):
            x, last = layer.forward_sequential(x, None if states is None else states[i])
            finals.append(last)
        return x, finals

    def state_size(self, seq_len: int) -> int:
        """d_model floats per layer, whatever the sequence length."""
        return self.config.n_layers * self.config.d_model
