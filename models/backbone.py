"""The model contract: one backbone path for every architecture and every task kind.

    inputs ─► input adapter ─► core (the architecture's blocks) ─► output adapter ─► prediction

The input adapter is a token embedding (`tokens`) or a linear map of vectors (`vectors`); the
output adapter gives next-token logits or a predicted vector. A core maps (B, T, d_model) to
(B, T, d_model), is causal, owns its initialisation, and reports `state_size(seq_len)`: the
number of floats it must carry to continue the sequence (recurrent state, or KV cache at the
evaluated length). A core may also expose per-position internals for mechanism probes
(`probe(x) -> {name: (B, T, ...)}`, reached through `Backbone.probe`; a task names the probes it
summarises, tasks/base.py). A core that needs the raw inputs (e.g. analytically constructed
parameters) sets `owns_io = True` and then maps inputs to predictions itself.

Options of the adapters are common to every architecture (`BackboneOptions`): each family's
config (models/configs.py) gets them appended as fields, so every model YAML and every
`model.<field>=` override accepts them, type-checked like the family's own fields.

- `tie_embeddings`: the output head reuses the token embedding matrix (decoder.weight IS
  encoder.weight, one Parameter) and has no bias, as GPT-2 and mamba_ssm's language models do.
  Only for `tokens` tasks whose input and output vocabularies are one (input_dim == output_dim).
  The shared matrix starts N(0, 0.02²) like theirs (PyTorch's Embedding default, N(0, 1), would
  make the initial logits of a tied head ~sqrt(d_model) wide). It is counted once by
  `num_parameters()`. The state dict keeps both keys, `encoder.weight` and `decoder.weight`,
  views of one storage (torch.save writes it once); loading copies into the shared Parameter,
  refuses a state dict whose two matrices differ (an untied model's), accepts one that holds
  only one of the two keys, and ties again after `load_state_dict(assign=True)`.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn


def mark_recurrent(*params: nn.Parameter | None) -> None:
    """Tag a model's state-transition parameters (decays, rotations: what sets how the state
    carries over): the trainer gives them lr · trainer.recurrent_lr_ratio and no weight decay,
    as paper 002 A.5 trains "the SSM parameters" at half the global rate."""
    for param in params:
        if param is not None:
            param._recurrent = True


def is_recurrent(param: nn.Parameter) -> bool:
    return getattr(param, "_recurrent", False)


@dataclass(frozen=True)
class IOSpec:
    """What the task feeds in and expects out."""

    kind: str  # "tokens" | "vectors"
    input_dim: int  # vocabulary size or input vector size
    output_dim: int  # vocabulary size or target vector size
    max_len: int  # longest sequence the model will see (learned positions, KV-cache size)


class Core(nn.Module, abc.ABC):
    """Base class of every architecture. Subclasses set the class attributes and implement
    `__init__(config, io)`, `forward(x)` and `state_size(seq_len)`.

    A subclass's `Config` is its family's config in models/configs.py (CONFIGS), which also has
    the BackboneOptions fields: `Mamba.Config(tie_embeddings=True)` works."""

    family: ClassVar[str]
    Config: ClassVar[type]  # dataclass; must have an int field `d_model`
    description: ClassVar[str]  # `bench list` shows it for a conf file without a first comment
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
        self.tied = bool(getattr(core.config, "tie_embeddings", False))
        if self.tied:
            check_tying(core, io)
        if not core.owns_io:
            d_model = core.config.d_model
            self.encoder = (nn.Embedding(io.input_dim, d_model) if io.kind == "tokens"
                            else nn.Linear(io.input_dim, d_model))
            if self.tied:
                # GPT-2 / mamba_ssm: no head bias; the weight is the embedding's (no storage of
                # its own is ever allocated for it).
                self.decoder = nn.Linear(d_model, io.output_dim, bias=False, device="meta")
                nn.init.normal_(self.encoder.weight, mean=0.0, std=0.02)
                self.decoder.weight = self.encoder.weight
                self.register_load_state_dict_pre_hook(_check_tied_state)
                self.register_load_state_dict_post_hook(_retie)
            else:
                self.decoder = nn.Linear(d_model, io.output_dim)

    def forward(self, inputs: Tensor) -> Tensor:
        if inputs.is_floating_point():
            # Vector inputs are sampled in float32; a float64 model (precision 64-true) reads
            # them in its own dtype (under autocast the weights stay float32: a no-op).
            inputs = inputs.to(next(self.parameters()).dtype)
        if self.core.owns_io:
            return self.core(inputs)
        return self.decoder(self.core(self.encoder(inputs)))

    def predict(self, inputs: Tensor) -> Tensor:
        """Predictions in the task contract's format: log-probabilities or vector means."""
        out = self(inputs)  # through __call__: the compiled forward when compiled
        if self.io.kind == "tokens" and not getattr(self.core, "outputs_log_probs", False):
            out = torch.log_softmax(out.to(torch.promote_types(out.dtype, torch.float32)), dim=-1)
        return out

    def state_size(self, seq_len: int) -> int:
        return self.core.state_size(seq_len)

    def probe(self, inputs: Tensor) -> dict[str, Tensor]:
        """Per-position internals the core exposes for mechanism probes, each (B, T, ...), by
        name (e.g. Mamba's "decay", its a_t per layer and head); {} for a core without a
        `probe(x)` method, which gets the embedded inputs (the raw ones if it owns its io)."""
        probe = getattr(self.core, "probe", None)
        if probe is None:
            return {}
        return probe(inputs if self.core.owns_io else self.encoder(inputs))

    def num_parameters(self) -> int:
        """Parameters counted once each: a tied embedding/head matrix is one (parameters()
        yields a shared Parameter once)."""
        return sum(p.numel() for p in self.parameters())


