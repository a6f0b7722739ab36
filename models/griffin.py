"""Griffin (De et al. 2024, "Griffin: Mixing Gated Linear Recurrences with Local Attention for
Efficient Language Models"): residual blocks whose temporal mixing alternates between a gated
linear recurrence (the RG-LRU) and local sliding-window multi-query attention.

    x ─► [x + Mix(RMSNorm(x)) ─► x + GatedMLP(RMSNorm(x))] × blocks ─► RMSNorm

- Mix is a recurrent block ("R") or a local MQA block ("A"); `block_pattern` (default "RRA", the
  paper's two recurrent blocks per attention block) is repeated `n_layers` times.
- Recurrent block: two linear branches of width D_RNN ≈ 4/3·D; one goes through a causal
  depthwise Conv1D of width 4 and the RG-LRU, the other through GeLU; their product is
  projected back to D.
- RG-LRU, element-wise over channels, with σ the sigmoid and c = 8:

      r_t = σ(W_a x_t + b_a)                recurrence gate
      i_t = σ(W_x x_t + b_x)                input gate
      a_t = a^{c r_t},  a = σ(Λ)            computed in log space: log a_t = -c r_t softplus(-Λ)
      h_t = a_t ⊙ h_{t-1} + sqrt(1 - a_t²) ⊙ (i_t ⊙ x_t)

  Λ is initialised so that a^c is uniform on [0.9, 0.999]; W_a, W_x with LeCun init.
- Local MQA: H query heads share one key/value head; rotary position embeddings on q and k;
  each query sees itself and the `window` previous positions, so the KV cache that continues a
  sequence holds min(T, window) positions. (transformer.py's `window` counts the query too:
  Griffin window w sees what transformer window w + 1 sees.)
- Gated MLP: GeLU(W₁x) ⊙ (W₂x) projected back to D, expansion factor 3.

Paper 002 (GD-SSM, App. A.7, Table 1) compares against Griffin with 1-5 heads and 1-2 layers;
its best Griffin (loss 0.4114) has 2 heads and 2 layers. `forward` runs the RG-LRU with a
parallel doubling scan (`models.scan.linear_scan`) and the attention with a banded mask;
`forward_sequential` is the step-by-step twin (conv buffer, recurrent state, KV cache) used as
test oracle, and returns the final caches.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.backbone import Core, IOSpec, mark_recurrent
from models.configs import GriffinConfig
from models.causal_conv import causal_conv1d
from models.scan import linear_scan

GATE_EXPONENT = 8.0  # the paper's constant c in a_t = a^{c r_t}
DECAY_INIT = (0.9, 0.999)  # a^c uniform on this interval at initialisation (paper Sec. 2.4)
# sqrt(1 - a_t²) has an unbounded derivative as a_t → 1 (r_t → 0); flooring its argument at
# 1/(4·1000²) caps that derivative at 1000 while changing the value by at most 5e-4.
SQRT_FLOOR = 1.0 / (4 * 1000.0 ** 2)
ROPE_BASE = 10000.0


def lecun_init(linear: nn.Linear) -> None:
    nn.init.normal_(linear.weight, 0.0, 1.0 / math.sqrt(linear.in_features))
    if linear.bias is not None:
        nn.init.zeros_(linear.bias)


class RMSNorm(nn.Module):
    def __init__(self, d_model: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: Tensor) -> Tensor:
        # The mean square in at least float32 (a bf16 residual stream under autocast), the
        # result back in x's dtype.
        dtype = torch.promote_types(x.dtype, torch.float32)
        h = x.to(dtype)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.to(dtype)
        return h.to(x.dtype)


class RGLRU(nn.Module):
    """Real-Gated Linear Recurrent Unit over `width` channels."""

    def __init__(self, width: int):
        super().__init__()
        self.gate_a = nn.Linear(width, width)  # W_a, b_a: recurrence gate
        self.gate_x = nn.Linear(width, width)  # W_x, b_x: input gate
        self.a_param = nn.Parameter(torch.empty(width))  # Λ, with a = σ(Λ)
        mark_recurrent(self.a_param)
        lecun_init(self.gate_a)
        lecun_init(self.gate_x)
        with torch.no_grad():
            low, high = DECAY_INIT
            a = (torch.rand(width) * (high - low) + low) ** (1.0 / GATE_EXPONENT)
            self.a_param.copy_(torch.log(a) - torch.log1p(-a))  # logit

    def coefficients(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Decay a_t and the normalised, gated input sqrt(1 - a_t²) ⊙ i_t ⊙ x_t, in at least
        float32 whatever the autocast dtype of the gate products."""
        dtype = torch.promote_types(x.dtype, torch.float32)
        r = torch.sigmoid(self.gate_a(x).to(dtype))
        i = torch.sigmoid(self.gate_x(x).to(dtype))
        log_a = -GATE_EXPONENT * r * F.softplus(-self.a_param.to(dtype))
        scale = torch.sqrt(torch.clamp(-torch.expm1(2 * log_a), min=SQRT_FLOOR))
        return torch.exp(log_a), scale * i * x.to(dtype)

    def forward(self, x: Tensor) -> Tensor:
        decay, drive = self.coefficients(x)
        return linear_scan(decay, drive).to(x.dtype)

    def step(self, x_t: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        decay, drive = self.coefficients(x_t)
        h = decay * h + drive
        return h.to(x_t.dtype), h


class RecurrentBlock(nn.Module):
    """GeLU branch ⊙ (Conv1D ─► RG-LRU branch), projected back to d_model."""

    def __init__(self, config: GriffinConfig):
        super().__init__()
        width = rnn_width(config)
        self.width = width
        self.conv_width = config.conv_width
        self.in_proj_gate = nn.Linear(config.d_model, width)
        self.in_proj_x = nn.Linear(config.d_model, width)
        # One temporal filter per channel; left padding conv_width - 1, cropped to T: causal.
        self.conv1d = nn.Conv1d(width, width, config.conv_width, groups=width,
                                padding=config.conv_width - 1)
        self.rg_lru = RGLRU(width)
        self.out_proj = nn.Linear(width, config.d_model)
        for linear in (self.in_proj_gate, self.in_proj_x, self.out_proj):
            lecun_init(linear)
        nn.init.normal_(self.conv1d.weight, 0.0, 1.0 / math.sqrt(config.conv_width))
        nn.init.zeros_(self.conv1d.bias)

    def forward(self, x: Tensor) -> Tensor:
        gate = F.gelu(self.in_proj_gate(x))
        u = causal_conv1d(self.in_proj_x(x), self.conv1d)
        return self.out_proj(self.rg_lru(u) * gate)

    def initial_cache(self, batch: int, like: Tensor) -> dict[str, Tensor]:
        # The recurrent state is kept in the scan's precision (at least float32).
        dtype = torch.promote_types(like.dtype, torch.float32)
        return {"conv": like.new_zeros(batch, self.conv_width - 1, self.width),
                "h": like.new_zeros(batch, self.width, dtype=dtype)}

    def step(self, x_t: Tensor, cache: dict[str, Tensor], position: int):
        gate = F.gelu(self.in_proj_gate(x_t))
        window = torch.cat([cache["conv"], self.in_proj_x(x_t)[:, None]], dim=1)  # (B, w, width)
        filters = self.conv1d.weight[:, 0, :].T  # (w, width); last row multiplies x_t
        u = (window * filters).sum(dim=1) + self.conv1d.bias
        y, h = self.rg_lru.step(u, cache["h"])
        return self.out_proj(y * gate), {"conv": window[:, 1:], "h": h}


def rotary_angles(positions: Tensor, half: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """Angles position · ROPE_BASE^(-i/half), (T, half), in `dtype` (float32 or float64).

    Never in the autocast dtype of the queries and keys: bfloat16 holds integers exactly only
    up to 256 and rounds an angle near 200 to a multiple of 1, so positions >= 128 would be
    rotated by up to ~0.5 rad (~1 rad from 256 on) too little or too much. The frequencies are
    rounded once from float64, the product once in `dtype`."""
    frequencies = ROPE_BASE ** (-torch.arange(half, device=positions.device,
                                              dtype=torch.float64) / half)
    return positions.to(dtype)[:, None] * frequencies.to(dtype)


def rotary(x: Tensor, positions: Tensor) -> Tensor:
    """Rotary position embedding on the last dimension of x (..., T, hd); positions (T,).
    Angles, cos/sin and the rotation are computed in at least float32 (autocast off), the
    result returned in x's dtype."""
    half = x.shape[-1] // 2
    dtype = torch.promote_types(x.dtype, torch.float32)
    with torch.autocast(device_type=x.device.type, enabled=False):
        angles = rotary_angles(positions, half, dtype)
        cos, sin = torch.cos(angles), torch.sin(angles)
        x1, x2 = x[..., :half].to(dtype), x[..., half:].to(dtype)
        rotated = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return rotated.to(x.dtype)


class LocalMQA(nn.Module):
    """Sliding-window multi-query attention with rotary embeddings."""

    def __init__(self, config: GriffinConfig):
        super().__init__()
        self.n_heads = config.n_heads
        self.head_dim = config.d_model // config.n_heads
        self.window = config.window
        self.q_proj = nn.Linear(config.d_model, config.d_model)
        self.k_proj = nn.Linear(config.d_model, self.head_dim)  # one key head shared by all
        self.v_proj = nn.Linear(config.d_model, self.head_dim)  # one value head shared by all
        self.o_proj = nn.Linear(config.d_model, config.d_model)
        for linear in (self.q_proj, self.k_proj, self.v_proj, self.o_proj):
            lecun_init(linear)

    def forward(self, x: Tensor) -> Tensor:
        batch, length, d_model = x.shape
        positions = torch.arange(length, device=x.device)
        q = rotary(self.q_proj(x).view(batch, length, self.n_heads, self.head_dim)
                   .transpose(1, 2), positions)
        k = rotary(self.k_proj(x), positions)[:, None].expand(-1, self.n_heads, -1, -1)
        v = self.v_proj(x)[:, None].expand(-1, self.n_heads, -1, -1)
        lag = positions[:, None] - positions[None, :]  # query index minus key index
        visible = (lag >= 0) & (lag <= self.window)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=visible)
        return self.o_proj(y.transpose(1, 2).reshape(batch, length, d_model))

    def initial_cache(self, batch: int, like: Tensor) -> dict[str, Tensor]:
        return {"k": like.new_zeros(batch, 0, self.head_dim),
                "v": like.new_zeros(batch, 0, self.head_dim)}

    def step(self, x_t: Tensor, cache: dict[str, Tensor], position: int):
        batch, d_model = x_t.shape
        at = torch.tensor([position], device=x_t.device)
        q = rotary(self.q_proj(x_t).view(batch, self.n_heads, 1, self.head_dim), at)[:, :, 0]
        keys = torch.cat([cache["k"], rotary(self.k_proj(x_t)[:, None], at)], dim=1)
        values = torch.cat([cache["v"], self.v_proj(x_t)[:, None]], dim=1)
        scores = torch.einsum("bhd,bld->bhl", q, keys) / math.sqrt(self.head_dim)
        y = torch.einsum("bhl,bld->bhd", torch.softmax(scores, dim=-1), values)
        # The next query sees itself and the `window` positions before it: keep those.
        keep = max(keys.shape[1] - self.window, 0)
        return self.o_proj(y.reshape(batch, d_model)), {"k": keys[:, keep:], "v": values[:, keep:]}


class GatedMLP(nn.Module):
    def __init__(self, d_model: int, expansion: int):
        super().__init__()
        self.gate = nn.Linear(d_model, expansion * d_model)
        self.up = nn.Linear(d_model, expansion * d_model)
        self.down = nn.Linear(expansion * d_model, d_model)
        for linear in (self.gate, self.up, self.down):
            lecun_init(linear)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(F.gelu(self.gate(x)) * self.up(x))


class ResidualBlock(nn.Module):
    def __init__(self, config: GriffinConfig, kind: str):
        super().__init__()
        self.kind = kind
        self.norm_mix = RMSNorm(config.d_model)
        self.mix = RecurrentBlock(config) if kind == "R" else LocalMQA(config)
        self.norm_mlp = RMSNorm(config.d_model)
        self.mlp = GatedMLP(config.d_model, config.mlp_expansion)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.mix(self.norm_mix(x))
        return x + self.mlp(self.norm_mlp(x))

    def step(self, x_t: Tensor, cache: dict[str, Tensor], position: int):
        y, cache = self.mix.step(self.norm_mix(x_t), cache, position)
        x_t = x_t + y
        return x_t + self.mlp(self.norm_mlp(x_t)), cache


class Griffin(Core):
    family = "griffin"
    Config = GriffinConfig
    description = ("Griffin (De et al. 2024): pre-RMSNorm residual blocks alternating a recurrent "
                   "block (Conv1D width 4 + RG-LRU, GeLU-gated) and local sliding-window "
                   "multi-query attention with RoPE, each followed by a gated MLP; pattern RRA "
                   "(paper 002's Griffin baseline)")

    def __init__(self, config: GriffinConfig, io: IOSpec):
        super().__init__(config, io)
        self.blocks = nn.ModuleList(ResidualBlock(config, kind)
                                    for kind in config.block_pattern * config.n_layers)
        self.norm_f = RMSNorm(config.d_model)

    def forward(self, x: Tensor) -> Tensor:
        for block in self.blocks:
            x = block(x)
        return self.norm_f(x)

    def forward_sequential(self, x: Tensor) -> tuple[Tensor, list[dict[str, Tensor]]]:
        """Step-by-step twin of `forward`. Returns the outputs and every block's final cache
        (recurrent: conv buffer and RG-LRU state; attention: keys and values in the window)."""
        batch, length, _ = x.shape
        caches = [block.mix.initial_cache(batch, x) for block in self.blocks]
        outputs = []
        for t in range(length):
            x_t = x[:, t]
            for i, block in enumerate(self.blocks):
                x_t, caches[i] = block.step(x_t, caches[i], t)
            outputs.append(self.norm_f(x_t))
        return torch.stack(outputs, dim=1), caches

    def state_size(self, seq_len: int) -> int:
        """Per recurrent block: the RG-LRU state (D_RNN) and the conv buffer
        ((conv_width - 1)·D_RNN); per attention block: one key and one value head of the
        min(seq_len, window) positions in the window (2·head_dim each)."""
        cfg = self.config
        width = rnn_width(cfg)
        head_dim = cfg.d_model // cfg.n_heads
        recurrent = width + (cfg.conv_width - 1) * width
        attention = 2 * head_dim * min(seq_len, cfg.window)
        return sum(recurrent if kind == "R" else attention
                   for kind in cfg.block_pattern * cfg.n_layers)


def rnn_width(config: GriffinConfig) -> int:
    return max(1, round(config.rnn_expansion * config.d_model))
