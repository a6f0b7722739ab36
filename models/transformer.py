"""GPT-2 style transformer core (nanoGPT layout), with the variants the source papers use.

    x + wpe ─► [ln_1 ─► attn ─► + ─► ln_2 ─► mlp ─► +] × n_layers ─► ln_f

Parameter names follow GPT-2 / paper 000 App. F Table 8 (`wpe`, `h.<i>.ln_1`, `h.<i>.attn.c_attn`,
`h.<i>.attn.c_proj`, `h.<i>.ln_2`, `h.<i>.mlp.c_fc`, `h.<i>.mlp.c_proj`, `ln_f`); the token
embedding and the head are the Backbone's adapters. Variants, all off by default:

- `attention="linear"`: the linear transformer of paper 004 App. B.1,
  Attn(Q, K, V) = (Q Kᵀ / d) V under a causal mask: no feature map, no softmax, no normaliser
  (d is the head dimension). Run here in its parallel (masked quadratic) form;
  `causal_linear_attention_recurrent` is its step-by-step twin, S_t = S_{t-1} + k_t v_tᵀ,
  y_t = q_tᵀ S_t / d, and the test oracle.
- `qkv_conv=w`: a depthwise causal convolution of width w over time applied to Q, K and V right
  after `c_attn` (paper 000 App. E.6, "convolution on the K, Q, V matrices"), named `conv1d` and
  without bias like the authors' code.
- `window=w`: sliding-window attention; each position attends to the last w positions
  including itself (paper 002's local attention).
- `d_ff=n`: MLP hidden width n instead of GPT-2's 4·d_model (paper 004 App. B.3: the small
  transformer of the HMM character-text experiment has width 64 and "a feed-forward layer
  [of] dimension 128").
- `positions=False`: no learned positions, as in paper 004's linear transformer ("no positional
  encoding is used ... we rely solely on causal masking").
- `norm=False`: no LayerNorms (ln_1, ln_2, ln_f are identities): with `attention="linear"`,
  `mlp=False` and `positions=False` the bare linear self-attention LSA(S) = Q Kᵀ V of paper 002's
  Eq. 2 and von Oswald et al. (2023), whose output is bilinear in the tokens (a LayerNorm divides
  each token by its norm, which a GD step on constructed tokens does not).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.backbone import Core, IOSpec
from models.causal_conv import causal_conv1d
from models.configs import TransformerConfig


def sliding_window_mask(seq_len: int, window: int, device=None) -> Tensor:
    """(T, T) boolean mask, True where query i may attend to key j: i - window < j <= i."""
    i = torch.arange(seq_len, device=device)[:, None]
    j = torch.arange(seq_len, device=device)[None, :]
    return (j <= i) & (j > i - window)


def causal_softmax_attention(q: Tensor, k: Tensor, v: Tensor, window: int = 0) -> Tensor:
    """Scaled dot-product attention over (B, H, T, hd); `window` > 0 limits each query to the
    last `window` keys including its own."""
    if window <= 0 or window >= q.shape[-2]:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    mask = sliding_window_mask(q.shape[-2], window, q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def causal_linear_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Paper 004's linear attention, parallel form: y = tril(Q Kᵀ / d) V over (B, H, T, d)."""
    seq_len, head_dim = q.shape[-2], q.shape[-1]
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=q.device).tril()
    scores = (q @ k.transpose(-2, -1)) / head_dim
    return scores.masked_fill(~causal, 0.0) @ v


