"""Every model family's config: the typed, defaulted sizes and switches (conf/model/<name>.yaml
sets them) and their checks, a ValueError naming the field. Kept apart from the architectures
(models/<family>.py, which take their `Config` from here) so that composing and checking a command
line imports no torch. CONFIGS maps a family to its config."""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass

# --- options of the backbone (models/backbone.py), every family's ---------------------------------
@dataclass
class BackboneOptions:
    """Fields every family's config gets (with_backbone_options)."""

    tie_embeddings: bool = False  # head weight = token embedding, no head bias (tokens only)


def with_backbone_options(config: type) -> type:
    """Decorator of a family's config: `config` with the BackboneOptions fields it lacks appended
    (after its own fields, so its positional order is unchanged). The new class is a subclass of
    `config` (its checks in __post_init__ still run) under the same name, which the decorator
    binds to it in this module: where pickle finds it."""
    have = {f.name for f in dataclasses.fields(config)}
    hints = typing.get_type_hints(BackboneOptions)
    extra = [(f.name, hints[f.name], dataclasses.field(default=f.default))
             for f in dataclasses.fields(BackboneOptions) if f.name not in have]
    if not extra:
        return config
    augmented = dataclasses.make_dataclass(config.__name__, extra, bases=(config,),
                                           frozen=config.__dataclass_params__.frozen)
    augmented.__module__ = config.__module__
    augmented.__qualname__ = config.__qualname__
    augmented.__doc__ = config.__doc__
    return augmented


# --- mamba, mambazero (models/mamba.py) -----------------------------------------------------------
KERNELS = ("auto", "torch", "sequential", "mamba_ssm")  # the SSD scans (models/ssd.py)
ACTIVATION_NAMES = ("silu", "relu", "identity")  # models/mamba.py ACTIVATIONS' keys
MAX_CHUNK = 4096  # 4096^2 float32 decays per head and batch row: 64 MiB
L1_FLOOR = 1e-6  # logits are clamped here before the L1 normalisation, so log() stays finite