def check_tying(core: Core, io: IOSpec) -> None:
    """ValueError (one line) unless the head can share the token embedding."""
    if core.owns_io:
        raise ValueError(f"tie_embeddings=true needs the backbone's token embedding and head, but "
                         f"the {core.family} core maps inputs to predictions itself")
    if io.kind != "tokens" or io.input_dim != io.output_dim:
        raise ValueError(f"tie_embeddings=true shares the token embedding with the output head: it "
                         f"needs a tokens task with input_dim == output_dim, got a {io.kind} task "
                         f"with input_dim={io.input_dim}, output_dim={io.output_dim}")


def _check_tied_state(module: Backbone, state_dict: dict, prefix: str, local_metadata, strict,
                      missing_keys, unexpected_keys, error_msgs) -> None:
    """Before a tied Backbone loads: a state dict with only one of the two tied keys (a
    deduplicated copy) gets the other; one whose two matrices differ is refused (it comes from
    an untied model, and loading would keep whichever came last)."""
    encoder, decoder = prefix + "encoder.weight", prefix + "decoder.weight"
    if encoder in state_dict and decoder not in state_dict:
        state_dict[decoder] = state_dict[encoder]
    elif decoder in state_dict and encoder not in state_dict:
        state_dict[encoder] = state_dict[decoder]
    elif encoder in state_dict:
        a, b = state_dict[encoder], state_dict[decoder]
        # Compared unless they are one tensor (a saved tied model's two keys share a storage),
        # cannot be compared (meta) or mismatch in shape (load_state_dict reports that itself).
        one = a is b or (a.device == b.device and a.shape == b.shape and a.stride() == b.stride()
                         and a.storage_offset() == b.storage_offset()
                         and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())
        if (not one and not a.is_meta and not b.is_meta and a.shape == b.shape
                and not torch.equal(a, b.to(a.device, a.dtype))):
            error_msgs.append(f"{encoder} and {decoder} differ, but this model ties them "
                              f"(tie_embeddings=true): the state dict comes from an untied model")


def _retie(module: Backbone, incompatible_keys) -> None:
    """After loading: `load_state_dict(assign=True)` puts a Parameter of its own at each key;
    the head shares the embedding's again."""
    if module.decoder.weight is not module.encoder.weight:
        module.decoder.weight = module.encoder.weight