def causal_linear_attention_recurrent(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """The same map as a recurrence over time, the form used to continue a sequence:
    S_t = S_{t-1} + k_t v_tᵀ, y_t = q_tᵀ S_t / d. Returns (y, final state S of shape
    (B, H, d, d)). The running sum S is kept in at least float32 (autocast off): in bfloat16
    every step would round it, and the error would grow with the sequence."""
    batch, heads, seq_len, head_dim = q.shape
    out_dtype = q.dtype
    dtype = torch.promote_types(q.dtype, torch.float32)
    with torch.autocast(device_type=q.device.type, enabled=False):
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
        state = q.new_zeros(batch, heads, head_dim, head_dim)
        outputs = []
        for t in range(seq_len):
            state = state + k[:, :, t, :, None] * v[:, :, t, None, :]
            outputs.append((q[:, :, t, None, :] @ state).squeeze(-2) / head_dim)
    return torch.stack(outputs, dim=2).to(out_dtype), state


class CausalSelfAttention(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        d = config.d_model
        self.n_heads = config.n_heads
        self.attention = config.attention
        self.window = config.window
        self.c_attn = nn.Linear(d, 3 * d)
        self.conv1d = None
        if config.qkv_conv > 0:
            # One filter per channel of [q, k, v]; left padding w-1 plus cropping to T keeps
            # it causal.
            self.conv1d = nn.Conv1d(3 * d, 3 * d, kernel_size=config.qkv_conv, groups=3 * d,
                                    padding=config.qkv_conv - 1, bias=False)
        self.c_proj = nn.Linear(d, d)

    def qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v of shape (B, H, T, hd), after the optional convolution."""
        batch, seq_len, d = x.shape
        qkv = self.c_attn(x)
        if self.conv1d is not None:
            qkv = causal_conv1d(qkv, self.conv1d)
        split = qkv.view(batch, seq_len, 3, self.n_heads, d // self.n_heads)
        q, k, v = split.permute(2, 0, 3, 1, 4).unbind(0)
        return q, k, v

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self.qkv(x)
        if self.attention == "linear":
            y = causal_linear_attention(q, k, v)
        else:
            y = causal_softmax_attention(q, k, v, self.window)
        return self.c_proj(y.transpose(1, 2).flatten(2))


class MLP(nn.Module):
    def __init__(self, d_model: int, d_ff: int = 0):
        super().__init__()
        hidden = d_ff or 4 * d_model
        self.c_fc = nn.Linear(d_model, hidden)
        self.c_proj = nn.Linear(hidden, d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.c_proj(F.gelu(self.c_fc(x)))


def layer_norm(config: TransformerConfig) -> nn.Module:
    return nn.LayerNorm(config.d_model) if config.norm else nn.Identity()


class Block(nn.Module):
    """Pre-LayerNorm residual block."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.ln_1 = layer_norm(config)
        self.attn = CausalSelfAttention(config)
        if config.mlp:
            self.ln_2 = layer_norm(config)
            self.mlp = MLP(config.d_model, config.d_ff)
        else:
            self.ln_2 = self.mlp = None

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        if self.mlp is not None:
            x = x + self.mlp(self.ln_2(x))
        return x


class Transformer(Core):
    family = "transformer"
    Config = TransformerConfig
    description = ("GPT-2 style transformer: learned positions, pre-LN blocks of causal "
                   "self-attention (softmax or paper 004's linear attention, optional sliding "
                   "window and Q/K/V convolution) and a GELU MLP (paper 000 App. F, Tables 8-9)")

    def __init__(self, config: TransformerConfig, io: IOSpec):
        super().__init__(config, io)
        d = config.d_model
        self.wpe = nn.Embedding(io.max_len, d) if config.positions else None
        self.h = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.ln_f = layer_norm(config)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2 initialisation: N(0, 0.02) for linear maps and positions, zero biases, and the
        residual-stream projections scaled by 1/sqrt(2 n_layers) so the residual variance does
        not grow with depth. LayerNorms start at identity; `conv1d` keeps PyTorch's default
        (uniform, bound 1/sqrt(width)), as in the authors' code."""
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layers)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        for block in self.h:
            nn.init.normal_(block.attn.c_proj.weight, mean=0.0, std=residual_std)
            if block.mlp is not None:
                nn.init.normal_(block.mlp.c_proj.weight, mean=0.0, std=residual_std)

    def forward(self, x: Tensor) -> Tensor:
        seq_len = x.shape[1]
        if self.wpe is not None:
            if seq_len > self.io.max_len:
                raise ValueError(
                    f"sequence length {seq_len} exceeds io.max_len={self.io.max_len}: the "
                    f"learned positions `wpe` only cover positions 0..{self.io.max_len - 1}")
            x = x + self.wpe(torch.arange(seq_len, device=x.device))
        for block in self.h:
            x = block(x)
        return self.ln_f(x)

    def state_size(self, seq_len: int) -> int:
        """Floats carried to continue a sequence of length `seq_len`, summed over layers:
        softmax: the K and V cache of the visible keys (the last `window` of them);
        linear: the d×d matrix S per head (paper 004's attention has no normaliser);
        plus, with `qkv_conv`, the last width-1 pre-convolution rows of [q, k, v]."""
        cfg = self.config
        if cfg.attention == "linear":
            head_dim = cfg.d_model // cfg.n_heads
            per_layer = cfg.n_heads * head_dim * head_dim
        else:
            visible = min(seq_len, cfg.window) if cfg.window > 0 else seq_len
            per_layer = 2 * visible * cfg.d_model
        if cfg.qkv_conv > 0:
            per_layer += (cfg.qkv_conv - 1) * 3 * cfg.d_model
        return cfg.n_layers * per_layer
