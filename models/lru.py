"""LRU: the Linear Recurrent Unit of Orvieto et al. (2023), "Resurrecting Recurrent Neural
Networks for Long Sequences" — a stack of complex diagonal linear time-invariant recurrences.

Each layer is a pre-norm residual block:

    u_t = LayerNorm(x_t)
    h_t = λ ⊙ h_{t-1} + γ ⊙ (B u_t)          h_t ∈ C^N, h_{-1} = 0
    y_t = Re(C h_t) + D ⊙ u_t
    x_t ← x_t + GLU(GELU(y_t))               GLU(z) = W₁z ⊙ σ(W₂z)

with the paper's exponential parametrisation of the eigenvalues,
λ = exp(-exp(ν_log) + i·exp(θ_log)), so |λ| = exp(-exp(ν_log)) < 1 for any parameter value,
and the normalisation γ = exp(γ_log), initialised to sqrt(1 - |λ|²) so that a white-noise input
keeps the state's variance at the input's whatever the eigenvalue's radius. At initialisation λ
is uniform (in area) on the ring r_min ≤ |λ| ≤ r_max with phase uniform on [0, max_phase].

This is the diagonal LTI model that stands in for the S5 baseline of paper 002 (GD-SSM,
App. A.7: "model size and state size of 32"), which reports that S5 gains nothing from
more layers (Table 1: the same loss with 1 to 6 layers).

`forward` runs the recurrence in parallel over time (`models.scan.lti_scan`, a doubling scan);
`forward_sequential` is its step-by-step twin and the test oracle, and returns the final state.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.backbone import Core, IOSpec, mark_recurrent
from models.configs import LRUConfig
from models.scan import lti_scan


class LRULayer(nn.Module):
    """The recurrence h_t = λ ⊙ h_{t-1} + γ ⊙ (B u_t), y_t = Re(C h_t) + D ⊙ u_t.

    B and C are kept as real and imaginary parts and applied with real matrix products, so
    complex arithmetic appears only in the element-wise recurrence (mixed precision on a GPU
    autocasts the products; the recurrence itself runs in at least float32)."""

    def __init__(self, d_model: int, d_state: int, r_min: float, r_max: float, max_phase: float):
        super().__init__()
        self.nu_log = nn.Parameter(torch.empty(d_state))
        self.theta_log = nn.Parameter(torch.empty(d_state))
        mark_recurrent(self.nu_log, self.theta_log)  # λ = exp(-exp(ν) + i exp(θ))
        self.gamma_log = nn.Parameter(torch.empty(d_state))
        self.B_re = nn.Parameter(torch.empty(d_state, d_model))
        self.B_im = nn.Parameter(torch.empty(d_state, d_model))
        self.C_re = nn.Parameter(torch.empty(d_model, d_state))
        self.C_im = nn.Parameter(torch.empty(d_model, d_state))
        self.D = nn.Parameter(torch.empty(d_model))
        self.reset_parameters(r_min, r_max, max_phase)

    @torch.no_grad()
    def reset_parameters(self, r_min: float, r_max: float, max_phase: float) -> None:
        d_state, d_model = self.B_re.shape
        # |λ|² uniform on [r_min², r_max²] is λ uniform in area on the ring; ν = -log|λ|.
        radius_sq = torch.rand(d_state) * (r_max ** 2 - r_min ** 2) + r_min ** 2
        nu = -0.5 * torch.log(radius_sq)
        self.nu_log.copy_(torch.log(nu))
        self.theta_log.copy_(torch.log(max_phase * torch.rand(d_state)))
        self.gamma_log.copy_(0.5 * torch.log1p(-radius_sq))
        # Glorot-style: B's complex entries have variance 1/d_model (half per part), C's 1/d_state.
        self.B_re.normal_(0.0, 1.0 / math.sqrt(2 * d_model))
        self.B_im.normal_(0.0, 1.0 / math.sqrt(2 * d_model))
        self.C_re.normal_(0.0, 1.0 / math.sqrt(d_state))
        self.C_im.normal_(0.0, 1.0 / math.sqrt(d_state))
        self.D.normal_(0.0, 1.0)

    def eigenvalues(self, real_dtype: torch.dtype) -> Tensor:
        modulus = torch.exp(-torch.exp(self.nu_log.to(real_dtype)))
        phase = torch.exp(self.theta_log.to(real_dtype))
        return torch.complex(modulus * torch.cos(phase), modulus * torch.sin(phase))

    def _drive(self, u: Tensor, real_dtype: torch.dtype) -> Tensor:
        """γ ⊙ (B u), complex, for u of shape (..., d_model)."""
        gamma = torch.exp(self.gamma_log.to(real_dtype))
        return torch.complex((u @ self.B_re.T).to(real_dtype) * gamma,
                             (u @ self.B_im.T).to(real_dtype) * gamma)

    def _readout(self, h: Tensor, u: Tensor) -> Tensor:
        """Re(C h) + D ⊙ u."""
        real_dtype = h.real.dtype
        return (h.real @ self.C_re.T.to(real_dtype) - h.imag @ self.C_im.T.to(real_dtype)
                + self.D.to(real_dtype) * u.to(real_dtype)).to(u.dtype)

    def forward(self, u: Tensor) -> Tensor:
        real_dtype = torch.promote_types(u.dtype, torch.float32)
        states = lti_scan(self.eigenvalues(real_dtype), self._drive(u, real_dtype))
        return self._readout(states, u)

    def step(self, u_t: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        """One time step: u_t (B, d_model), h (B, d_state) complex -> (y_t, new h)."""
        real_dtype = h.real.dtype
        h = self.eigenvalues(real_dtype) * h + self._drive(u_t, real_dtype)
        return self._readout(h, u_t), h


class LRUBlock(nn.Module):
    """Pre-norm residual block: x + GLU(GELU(LRU(LayerNorm(x))))."""

    def __init__(self, config: LRUConfig):
        super().__init__()
        self.norm = nn.LayerNorm(config.d_model)
        self.lru = LRULayer(config.d_model, config.d_state, config.r_min, config.r_max,
                            config.max_phase)
        self.glu = nn.Linear(config.d_model, 2 * config.d_model)

    def mix(self, y: Tensor) -> Tensor:
        value, gate = self.glu(F.gelu(y)).chunk(2, dim=-1)
        return value * torch.sigmoid(gate)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.mix(self.lru(self.norm(x)))

    def step(self, x_t: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        y_t, h = self.lru.step(self.norm(x_t), h)
        return x_t + self.mix(y_t), h


class LRU(Core):
    family = "lru"
    Config = LRUConfig
    description = ("LRU (Orvieto et al. 2023): complex diagonal linear time-invariant recurrence "
                   "with exponential eigenvalue parametrisation and γ normalisation, in pre-norm "
                   "residual blocks with a GELU + GLU output; the diagonal-LTI (S5-like) "
                   "baseline of paper 002")

    def __init__(self, config: LRUConfig, io: IOSpec):
        super().__init__(config, io)
        self.blocks = nn.ModuleList(LRUBlock(config) for _ in range(config.n_layers))
        self.norm_f = nn.LayerNorm(config.d_model)  # the residual stream's scale grows with depth

    def forward(self, x: Tensor) -> Tensor:
        for block in self.blocks:
            x = block(x)
        return self.norm_f(x)

    def forward_sequential(self, x: Tensor) -> tuple[Tensor, list[Tensor]]:
        """Step-by-step twin of `forward`. Returns the outputs and the final complex state of
        every layer, (B, d_state) each: what must be carried to continue the sequence."""
        batch, length, _ = x.shape
        complex_dtype = (torch.complex128 if x.dtype == torch.float64 else torch.complex64)
        states = [x.new_zeros(batch, self.config.d_state, dtype=complex_dtype)
                  for _ in self.blocks]
        outputs = []
        for t in range(length):
            x_t = x[:, t]
            for i, block in enumerate(self.blocks):
                x_t, states[i] = block.step(x_t, states[i])
            outputs.append(self.norm_f(x_t))
        return torch.stack(outputs, dim=1), states

    def state_size(self, seq_len: int) -> int:
        """d_state complex numbers per layer, two floats each; independent of seq_len."""
        return 2 * self.config.d_state * self.config.n_layers
