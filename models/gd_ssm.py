"""GD-SSM: sliding-window attention feeding a diagonal linear recurrence with a multiplicative
output (paper 002, "State-Space Models Can Learn In-Context by Gradient Descent", §3, App. A).

One layer, over its inputs u_t ∈ R^d and the window C_t = [u_{t-w+1}, ..., u_t] (w = 3 in the
paper; inputs before the start are zero):

    k_i = W_K u_{t-w+i} + b_K,  v_i = W_V u_{t-w+i} + b_V     keys, values of the window slots
    Z_t = A ⊙ Z_{t-1} + Σ_ij Q_ij k_i v_jᵀ                     Z ∈ R^{d_k × d_v}, A element-wise
    o_t = Z_tᵀ (W_Q Σ_i q_i u_{t-w+i} + b_Q)                   multiplicative output

Σ_ij Q_ij k_i v_jᵀ is the paper's local self-attention C Q Cᵀ (Eq. 21, Q ∈ R^{w×w}) with key and
value projections of the window; A is its diagonal recurrence (one decay per state entry, "f²
recurrent units", §5) and C_t q, here W_Q C_t q, the multiplicative output skip connection
(Fig. 3C, Table 3). The projections W_K, W_V, W_Q are the paper's input and output matrices (Ψ
and Θ of §3.1, Eq. 12-13), so one layer holds both constructions: §3.1 on constructed tokens and
§3.2 / App. A.1 on interleaved x, y tokens. Layers are residual: u ← u + W_O o_t, followed with
`mlp` by the weighted sigmoid gated unit of App. A.8, y ← U₂(y ⊙ σ(U₁ y)).

Ablations (App. A.9-A.10, Tables 2-3): `window=1` removes the sliding-window attention (the
recurrence sees only the current token) and `multiplicative_output=False` replaces the query
W_Q C_t q + b_Q by a learned constant (a linear read-out of the state). On constructed tokens
the product x_t y_t is already in the token, so §3.1's construction needs no attention and the
window=1 ablation can still do one GD step; the attention is needed on interleaved prompts.

`constructed=True` is the paper's analytical model: one layer whose parameters make o_t one
gradient-descent step from W = 0 on the examples before the query, for the prompts of
tasks/linreg.py (`prompt`). It owns its input/output maps, so it maps raw prompts to predictions:
ŷ = (η/j) Σ_{k<j} y_k x_kᵀ x_j for the query x_j after j examples (the paper's β = -η/N with N
the examples seen so far; the paper scores only the last query, where N is the context size).
Its parameters stay trainable, so it can also start training (App. A.8). With `features` > 0 it
is App. A.8's comparator for non-linear regression: a trained input embedding and weighted
sigmoid gated unit φ map each x to `features` coordinates, and the constructed layer, frozen, takes
one GD step on the prompt with x replaced by φ(x): ŷ = (η/j) Σ_{k<j} y_k φ(x_k)ᵀ φ(x_j).

`forward` runs the recurrence with the parallel doubling scan `models.scan.lti_scan`;
`forward_sequential` is its step-by-step twin and test oracle and returns the state carried
between steps (per layer the last w-1 inputs and Z), which is what `state_size` counts.
The paper's Fig. 1-2 measures between the trained model and one GD step (prediction distance,
input sensitivities) are the task's: tasks/linreg.py `comparison_metrics`.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from models.backbone import Core, IOSpec, mark_recurrent
from models.configs import GDSSMConfig
from models.scan import lti_scan


def window_slots(u: Tensor, window: int) -> Tensor:
    """(B, T, window, d): slot i at time t holds u_{t-window+1+i}, zero before the start."""
    batch, length, d = u.shape
    padded = torch.cat([u.new_zeros(batch, window - 1, d), u], dim=1)
    return torch.stack([padded[:, i:i + length] for i in range(window)], dim=2)


class GDSSMLayer(nn.Module):
    """The recurrence with its window attention and multiplicative output: u (B, T, d_model) →
    o (B, T, d_value)."""

    def __init__(self, d_model: int, d_key: int, d_value: int, window: int,
                 multiplicative_output: bool, max_len: int):
        super().__init__()
        self.window = window
        self.k_proj = nn.Linear(d_model, d_key)
        self.v_proj = nn.Linear(d_model, d_value)
        self.window_attn = nn.Parameter(torch.empty(window, window))  # Q
        # The decays, stored flat: a vector of per-unit scalars (like Mamba's A_log), which the
        # trainer leaves out of weight decay, which would pull them from 1 (the construction).
        self.A = nn.Parameter(torch.empty(d_key * d_value))
        mark_recurrent(self.A)
        self.state_shape = (d_key, d_value)
        if multiplicative_output:
            self.q_proj = nn.Linear(d_model, d_key)
            self.window_skip = nn.Parameter(torch.empty(window))  # q
        else:
            self.readout = nn.Parameter(torch.empty(d_key))
        self.reset_parameters(max_len)

    @torch.no_grad()
    def reset_parameters(self, max_len: int) -> None:
        """Decays 1 - 1/τ with memory time-scales τ log-uniform on [2, max(2, max_len)] steps,
        from the shortest memory to the whole sequence (the construction's A = 1 is the τ → ∞
        end); Q and q ~ N(0, 1/w), so a window's attention and skip have unit scale whatever its
        length; the projections keep PyTorch's default initialisation."""
        longest = max(2.0, float(max_len))
        log_tau = torch.rand(self.A.numel()) * (math.log(longest) - math.log(2.0)) + math.log(2.0)
        self.A.copy_(1.0 - torch.exp(-log_tau))
        nn.init.normal_(self.window_attn, 0.0, 1.0 / math.sqrt(self.window))
        if hasattr(self, "window_skip"):
            nn.init.normal_(self.window_skip, 0.0, 1.0 / math.sqrt(self.window))
        else:
            nn.init.normal_(self.readout, 0.0, 1.0 / math.sqrt(self.readout.numel()))

    def decay(self) -> Tensor:
        """A as the (d_k, d_v) matrix of per-entry decays of Z."""
        return self.A.view(self.state_shape)

    def drive_and_query(self, slots: Tensor) -> tuple[Tensor, Tensor]:
        """The recurrence input Σ_ij Q_ij k_i v_jᵀ (..., d_k, d_v) and the query (..., d_k) from
        window slots (..., w, d_model). The projections run in the autocast dtype; the window
        attention, the outer products that write the state and the query come out in at least
        float32 (autocast off), the precision of the state they are summed into."""
        keys, values = self.k_proj(slots), self.v_proj(slots)
        query = (self.q_proj(torch.einsum("i,...id->...d", self.window_skip, slots))
                 if hasattr(self, "window_skip") else None)
        dtype = torch.promote_types(slots.dtype, torch.float32)
        with torch.autocast(device_type=slots.device.type, enabled=False):
            mixed_values = torch.einsum("ij,...jv->...iv", self.window_attn.to(dtype),
                                        values.to(dtype))
            drive = torch.einsum("...ik,...iv->...kv", keys.to(dtype), mixed_values)
            query = (query.to(dtype) if query is not None
                     else self.readout.to(dtype).expand(*slots.shape[:-2], -1))
        return drive, query

    def read(self, states: Tensor, query: Tensor) -> Tensor:
        """o = Zᵀ query, in the state's precision (autocast off)."""
        with torch.autocast(device_type=states.device.type, enabled=False):
            return torch.einsum("...kv,...k->...v", states, query.to(states.dtype))

    def forward(self, u: Tensor) -> Tensor:
        drive, query = self.drive_and_query(window_slots(u, self.window))
        states = lti_scan(self.decay().to(drive.dtype), drive)
        return self.read(states, query)

    def forward_sequential(self, u: Tensor, state: tuple[Tensor, Tensor] | None = None
                           ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """One step at a time from `state` = (last w-1 inputs (B, w-1, d_model), Z (B, d_k, d_v)),
        zeros if None. Returns the outputs and the final state."""
        batch, length, d_model = u.shape
        if state is None:
            history = u.new_zeros(batch, self.window - 1, d_model)
            z = u.new_zeros(batch, *self.state_shape,
                            dtype=torch.promote_types(u.dtype, torch.float32))
        else:
            history, z = state
        outputs = []
        for t in range(length):
            slots = torch.cat([history, u[:, t:t + 1]], dim=1)
            drive, query = self.drive_and_query(slots)
            z = self.decay().to(drive.dtype) * z.to(drive.dtype) + drive
            outputs.append(self.read(z, query))
            history = slots[:, 1:]
        return torch.stack(outputs, dim=1), (history, z)

    def state_size(self) -> int:
        return (self.window - 1) * self.k_proj.in_features + self.A.numel()


class GatedUnit(nn.Module):
    """Weighted sigmoid gated unit, y ↦ U₂ (y ⊙ σ(U₁ y)) (paper 002 §2 and App. A.8)."""

    def __init__(self, d_model: int):
        super().__init__()
        self.gate = nn.Linear(d_model, d_model)  # U₁
        self.proj = nn.Linear(d_model, d_model)  # U₂

    def forward(self, y: Tensor) -> Tensor:
        return self.proj(y * torch.sigmoid(self.gate(y)))


class GDSSMBlock(nn.Module):
    """u ← u + [gated unit] W_O o(u)."""

    def __init__(self, config: GDSSMConfig, max_len: int):
        super().__init__()
        self.layer = GDSSMLayer(config.d_model, config.d_state, config.d_state, config.window,
                                config.multiplicative_output, max_len)
        self.out_proj = nn.Linear(config.d_state, config.d_model)
        self.mlp = GatedUnit(config.d_model) if config.mlp else None

    def mix(self, o: Tensor) -> Tensor:
        y = self.out_proj(o)
        return y if self.mlp is None else self.mlp(y)

    def forward(self, u: Tensor) -> Tensor:
        return u + self.mix(self.layer(u))

    def forward_sequential(self, u: Tensor, state=None):
        o, state = self.layer.forward_sequential(u, state)
        return u + self.mix(o), state


def prompt_layout(prompt: str, input_dim: int, n_outputs: int) -> int:
    """The number of features f of the linreg prompts (tasks/linreg.py): interleaved tokens are
    x-tokens [x, 0_N, 1] and y-tokens [0_f, y, 0]; constructed tokens are [vec(y xᵀ), x]."""
    if prompt == "interleaved":
        n_features = input_dim - n_outputs - 1
    else:
        n_features, remainder = divmod(input_dim, n_outputs + 1)
        if remainder:
            n_features = 0
    if n_features < 1:
        raise ValueError(f"gd_ssm: input_dim={input_dim}, output_dim={n_outputs} is not a linreg "
                         f"'{prompt}' prompt")
    return n_features


def query_coordinates(prompt: str, input_dim: int, n_outputs: int) -> slice:
    """Where the query x sits in the input vector at its own (scored) position."""
    n_features = prompt_layout(prompt, input_dim, n_outputs)
    return slice(0, n_features) if prompt == "interleaved" else slice(input_dim - n_features,
                                                                      input_dim)


@torch.no_grad()
def construct_one_gd_step(layer: GDSSMLayer, prompt: str, n_features: int, n_outputs: int
                          ) -> None:
    """Set a layer whose inputs are the raw prompt tokens to the paper's construction: o_t is
    Σ_{k<j} y_k (x_kᵀ x_j) = S_xyᵀ x_j for the query x_j at position t (before the 1/j scale).

    interleaved (§3.2, App. A.1): at the x_j position the window is (x_{j-1}, y_{j-1}, x_j);
    Q = e₁e₂ᵀ pairs the key x_{j-1} (slot 1) with the value y_{j-1} (slot 2), q = e₃ makes the
    query x_j (slot 3). At y-positions the slot-1 token is a y-token, whose key part is zero, so
    nothing is accumulated: the x- and y-parts of the tokens are disjoint coordinates.
    tokens (§3.1, Eq. 12-16, N = 1): the token [x_{t-1} y_{t-1}, x_t] holds the increment of the
    gradient state, taken as key (Ψ: its first f coordinates) with the constant value 1 (b_V);
    the query is the token's last f coordinates (Θ). Only the current slot is used."""
    f, n = n_features, n_outputs
    w = layer.window
    for param in layer.parameters():
        param.zero_()
    layer.A.fill_(1.0)  # plain accumulation: the state is the unscaled gradient
    layer.window_skip[w - 1] = 1.0
    if prompt == "interleaved":
        layer.k_proj.weight[:, :f] = torch.eye(f)
        layer.v_proj.weight[:, f:f + n] = torch.eye(n)
        layer.q_proj.weight[:, :f] = torch.eye(f)
        layer.window_attn[w - 3, w - 2] = 1.0
    else:
        layer.k_proj.weight[:, :f] = torch.eye(f)
        layer.v_proj.bias.fill_(1.0)
        layer.q_proj.weight[:, f:] = torch.eye(f)
        layer.window_attn[w - 1, w - 1] = 1.0


class GDSSM(Core):
    family = "gd_ssm"
    Config = GDSSMConfig
    description = ("GD-SSM (paper 002 §3, App. A): window-3 local attention feeding a diagonal "
                   "linear recurrence with a multiplicative output; ablations window=1 and "
                   "multiplicative_output=false; constructed=true loads the paper's one-GD-step "
                   "parameters for the linreg prompts")

    def __init__(self, config: GDSSMConfig, io: IOSpec):
        super().__init__(config, io)
        self.owns_io = config.constructed
        if config.constructed:
            if io.kind != "vectors":
                raise ValueError("gd_ssm: constructed=true needs a vectors task (linreg)")
            n_features = prompt_layout(config.prompt, io.input_dim, io.output_dim)
            if config.prompt == "tokens" and io.output_dim != 1:
                raise ValueError("gd_ssm: the constructed-token construction (paper §3.1) is for "
                                 "1-D targets; use prompt=interleaved (§3.2) for n_outputs > 1")
            d_value = io.output_dim if config.prompt == "interleaved" else 1
            self.raw_features = n_features
            if config.features:
                # App. A.8's comparator: a trained input embedding and non-linearity φ, then the
                # GD step of the construction, frozen, on the prompt with x replaced by φ(x)
                self.feature_map = nn.Sequential(nn.Linear(n_features, config.d_model),
                                                 GatedUnit(config.d_model),
                                                 nn.Linear(config.d_model, config.features))
                n_features = config.features
            self.layer = GDSSMLayer(n_features + io.input_dim - self.raw_features, n_features,
                                    d_value, config.window, True, io.max_len)
            construct_one_gd_step(self.layer, config.prompt, n_features, io.output_dim)
            if config.features:
                self.layer.requires_grad_(False)
        else:
            self.blocks = nn.ModuleList(GDSSMBlock(config, io.max_len)
                                        for _ in range(config.n_layers))

    def examples_before(self, length: int, device) -> Tensor:
        """j, the number of complete examples before the query at each position."""
        positions = torch.arange(length, device=device)
        return positions // 2 if self.config.prompt == "interleaved" else positions

    def gradient_step_scale(self, length: int, like: Tensor) -> Tensor:
        """η/j per position (0 where no example precedes the query), shape (T, 1)."""
        j = self.examples_before(length, like.device).to(like.dtype)
        return torch.where(j > 0, self.config.step_size / j.clamp_min(1), 0.0).unsqueeze(-1)

    def check_prompt(self, inputs: Tensor) -> None:
        """The two prompts can have equal sizes (e.g. f = 2k: 2k + 2 = 2(k + 1)), so the
        construction checks the layout it reads: interleaved prompts flag x-tokens with a last
        coordinate of 1 and y-tokens with 0; constructed tokens start with an empty product."""
        if self.config.prompt == "interleaved":
            flags = inputs[:, :, -1]
            ok = bool((flags[:, 0::2] == 1).all() and (flags[:, 1::2] == 0).all())
        else:
            ok = bool((inputs[:, 0, :-self.raw_features] == 0).all())
        if not ok:
            raise ValueError(f"gd_ssm: the inputs are not a linreg '{self.config.prompt}' prompt; "
                             f"set model.prompt to the task's prompt")

    def lifted(self, x: Tensor) -> Tensor:
        """The prompt the constructed layer reads: as given, or with features > 0 each x-token's
        x replaced by φ(x) (y-tokens keep a zero x-part: the construction pairs x- and y-parts
        by disjoint coordinates)."""
        if not self.config.features:
            return x
        f = self.raw_features
        flag = x[..., -1:]
        return torch.cat([self.feature_map(x[..., :f]) * flag, x[..., f:]], dim=-1)

    def forward(self, x: Tensor) -> Tensor:
        if self.config.scan == "sequential":
            return self.forward_sequential(x)[0]
        if self.config.constructed:
            self.check_prompt(x)
            return self.gradient_step_scale(x.shape[1], x) * self.layer(self.lifted(x))
        for block in self.blocks:
            x = block(x)
        return x

    def forward_sequential(self, x: Tensor, states: list | None = None) -> tuple[Tensor, list]:
        """Step-by-step twin of `forward`, continuing from `states` (one (history, Z) pair per
        layer, as returned; zeros if None). The constructed model's 1/j scale needs the absolute
        position, so it is only defined from the start of a sequence."""
        if self.config.constructed:
            if states is not None:
                raise ValueError("gd_ssm: the constructed model restarts at position 0")
            self.check_prompt(x)
            o, state = self.layer.forward_sequential(self.lifted(x))
            return self.gradient_step_scale(x.shape[1], x) * o, [state]
        finals = []
        for i, block in enumerate(self.blocks):
            x, state = block.forward_sequential(x, None if states is None else states[i])
            finals.append(state)
        return x, finals

    def state_size(self, seq_len: int) -> int:
        """Per layer the last window-1 layer inputs and the d_k × d_v state Z; independent of
        seq_len (the constructed model also needs the position, an integer, for its 1/j)."""
        layers = [self.layer] if self.config.constructed else [b.layer for b in self.blocks]
        return sum(layer.state_size() for layer in layers)
