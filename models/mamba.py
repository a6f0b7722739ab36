"""Mamba-2 (Dao & Gu 2024) as a language-model core, and MambaZero, the convolution-only model of
"From Markov to Laplace" (paper 000, §2.2 and §4.1).

One Mamba-2 mixer, per token t (paper 000 §2.2, in mamba_ssm's parametrisation):

    [z, xBC, dt] = in_proj(u_t)
    xBC          = act(conv1d(xBC over the last d_conv steps))      -> x_t, B_t, C_t
    Δ_t          = softplus(dt + dt_bias),   a_t = exp(-exp(A_log) Δ_t)   (one per head)
    H_t          = a_t H_{t-1} + Δ_t x_t B_t^T,   y_t = H_t C_t + D x_t
    out_t        = out_proj(RMSNorm(y_t * act(z_t)))

Parameter names follow mamba_ssm's `Mamba2` (in_proj, conv1d, dt_bias, A_log, D, norm, out_proj)
and its LM blocks (layers.i.norm / mixer / norm2 / mlp.fc1 / mlp.fc2, norm_f), so weights can be
exchanged with the kernel package. The scan itself is `models.ssd.ssd_scan`.

Ablation flags of paper 000 (Fig. 3a, §E.6, §E.8 Table 4):
- conv=False:      no convolution (there is no conv1d module);
- decay=False:     "without gating factor": a_t = 1 (no A_log parameter), Δ_t still scales x_t;
- activation:      the non-linearity after the convolution and on the gate z: "silu"
                   (mamba_ssm), "relu" (the paper's equations) or "identity" (non-linearities off);
- gate=False:      no multiplicative z gate (in_proj does not produce z); the norm is a plain RMSNorm.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.backbone import Core, IOSpec, mark_recurrent
from models.causal_conv import causal_conv1d
from models.configs import L1_FLOOR, MambaConfig, MambaZeroConfig, check_mixer_shape
from models.ssd import resolve_kernel, ssd_scan

ACTIVATIONS = {"silu": F.silu, "relu": F.relu, "identity": lambda t: t}


class GatedRMSNorm(nn.Module):
    """RMSNorm of y * act(z), normalised within each of `groups` equal slices of the features
    (mamba_ssm's RMSNormGated with norm_before_gate=False, group_size = d_inner / ngroups).
    Without z it is a plain (grouped) RMSNorm."""

    def __init__(self, dim: int, groups: int, activation: str, eps: float = 1e-5):
        super().__init__()
        self.groups, self.eps = groups, eps
        self.act = ACTIVATIONS[activation]
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, y: Tensor, z: Tensor | None = None) -> Tensor:
        # Gate and statistics in at least float32 (y and z are bf16 under autocast).
        dtype = torch.promote_types(y.dtype, torch.float32)
        y = y.to(dtype)
        if z is not None:
            y = y * self.act(z.to(dtype))
        grouped = y.unflatten(-1, (self.groups, -1))
        grouped = grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + self.eps)
        return grouped.flatten(-2) * self.weight.to(dtype)


class RMSNorm(nn.RMSNorm):
    """nn.RMSNorm (same parameter `weight`) whose statistics are computed in at least float32
    whatever the input's dtype (a bf16 residual stream under autocast), returned in the input's
    dtype. (torch's own rms_norm on a bf16 input with a float32 weight warns and leaves the
    fused path.)"""

    def forward(self, x: Tensor) -> Tensor:
        dtype = torch.promote_types(x.dtype, torch.float32)
        return F.rms_norm(x.to(dtype), self.normalized_shape, self.weight.to(dtype),
                          self.eps).to(x.dtype)


class Mamba2Mixer(nn.Module):
    """The Mamba-2 sequence mixer (B, T, d_model) -> (B, T, d_model). The switches `skip` (the D
    term) and `out_norm` exist so MambaZero can drop them; the paper's ablations are `conv`,
    `decay`, `activation` and `gate`."""

    def __init__(self, d_model: int, d_state: int, expand: int, headdim: int, ngroups: int,
                 d_conv: int, chunk_size: int, kernel: str, conv: bool = True, decay: bool = True,
                 activation: str = "silu", gate: bool = True, skip: bool = True,
                 out_norm: bool = True, dt_min: float = 1e-3, dt_max: float = 0.1,
                 dt_init_floor: float = 1e-4, A_init_range: tuple[float, float] = (1.0, 16.0)):
        super().__init__()
        check_mixer_shape(d_model, expand, headdim, ngroups, d_state, d_conv, chunk_size, kernel)
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {activation!r}")
        self.d_inner = expand * d_model
        self.headdim, self.ngroups, self.d_state = headdim, ngroups, d_state
        self.nheads = self.d_inner // headdim
        self.conv_dim = self.d_inner + 2 * ngroups * d_state  # x, B and C go through the conv
        self.d_conv, self.chunk_size, self.kernel = d_conv, chunk_size, kernel
        # what `kernel` resolved to per device type (resolve_scan_kernels, when a run builds the
        # model); a device type not in it resolves at the scan (models.ssd.ssd_scan)
        self.resolved_kernels: dict[str, str] = {}
        self.gate, self.decay = gate, decay
        self.activation_name, self.act = activation, ACTIVATIONS[activation]

        # Output order of in_proj: [z, x, B, C, dt] (z only when gated), as in mamba_ssm.
        d_z = self.d_inner if gate else 0
        self.split_sizes = [d_z, self.conv_dim, self.nheads]
        self.in_proj = nn.Linear(d_model, sum(self.split_sizes), bias=False)
        if conv:
            # Depthwise; padded on both sides by d_conv-1 and cut to the first T outputs = causal.
            self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, kernel_size=d_conv,
                                    groups=self.conv_dim, padding=d_conv - 1, bias=True)
        else:
            self.conv1d = None

        # Δ starts log-uniform in [dt_min, dt_max]: dt_bias is its inverse softplus.
        dt = torch.exp(torch.rand(self.nheads) * (math.log(dt_max) - math.log(dt_min))
                       + math.log(dt_min)).clamp(min=dt_init_floor)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        if decay:
            A = torch.empty(self.nheads).uniform_(*A_init_range)
            self.A_log = nn.Parameter(torch.log(A))
        else:
            self.A_log = None  # a_t = 1: nothing to learn
        self.D = nn.Parameter(torch.ones(self.nheads)) if skip else None
        self.norm = GatedRMSNorm(self.d_inner, ngroups, activation) if out_norm else None
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=False)
        # Marked as in mamba_ssm, for optimisers that exempt them from weight decay.
        for p in (self.dt_bias, self.A_log, self.D):
            if p is not None:
                p._no_weight_decay = True
        mark_recurrent(self.A_log, self.dt_bias)  # a_t = exp(-exp(A_log) softplus(dt + dt_bias))

    def scan_kernel(self, device: torch.device) -> str:
        """The scan implementation this mixer runs on `device`: its resolution there, if made."""
        return self.resolved_kernels.get(torch.device(device).type, self.kernel)

    def state_size(self) -> int:
        """Floats carried between steps: the SSM state and the last d_conv-1 conv inputs."""
        conv_window = (self.d_conv - 1) * self.conv_dim if self.conv1d is not None else 0
        return self.nheads * self.headdim * self.d_state + conv_window

    def decay_rate(self) -> Tensor:
        """A in a_t = exp(Δ_t A): negative per head, or zero without the decay."""
        if self.A_log is None:
            return self.dt_bias.new_zeros(self.nheads)
        # At least float32: exp() of a half-precision A_log overflows.
        return -torch.exp(self.A_log.to(torch.promote_types(self.A_log.dtype, torch.float32)))

    def step_sizes(self, dt: Tensor) -> Tensor:
        """Δ_t = softplus(dt + dt_bias) from in_proj's dt outputs (..., H), in at least float32:
        it sets the decays exp(Δ A)."""
        dtype = torch.promote_types(self.dt_bias.dtype, torch.float32)
        return F.softplus(dt.to(dtype) + self.dt_bias.to(dtype))

    def decays(self, u: Tensor) -> Tensor:
        """a_t = exp(Δ_t A) per head, (B, T, H): the factor by which the state H_{t-1} is
        multiplied at step t (paper 000 Fig. 13 plots it on switching Markov data), computed by
        the same path as `forward`; 1 everywhere without the decay."""
        dt = self.in_proj(u)[..., -self.nheads:]  # in_proj's outputs are [z, xBC, dt]
        return torch.exp(self.step_sizes(dt) * self.decay_rate())

    def selective_inputs(self, u: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """(z, x, B, C, dt) per token: x, B, C after the convolution and activation (B and C
        (B, T, ngroups * d_state)), z and in_proj's raw dt; the one path of `forward` and of the
        mechanism probes (MambaZero.probe's b_t and c_t)."""
        z, xBC, dt = torch.split(self.in_proj(u), self.split_sizes, dim=-1)
        if self.conv1d is not None:
            xBC = causal_conv1d(xBC, self.conv1d)
        xBC = self.act(xBC)
        x, B, C = torch.split(xBC, [self.d_inner, self.ngroups * self.d_state,
                                    self.ngroups * self.d_state], dim=-1)
        return z, x, B, C, dt

    def forward(self, u: Tensor) -> Tensor:
        z, x, B, C, dt = self.selective_inputs(u)
        dt = self.step_sizes(dt)
        y, _ = ssd_scan(x.unflatten(-1, (self.nheads, self.headdim)), dt, self.decay_rate(),
                        B.unflatten(-1, (self.ngroups, self.d_state)),
                        C.unflatten(-1, (self.ngroups, self.d_state)),
                        D=self.D, chunk_size=self.chunk_size, kernel=self.scan_kernel(u.device))
        y = y.flatten(-2)
        gate = z if self.gate else None
        if self.norm is not None:
            y = self.norm(y, gate)
        elif gate is not None:
            y = y * self.act(gate)
        return self.out_proj(y)


def resolve_scan_kernels(model: nn.Module, device: torch.device | str, batch: int, length: int,
                         dtype: torch.dtype = torch.float32) -> dict[str, str]:
    """Each Mamba-2 mixer's scan kernel made concrete for `device` before the model runs there
    (a run does this when it builds its model): "auto" becomes the mamba_ssm kernel on CUDA when
    it imports and a forward and backward call at the mixer's own scan shape, (batch, length)
    sequences, runs (that call is also the Triton autotuning the first training step would do),
    else torch. Done here rather than inside the first forward, where torch.compile would be
    tracing and the smoke test's backward and synchronisation would land in the trace. Returns
    {mixer name: kernel}; other device types keep resolving at the scan."""
    device = torch.device(device)
    chosen = {}
    for name, module in model.named_modules():
        if isinstance(module, Mamba2Mixer):
            shape = (batch, length, module.nheads, module.headdim, module.ngroups, module.d_state,
                     module.chunk_size)
            module.resolved_kernels[device.type] = resolve_kernel(module.kernel, device, dtype,
                                                                  shape=shape)
            chosen[name] = module.resolved_kernels[device.type]
    return chosen


# ---------------------------------------------------------------------------------------------
# Mamba-2 language-model core.

class MLP(nn.Module):
    def __init__(self, d_model: int):
        super().__init__()
        self.fc1 = nn.Linear(d_model, 4 * d_model)
        self.fc2 = nn.Linear(4 * d_model, d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class MambaBlock(nn.Module):
    """x + mixer(norm(x)), then x + mlp(norm2(x)) when the block has an MLP."""

    def __init__(self, config: MambaConfig):
        super().__init__()
        c = config
        self.norm = RMSNorm(c.d_model, eps=1e-5)
        self.mixer = Mamba2Mixer(c.d_model, c.d_state, c.expand, c.headdim, c.ngroups, c.d_conv,
                                 c.chunk_size, c.kernel, conv=c.conv, decay=c.decay,
                                 activation=c.activation, gate=c.gate)
        if c.mlp:
            self.norm2 = RMSNorm(c.d_model, eps=1e-5)
            self.mlp = MLP(c.d_model)
        else:
            self.norm2 = self.mlp = None

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.mixer(self.norm(x))
        if self.mlp is not None:
            x = x + self.mlp(self.norm2(x))
        return x


class Mamba(Core):
    family = "mamba"
    Config = MambaConfig
    description = ("Mamba-2 (SSD scan, scalar decay per head) with pre-norm residual blocks and "
                   "optional MLP; ablation flags conv/decay/activation/gate (paper 000 §2.2, "
                   "Fig. 3a, Table 4)")

    def __init__(self, config: MambaConfig, io: IOSpec):
        super().__init__(config, io)
        self.layers = nn.ModuleList(MambaBlock(config) for _ in range(config.n_layers))
        self.norm_f = RMSNorm(config.d_model, eps=1e-5)
        self._init_residual_outputs()

    def _init_residual_outputs(self) -> None:
        """As mamba_ssm: the projections that write into the residual stream are scaled by
        1/sqrt(number of residual writes), so the stream's variance does not grow with depth."""
        writes = self.config.n_layers * (2 if self.config.mlp else 1)
        with torch.no_grad():
            for block in self.layers:
                block.mixer.out_proj.weight.div_(math.sqrt(writes))
                if block.mlp is not None:
                    block.mlp.fc2.weight.div_(math.sqrt(writes))
                    nn.init.zeros_(block.mlp.fc1.bias)
                    nn.init.zeros_(block.mlp.fc2.bias)

    def forward(self, x: Tensor) -> Tensor:
        for block in self.layers:
            x = block(x)
        return self.norm_f(x)

    def probe(self, x: Tensor) -> dict[str, Tensor]:
        """Per-position internals for mechanism probes (Backbone.probe): "decay", the a_t of every
        mixer, (B, T, n_layers, n_heads), on the embedded inputs x."""
        decays = []
        for block in self.layers:
            decays.append(block.mixer.decays(block.norm(x)))
            x = block(x)
        return {"decay": torch.stack(decays, 2)}

    def state_size(self, seq_len: int) -> int:
        return sum(block.mixer.state_size() for block in self.layers)


# ---------------------------------------------------------------------------------------------
# MambaZero (paper 000 §4.1): embedding, one mixer with only the convolutional selectivity, a
# linear head; no gate, no non-linearity, no D skip, no norms, no MLP.
#
#     x_t = e_{x_t},   u_t = x_t + W_o y_t,   logit_t = W_l u_t
#     H_t = a_t H_{t-1} + x~_t b_t^T,   y_t = H_t c_t,   x~_t = conv_X(W_X x)_t Δ_t,
#     b_t = conv_B(W_B x)_t,   c_t = conv_C(W_C x)_t
#
# a_t and Δ_t are learned as in the full model (the paper reports a_t -> 1 at convergence, Fig. 4;
# its constructions set a = 0 and Δ = 1); `decay=False` fixes a_t = 1. The canonical model of
# Theorem 1 has N = S, d = 2S, e = 1, w = 2: for binary chains d_model = 4, d_state = 2,
# d_conv = 2, one head.
#
# `constructed=True` loads the paper's analytical parameters for first-order add-β (App. C.2-C.3),
# chosen by the size: d_model = 2S, d_state = S is Theorem 1 (exact for any S); d_model =
# d_state = 2 on binary chains is Theorem 4 (KL(add-β ‖ model) <= log(1 + ε)). Both are
# first-order only: the paper proves nothing for k > 1 (arXiv version, Conjecture 1).


class MambaZero(Core):
    family = "mambazero"
    Config = MambaZeroConfig
    description = ("MambaZero: embedding + one linear Mamba-2 mixer with convolutional "
                   "selectivity only (no gate, non-linearity, norm or MLP) + linear head; "
                   "optional L1-normalised prediction (paper 000 §4.1)")
    owns_io = True  # its own embedding and bias-free head, as in the paper

    def __init__(self, config: MambaZeroConfig, io: IOSpec):
        super().__init__(config, io)
        if config.l1_prediction and io.kind != "tokens":
            raise ValueError("l1_prediction needs a tokens task (it normalises next-token scores)")
        c = config
        self.embedding = (nn.Embedding(io.input_dim, c.d_model) if io.kind == "tokens"
                          else nn.Linear(io.input_dim, c.d_model))
        self.mixer = Mamba2Mixer(c.d_model, c.d_state, c.expand, c.headdim, c.ngroups, c.d_conv,
                                 c.chunk_size, c.kernel, conv=True, decay=c.decay,
                                 activation="identity", gate=False, skip=False, out_norm=False)
        self.lm_head = nn.Linear(c.d_model, io.output_dim, bias=False)
        self.outputs_log_probs = c.l1_prediction
        if c.constructed:
            symbols = io.input_dim
            if io.output_dim != symbols:
                raise ValueError(f"mambazero: constructed=true predicts the next of {symbols} "
                                 f"input symbols, but the task has {io.output_dim} outputs")
            if (c.d_model, c.d_state) == (2 * symbols, symbols):
                construct_laplace_smoothing(self, c.beta)
            elif (c.d_model, c.d_state, symbols) == (2, 2, 2):
                construct_binary_laplace_smoothing(self, c.beta, c.epsilon)
            else:
                raise ValueError(f"mambazero: constructed=true for {symbols} symbols needs "
                                 f"d_model={2 * symbols}, d_state={symbols} (Thm. 1)"
                                 + (" or d_model = d_state = 2 (Thm. 4)" if symbols == 2 else ""))
        elif c.l1_prediction:
            # L1 normalisation needs positive scores, and a clamped score gets no gradient: with
            # the default signed initialisation ~60% of scores start clamped and training stalls
            # (gap 0.095 at any lr). Positive embeddings and head start every score positive.
            with torch.no_grad():
                self.embedding.weight.uniform_(0.5, 1.5)
                self.lm_head.weight.uniform_(0.5 / c.d_model, 1.5 / c.d_model)

    def forward(self, inputs: Tensor) -> Tensor:
        x = self.embedding(inputs)
        logits = self.lm_head(x + self.mixer(x))
        if not self.config.l1_prediction:
            return logits
        scores = logits.to(torch.promote_types(logits.dtype, torch.float32)).clamp(min=L1_FLOOR)
        return scores.log() - scores.sum(-1, keepdim=True).log()

    def probe(self, inputs: Tensor) -> dict[str, Tensor]:
        """Per-position internals of paper 000's mechanism (§4.2.1, App. C.1, Figs. 4-5):
        "decay", the mixer's a_t, (B, T, 1, n_heads) (see Mamba.probe); "ssm_b" and "ssm_c", b_t
        and c_t after their convolutions, (B, T, ngroups, d_state); and, with the L1 head only
        (where logits are scores proportional to the probabilities, so the paper's reading of
        them as counts + β holds), the two terms of the logit written out by Eq. (4)-(5):
        "logit_direct" = W_ℓ x_t, (B, T, S), and "logit_write" = W_ℓ W_o (Δ_t x~_t restricted to
        each group's heads), (B, T, ngroups, S). With a_t = 1, logit_t = logit_direct_t +
        Σ_{s<=t} Σ_g logit_write_{s,g} (b_{s,g} · c_{t,g}) exactly."""
        mixer, x = self.mixer, self.embedding(inputs)
        _, xs, B, C, dt = mixer.selective_inputs(x)
        groups = mixer.ngroups
        found = {"decay": mixer.decays(x).unsqueeze(2),
                 "ssm_b": B.unflatten(-1, (groups, mixer.d_state)),
                 "ssm_c": C.unflatten(-1, (groups, mixer.d_state))}
        if self.config.l1_prediction:
            step = mixer.step_sizes(dt)  # Δ_t per head, at least float32
            dtype = torch.promote_types(x.dtype, step.dtype)
            written = xs.to(dtype).unflatten(-1, (mixer.nheads, mixer.headdim)) * step[..., None]
            per_group = written.flatten(-2).unflatten(-1, (groups, -1))  # heads are contiguous
            w_o = mixer.out_proj.weight.to(dtype).unflatten(1, (groups, -1))
            head = self.lm_head.weight.to(dtype)
            found["logit_write"] = F.linear(torch.einsum("btgc,dgc->btgd", per_group, w_o), head)
            found["logit_direct"] = F.linear(x.to(dtype), head)
        return found

    def state_size(self, seq_len: int) -> int:
        return self.mixer.state_size()


# --- the paper's constructions (paper 000 App. C.2-C.3) --------------------------------------
# In mamba_ssm's layout in_proj's rows are [x (d_inner), B (N), C (N), dt (heads)] and conv1d's
# channels [x, B, C]; conv1d is causal with taps weight[..., -1] on the current step and
# weight[..., -2] on the previous one. Both constructions fix a = 0 and Δ_t = 1 (dt rows zero,
# softplus(dt_bias) = 1), so a_t = 1 and H_t sums x~_s b_s^T over the whole sequence.
SOFTPLUS_INVERSE_OF_1 = math.log(math.e - 1.0)


def _mixer_rows(core: MambaZero) -> tuple[slice, slice, slice]:
    """in_proj rows and conv1d channels of x, B and C."""
    d_inner, n = core.mixer.d_inner, core.mixer.d_state
    return slice(0, d_inner), slice(d_inner, d_inner + n), slice(d_inner + n, d_inner + 2 * n)


@torch.no_grad()
def construct_laplace_smoothing(core: MambaZero, beta: float) -> None:
    """Theorem 1 (App. C.2): the canonical d = 2S, N = S model whose L1-normalised prediction is
    add-β, (n_ij + β) / (Σ_k n_ik + Sβ) for x_t = i, with n_ij the transitions i → j in x_1^t.

    Symbol i is embedded at coordinate 2i. W_X moves it to coordinate 2i + 1 and conv_X keeps the
    current step, so x~_t = e'_{x_t}; W_B and W_C read it as the one-hot u_i ∈ R^S, conv_B keeps
    the previous step (b_t = u_{x_{t-1}}, zero at t = 1) and conv_C the current one (c_t =
    u_{x_t}). Then b_s^T c_t = [x_{s-1} = x_t] and y_t = H_t c_t = Σ_j n_{x_t j} e'_j: the counts
    out of the current symbol at the odd coordinates. W_o = I, and W_ℓ reads count j into logit
    j and β·1 from the embedding coordinate, so logit_t = β·1 + n_{x_t ·}."""
    symbols = core.io.input_dim
    x_rows, b_rows, c_rows = _mixer_rows(core)
    mixer = core.mixer
    for param in core.parameters():
        param.zero_()
    for i in range(symbols):
        core.embedding.weight[i, 2 * i] = 1.0
        mixer.in_proj.weight[x_rows.start + 2 * i + 1, 2 * i] = 1.0  # W_X: shift by one coordinate
        mixer.in_proj.weight[b_rows.start + i, 2 * i] = 1.0
        mixer.in_proj.weight[c_rows.start + i, 2 * i] = 1.0
        core.lm_head.weight[:, 2 * i] = beta
        core.lm_head.weight[i, 2 * i + 1] = 1.0
    mixer.conv1d.weight[x_rows, 0, -1] = 1.0
    mixer.conv1d.weight[b_rows, 0, -2] = 1.0
    mixer.conv1d.weight[c_rows, 0, -1] = 1.0
    mixer.dt_bias.fill_(SOFTPLUS_INVERSE_OF_1)
    mixer.out_proj.weight.copy_(torch.eye(mixer.d_inner))


@torch.no_grad()
def construct_binary_laplace_smoothing(core: MambaZero, beta: float, epsilon: float) -> None:
    """Theorem 4 (App. C.3): binary chains with d = N = 2. The prediction is add-β except when
    x_1 = x_t, where the count of the other symbol gets an extra βε (Eq. 30-31), so
    KL(add-β ‖ model) <= log(1 + ε) (and -> 0 only as ε -> 0: two coordinates cannot hold both
    the symbol and the constant β·1 that d = 2S keeps apart).

    conv_X = (α_0, α_1) and conv_B = (γ_0, γ_1) (previous, current step) on both coordinates
    with α_0 γ_0 + α_1 γ_1 = 0, κ = α_0 γ_1 + α_1 γ_0 > 0 and α_0 γ_1 / κ = -βε (Eq. 18), here
    α = (a, 1), γ = (1, -a) with a² = βε / (1 + βε), so κ = 1 / (1 + βε). W_X = W_B map the
    embeddings to the one-hots, W_C = c W_X with c = 1/κ, W_o = W_ℓ = I, and the embeddings
    e_00 = e_11 = c(κβ - α_1 γ_1), e_01 = e_10 = c(κβ - α_0 γ_1) (Eq. 28-29) make
    logit_t = (n_{x_t 0} + β, n_{x_t 1} + β) + βε [x_1 = x_t] e_{1 - x_t}."""
    a = math.sqrt(beta * epsilon / (1.0 + beta * epsilon))
    kappa = 1.0 - a * a
    c = 1.0 / kappa
    same, other = c * (kappa * beta + a), c * (kappa * beta + a * a)  # e_00 = e_11, e_01 = e_10
    det = same * same - other * other  # > 0: a > a² for 0 < a < 1, so e_0, e_1 are independent
    embedding = torch.tensor([[same, other], [other, same]])
    to_one_hot = torch.tensor([[same, -other], [-other, same]]) / det  # W_X = [e_0 e_1]⁻¹
    x_rows, b_rows, c_rows = _mixer_rows(core)
    mixer = core.mixer
    for param in core.parameters():
        param.zero_()
    core.embedding.weight.copy_(embedding)
    mixer.in_proj.weight[x_rows] = to_one_hot
    mixer.in_proj.weight[b_rows] = to_one_hot
    mixer.in_proj.weight[c_rows] = c * to_one_hot
    mixer.conv1d.weight[x_rows, 0, -2], mixer.conv1d.weight[x_rows, 0, -1] = a, 1.0
    mixer.conv1d.weight[b_rows, 0, -2], mixer.conv1d.weight[b_rows, 0, -1] = 1.0, -a
    mixer.conv1d.weight[c_rows, 0, -1] = 1.0
    mixer.dt_bias.fill_(SOFTPLUS_INVERSE_OF_1)
    mixer.out_proj.weight.copy_(torch.eye(2))
    core.lm_head.weight.copy_(torch.eye(2))