def check_mixer_shape(d_model: int, expand: int, headdim: int, ngroups: int, d_state: int,
                      d_conv: int, chunk_size: int, kernel: str) -> None:
    """Clear errors for dimensions the Mamba-2 mixer cannot be built with."""
    for name, value in [("d_model", d_model), ("expand", expand), ("headdim", headdim),
                        ("ngroups", ngroups), ("d_state", d_state), ("d_conv", d_conv),
                        ("chunk_size", chunk_size)]:
        if value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value}")
    if chunk_size > MAX_CHUNK:  # the chunked scan holds chunk_size^2 decays per head
        raise ValueError(f"chunk_size must be at most {MAX_CHUNK}, got {chunk_size}")
    d_inner = expand * d_model
    if d_inner % headdim:
        raise ValueError(f"expand*d_model = {d_inner} must be divisible by headdim = {headdim} "
                         f"(n_heads = expand*d_model/headdim)")
    if (d_inner // headdim) % ngroups:
        raise ValueError(f"ngroups = {ngroups} must divide n_heads = {d_inner // headdim}")
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {', '.join(KERNELS)}, got {kernel!r}")


@with_backbone_options
@dataclass
class MambaConfig:
    d_model: int = 16
    n_layers: int = 1
    d_state: int = 16
    expand: int = 2
    headdim: int = 32          # n_heads = expand * d_model / headdim
    ngroups: int = 1           # groups of heads sharing B and C
    d_conv: int = 4            # convolution window w
    chunk_size: int = 64       # block length of the chunked scan
    mlp: bool = True           # pre-norm residual MLP (4x, GELU) after each mixer
    kernel: str = "auto"       # auto | torch | sequential | mamba_ssm
    conv: bool = True          # ablation: False removes the convolution
    decay: bool = True         # ablation: False fixes a_t = 1 ("w/o gating factor")
    activation: str = "silu"   # silu | relu | identity
    gate: bool = True          # ablation: False removes the multiplicative z gate

    def __post_init__(self):
        if self.n_layers < 1:
            raise ValueError(f"n_layers must be a positive integer, got {self.n_layers}")
        if self.activation not in ACTIVATION_NAMES:
            raise ValueError(f"activation must be one of {', '.join(ACTIVATION_NAMES)}, "
                             f"got {self.activation!r}")
        check_mixer_shape(self.d_model, self.expand, self.headdim, self.ngroups, self.d_state,
                          self.d_conv, self.chunk_size, self.kernel)


@with_backbone_options
@dataclass
class MambaZeroConfig:
    d_model: int = 4
    d_state: int = 2
    expand: int = 1
    headdim: int = 4           # one head: d_inner = expand * d_model
    ngroups: int = 1
    d_conv: int = 2
    chunk_size: int = 64
    kernel: str = "auto"       # auto | torch | sequential | mamba_ssm
    decay: bool = True         # False fixes a_t = 1
    l1_prediction: bool = False  # predict logit / sum(logit) (paper §4.1) instead of softmax
    constructed: bool = False  # the paper's first-order add-β parameters (Thm. 1, Thm. 4)
    beta: float = 1.0          # β of the constructed estimator (set it to the task's β)
    epsilon: float = 0.01      # Thm. 4 (d_model = 2) only: KL(add-β ‖ model) <= log(1 + ε)

    def __post_init__(self):
        check_mixer_shape(self.d_model, self.expand, self.headdim, self.ngroups, self.d_state,
                          self.d_conv, self.chunk_size, self.kernel)
        if not self.constructed:
            return
        if (self.decay or not self.l1_prediction or self.expand != 1
                or self.headdim != self.d_model or self.ngroups != 1 or self.d_conv != 2):
            raise ValueError("mambazero: constructed=true is the paper's first-order construction "
                             "(App. C.2-C.3): it needs decay=false (a_t = 1), l1_prediction=true, "
                             "expand=1 and one head (headdim = d_model), ngroups=1 and d_conv=2")
        if (self.d_model, self.d_state) != (2, 2) and self.d_model != 2 * self.d_state:
            raise ValueError(f"mambazero: constructed=true needs the canonical sizes d_model = "
                             f"2 * d_state (Thm. 1) or d_model = d_state = 2 (Thm. 4), got "
                             f"d_model={self.d_model}, d_state={self.d_state}")
        if not self.beta >= L1_FLOOR or not 0 < self.epsilon < 1:
            raise ValueError(f"mambazero: constructed=true needs beta >= {L1_FLOOR} (the smallest "
                             f"score; lower ones are clamped) and 0 < epsilon < 1, got "
                             f"beta={self.beta}, epsilon={self.epsilon}")


# --- transformer ----------------------------------------------------------------------------------
ATTENTIONS = ("softmax", "linear")


@with_backbone_options
@dataclass
class TransformerConfig:
    d_model: int = 16
    n_layers: int = 2
    n_heads: int = 1
    mlp: bool = True  # GPT-2 MLP (d → d_ff → d, GELU) after each attention
    d_ff: int = 0  # hidden width of the MLP; 0 = GPT-2's 4·d_model
    attention: str = "softmax"  # "softmax" | "linear" (paper 004 App. B.1)
    qkv_conv: int = 0  # width of the causal depthwise conv on Q, K, V (paper 000 E.6); 0 = off
    window: int = 0  # sliding-window attention span including the query position; 0 = full causal
    positions: bool = True  # learned absolute positions `wpe` (max_len × d_model)
    norm: bool = True  # pre-LayerNorms and the final ln_f; False: none (bare linear self-attention)

    def __post_init__(self):  # at compose time, before anything is built
        if self.d_model < 1 or self.n_layers < 1 or self.n_heads < 1:
            raise ValueError(f"transformer: d_model, n_layers and n_heads must be positive, got "
                             f"{self.d_model}, {self.n_layers}, {self.n_heads}")
        if self.d_model % self.n_heads:
            raise ValueError(f"transformer: d_model={self.d_model} is not divisible by "
                             f"n_heads={self.n_heads}")
        if self.attention not in ATTENTIONS:
            raise ValueError(f"transformer: attention={self.attention!r} is not one of "
                             f"{', '.join(ATTENTIONS)}")
        if self.qkv_conv < 0 or self.window < 0:
            raise ValueError(f"transformer: qkv_conv and window must be >= 0 (0 = off), got "
                             f"{self.qkv_conv}, {self.window}")
        if self.d_ff < 0:
            raise ValueError(f"transformer: d_ff must be >= 0 (0 = 4*d_model), got {self.d_ff}")
        if self.window > 0 and self.attention == "linear":
            raise ValueError("transformer: window > 0 is only defined for attention='softmax' (a "
                             "sliding window would break the linear attention's fixed-size state)")


# --- griffin --------------------------------------------------------------------------------------
BLOCK_KINDS = {"R": "recurrent block (conv + RG-LRU)", "A": "local multi-query attention"}


@with_backbone_options
@dataclass
class GriffinConfig:
    d_model: int = 32
    n_layers: int = 1  # repetitions of block_pattern
    block_pattern: str = "RRA"  # R: recurrent block, A: local MQA block
    rnn_expansion: float = 1.3333333333333333  # D_RNN = round(4/3 · d_model), as in the paper
    conv_width: int = 4
    n_heads: int = 2  # query heads of the local MQA (paper 002's best Griffin: 2 heads)
    # Past positions each query attends to. Griffin's 1024-token window is half its 2048-token
    # training length; 32 keeps the window a fraction of the benchmark's sequences, so long-range
    # information must travel through the recurrence.
    window: int = 32
    mlp_expansion: int = 3

    def __post_init__(self):  # at compose time, before anything is built
        if min(self.d_model, self.n_layers, self.n_heads, self.conv_width,
               self.mlp_expansion) < 1 or self.window < 0 or self.rnn_expansion <= 0:
            raise ValueError("griffin: d_model, n_layers, n_heads, conv_width, mlp_expansion and "
                             "rnn_expansion must be positive and window >= 0")
        if not self.block_pattern or set(self.block_pattern) - set(BLOCK_KINDS):
            raise ValueError(f"griffin: block_pattern={self.block_pattern!r} must be a non-empty "
                             f"string of {', '.join(f'{k} ({v})' for k, v in BLOCK_KINDS.items())}")
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ValueError(f"griffin: d_model={self.d_model} must split into n_heads="
                             f"{self.n_heads} heads of even size (rotary embeddings rotate pairs)")


# --- lru ------------------------------------------------------------------------------------------
@with_backbone_options
@dataclass
class LRUConfig:
    d_model: int = 32
    n_layers: int = 2
    d_state: int = 32  # complex state entries per layer (paper 002's S5: state size 32)
    # Eigenvalue ring at initialisation: |λ| in [0.9, 0.999] gives memory time-scales of
    # 1/(1-|λ|) = 10 to 1000 steps, spanning the in-context lengths of the tasks.
    r_min: float = 0.9
    r_max: float = 0.999
    max_phase: float = 6.283185307179586  # 2π: phases on the whole circle (the paper's default)

    def __post_init__(self):  # at compose time, before anything is built
        if self.d_model < 1 or self.n_layers < 1 or self.d_state < 1:
            raise ValueError(f"lru: d_model, n_layers and d_state must be positive, got "
                             f"{self.d_model}, {self.n_layers}, {self.d_state}")
        if not 0.0 <= self.r_min < self.r_max < 1.0:
            raise ValueError(f"lru: need 0 <= r_min < r_max < 1, got r_min={self.r_min}, "
                             f"r_max={self.r_max}")
        if not self.max_phase > 0.0:
            raise ValueError(f"lru: max_phase must be positive, got {self.max_phase}")


# --- lstm -----------------------------------------------------------------------------------------
@with_backbone_options
@dataclass
class LSTMConfig:
    d_model: int = 32  # input, hidden and output width of every layer
    n_layers: int = 2

    def __post_init__(self):
        if self.d_model < 1 or self.n_layers < 1:
            raise ValueError(f"lstm: d_model and n_layers must be positive, got "
                             f"{self.d_model}, {self.n_layers}")


# --- gd_ssm ---------------------------------------------------------------------------------------
PROMPTS = ("interleaved", "tokens")
SCANS = ("parallel", "sequential")  # gd_ssm, selective_ssm: parallel scan | step by step


@with_backbone_options
@dataclass
class GDSSMConfig:
    # Sizes of the trained model; the constructed one takes its sizes from the prompt (Z is f × N).
    d_model: int = 32
    d_state: int = 16  # Z is d_state × d_state per layer
    n_layers: int = 1
    window: int = 3  # sliding-window length (paper: 3); 1 = the no-attention ablation
    multiplicative_output: bool = True  # False = ablation: state read out by a learned constant
    mlp: bool = False  # weighted sigmoid gated unit after each layer (App. A.8, non-linear tasks)
    constructed: bool = False  # the paper's analytical one-GD-step parameters (owns input/output)
    prompt: str = "interleaved"  # token layout the construction reads: tasks/linreg.py `prompt`
    step_size: float = 1.0  # η of the constructed model's gradient step
    # constructed=true: > 0 trains a feature map of this many outputs (App. A.8's input embedding
    # and non-linearity) under the constructed, frozen GD step; 0 steps on the raw tokens
    features: int = 0
    scan: str = "parallel"  # "parallel" (doubling scan) | "sequential" (step-by-step twin)

    def __post_init__(self):
        if min(self.d_model, self.d_state, self.n_layers, self.window) < 1:
            raise ValueError(f"gd_ssm: d_model, d_state, n_layers and window must be positive, "
                             f"got {self.d_model}, {self.d_state}, {self.n_layers}, {self.window}")
        if self.prompt not in PROMPTS:
            raise ValueError(f"gd_ssm: prompt={self.prompt!r} is not one of {', '.join(PROMPTS)}")
        if self.scan not in SCANS:
            raise ValueError(f"gd_ssm: scan={self.scan!r} is not one of {', '.join(SCANS)}")
        if self.constructed and (self.n_layers != 1 or self.mlp or not self.multiplicative_output
                                 or self.window < (3 if self.prompt == "interleaved" else 1)):
            raise ValueError("gd_ssm: constructed=true is the paper's one-layer construction: it "
                             "needs n_layers=1, mlp=false, multiplicative_output=true and window "
                             ">= 3 (interleaved prompt) or >= 1 (tokens prompt)")
        if self.features < 0 or (self.features and not (self.constructed
                                                        and self.prompt == "interleaved")):
            raise ValueError("gd_ssm: features > 0 (a trained feature map under the constructed "
                             "GD step) needs constructed=true and prompt=interleaved; got "
                             f"features={self.features}")


# --- selective_ssm --------------------------------------------------------------------------------
TRANSITIONS = ("linear", "exp")


@with_backbone_options
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


CONFIGS: dict[str, type] = {
    "mamba": MambaConfig, "mambazero": MambaZeroConfig, "transformer": TransformerConfig,
    "griffin": GriffinConfig, "lru": LRUConfig, "lstm": LSTMConfig, "gd_ssm": GDSSMConfig,
    "selective_ssm": SelectiveSSMConfig}
