"""Transformer core: causality, attention against naive definitions, the linear attention's
recurrent twin, sliding windows, state sizes, GPT-2 names and initialisation, configs.

Identities are checked in float64 on random (not GPT-2-initialised) weights, so attention is far
from uniform and every path matters. Float64 rounding after a few hundred operations on O(1)
numbers is ~1e-13, hence the 1e-10 tolerance of the identity checks; causality checks allow
1e-12 for the unchanged past and require the changed future to move by more than 1e-8.
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from conftest import own_fields, redraw_in_float64
from models import IOSpec, build_model, model_families
from models.transformer import (Transformer, TransformerConfig, causal_linear_attention,
                                causal_linear_attention_recurrent, causal_softmax_attention)
from tasks.linreg import LinearRegression

TOL = dict(rtol=1e-10, atol=1e-10)
D_MODEL, MAX_LEN = 8, 16
CONF_DIR = Path(__file__).resolve().parents[1] / "conf" / "model"


def make_core(seed: int = 0, max_len: int = MAX_LEN, **overrides) -> Transformer:
    """A float64 core with all parameters redrawn at scale 0.5."""
    config = TransformerConfig(**{"d_model": D_MODEL, "n_heads": 2, **overrides})
    return redraw_in_float64(Transformer(config, IOSpec("vectors", 3, 3, max_len)), seed)


def random_inputs(batch: int, seq_len: int, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, seq_len, D_MODEL, generator=generator, dtype=torch.float64)


def naive_layer_norm(x, norm):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias


def naive_streaming(core: Transformer, x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The core run one position at a time through all layers, keeping only what a decoder must
    keep: per layer the last `window` keys and values (softmax) or the matrix S (linear), and the
    last width-1 rows fed to the convolution. Returns the outputs and the number of floats held
    per sequence after the last position."""
    cfg = core.config
    batch, seq_len, d = x.shape
    heads, head_dim = cfg.n_heads, d // cfg.n_heads
    width = cfg.qkv_conv
    caches = [{"keys": [], "values": [],
               "conv": [x.new_zeros(batch, 3 * d) for _ in range(max(width - 1, 0))],
               "S": x.new_zeros(batch, heads, head_dim, head_dim)} for _ in core.h]
    outputs = []
    for t in range(seq_len):
        h = x[:, t] + (core.wpe.weight[t] if cfg.positions else 0.0)
        for block, cache in zip(core.h, caches):
            attn = block.attn
            raw = naive_layer_norm(h, block.ln_1) @ attn.c_attn.weight.T + attn.c_attn.bias
            if width > 0:
                # Conv1d output at t is sum_j w[j] * input[t - (width-1) + j].
                window_rows = cache["conv"] + [raw]
                kernel = attn.conv1d.weight[:, 0, :]  # (3d, width)
                raw = sum(kernel[:, j] * window_rows[j] for j in range(width))
                cache["conv"] = window_rows[1:]
            q, k, v = (part.reshape(batch, heads, head_dim) for part in raw.split(d, dim=-1))
            if cfg.attention == "linear":
                cache["S"] = cache["S"] + k[..., :, None] * v[..., None, :]
                y = torch.einsum("bhi,bhij->bhj", q, cache["S"]) / head_dim
            else:
                cache["keys"].append(k)
                cache["values"].append(v)
                if cfg.window > 0:
                    cache["keys"] = cache["keys"][-cfg.window:]
                    cache["values"] = cache["values"][-cfg.window:]
                scores = torch.stack([(q * key).sum(-1) for key in cache["keys"]], -1)
                weights = torch.exp(scores / math.sqrt(head_dim)
                                    - (scores / math.sqrt(head_dim)).max(-1, keepdim=True).values)
                weights = weights / weights.sum(-1, keepdim=True)
                y = sum(weights[..., i, None] * value for i, value in enumerate(cache["values"]))
            h = h + y.reshape(batch, d) @ attn.c_proj.weight.T + attn.c_proj.bias
            if block.mlp is not None:
                hidden = naive_layer_norm(h, block.ln_2) @ block.mlp.c_fc.weight.T + block.mlp.c_fc.bias
                hidden = 0.5 * hidden * (1 + torch.erf(hidden / math.sqrt(2)))
                h = h + hidden @ block.mlp.c_proj.weight.T + block.mlp.c_proj.bias
        outputs.append(naive_layer_norm(h, core.ln_f))
    held = 0
    for cache in caches:
        held += sum(row[0].numel() for row in cache["keys"] + cache["values"] + cache["conv"])
        held += cache["S"][0].numel() if cfg.attention == "linear" else 0
    return torch.stack(outputs, 1), held


VARIANTS = {
    "softmax": {},
    "softmax_one_layer_no_mlp": {"n_layers": 1, "mlp": False},
    "window": {"window": 3},
    "qkv_conv": {"qkv_conv": 3},
    "window_and_conv": {"window": 4, "qkv_conv": 2},
    "no_positions": {"positions": False},
    "linear": {"attention": "linear"},
    "linear_conv_no_positions": {"attention": "linear", "qkv_conv": 4, "positions": False},
}


@pytest.mark.parametrize("name", VARIANTS)
def test_forward_equals_naive_streaming_and_state_size(name):
    """The parallel forward equals a per-position loop with explicit softmax / S-recurrence /
    convolution, and state_size equals the floats that loop has to keep."""
    core = make_core(**VARIANTS[name])
    x = random_inputs(2, 11)
    expected, held = naive_streaming(core, x)
    torch.testing.assert_close(core(x), expected, **TOL)
    assert core.state_size(11) == held


@pytest.mark.parametrize("name", ["softmax", "window", "qkv_conv", "linear"])
def test_causal(name):
    core = make_core(**VARIANTS[name])
    x = random_inputs(2, 12)
    t = 6
    changed = x.clone()
    changed[:, t + 1:] = random_inputs(2, 12 - t - 1, seed=7)
    out, out_changed = core(x), core(changed)
    torch.testing.assert_close(out_changed[:, :t + 1], out[:, :t + 1], rtol=0, atol=1e-12)
    assert (out_changed[:, t + 1] - out[:, t + 1]).abs().max() > 1e-8


def test_linear_attention_parallel_equals_recurrent_twin():
    generator = torch.Generator().manual_seed(3)
    q, k, v = torch.randn(3, 2, 2, 17, 4, generator=generator, dtype=torch.float64)
    y_recurrent, state = causal_linear_attention_recurrent(q, k, v)
    torch.testing.assert_close(causal_linear_attention(q, k, v), y_recurrent, **TOL)
    # The final state is the sum of outer products k_t v_tᵀ over the whole sequence.
    torch.testing.assert_close(state, torch.einsum("bhti,bhtj->bhij", k, v), **TOL)


def test_sliding_window_attention_equals_full_attention_on_last_window():
    generator = torch.Generator().manual_seed(4)
    q, k, v = torch.randn(3, 2, 2, 13, 4, generator=generator, dtype=torch.float64)
    window = 5
    y = causal_softmax_attention(q, k, v, window)
    for t in range(13):
        start = max(0, t - window + 1)
        full = causal_softmax_attention(q[..., start:t + 1, :], k[..., start:t + 1, :],
                                        v[..., start:t + 1, :])
        torch.testing.assert_close(y[..., t, :], full[..., -1, :], **TOL)


def test_sliding_window_core_sees_only_its_window_at_true_positions():
    """One windowed layer at position t equals a full-attention twin (same weights, no learned
    positions) applied to the last `window` inputs with their true positions already added."""
    window, seq_len = 4, 12
    core = make_core(n_layers=1, window=window)
    twin = Transformer(dataclasses.replace(core.config, window=0, positions=False),
                       core.io).double()
    twin.load_state_dict({k: v for k, v in core.state_dict().items() if not k.startswith("wpe")})
    x = random_inputs(2, seq_len)
    positioned = x + core.wpe.weight[:seq_len]
    out = core(x)
    for t in range(seq_len):
        start = max(0, t - window + 1)
        torch.testing.assert_close(out[:, t], twin(positioned[:, start:t + 1])[:, -1], **TOL)


def test_sliding_window_receptive_field_grows_by_window_minus_one_per_layer():
    window, n_layers, seq_len = 3, 2, 12
    core = make_core(n_layers=n_layers, window=window)
    x = random_inputs(1, seq_len)
    t = seq_len - 1
    oldest_seen = t - n_layers * (window - 1)
    # Random (not constant) shifts: a constant shift of one position would be erased by the
    # LayerNorms and prove nothing.
    shift = random_inputs(1, seq_len, seed=5)
    unseen, seen = x.clone(), x.clone()
    unseen[:, :oldest_seen] += shift[:, :oldest_seen]
    seen[:, oldest_seen] += shift[:, oldest_seen]
    torch.testing.assert_close(core(unseen)[:, t], core(x)[:, t], rtol=0, atol=1e-12)
    assert (core(seen)[:, t] - core(x)[:, t]).abs().max() > 1e-8


def test_state_size_formulas():
    d, layers = 8, 3
    io = IOSpec("tokens", 4, 4, 64)
    softmax = Transformer(TransformerConfig(d_model=d, n_layers=layers), io)
    assert softmax.state_size(40) == 2 * layers * 40 * d
    windowed = Transformer(TransformerConfig(d_model=d, n_layers=layers, window=5), io)
    assert windowed.state_size(40) == 2 * layers * 5 * d
    assert windowed.state_size(3) == 2 * layers * 3 * d
    conv = Transformer(TransformerConfig(d_model=d, n_layers=layers, qkv_conv=4), io)
    assert conv.state_size(40) == layers * (2 * 40 * d + 3 * 3 * d)
    linear = Transformer(TransformerConfig(d_model=d, n_layers=layers, n_heads=2,
                                           attention="linear"), io)
    assert linear.state_size(40) == linear.state_size(7) == layers * 2 * 4 * 4


def test_gpt2_parameter_names_and_shapes():
    d, n = 8, MAX_LEN
    core = make_core(n_layers=2, qkv_conv=3)
    shapes = {name: tuple(p.shape) for name, p in core.named_parameters()}
    expected = {"wpe.weight": (n, d), "ln_f.weight": (d,), "ln_f.bias": (d,)}
    for i in range(2):
        expected |= {
            f"h.{i}.ln_1.weight": (d,), f"h.{i}.ln_1.bias": (d,),
            f"h.{i}.attn.c_attn.weight": (3 * d, d), f"h.{i}.attn.c_attn.bias": (3 * d,),
            f"h.{i}.attn.conv1d.weight": (3 * d, 1, 3),
            f"h.{i}.attn.c_proj.weight": (d, d), f"h.{i}.attn.c_proj.bias": (d,),
            f"h.{i}.ln_2.weight": (d,), f"h.{i}.ln_2.bias": (d,),
            f"h.{i}.mlp.c_fc.weight": (4 * d, d), f"h.{i}.mlp.c_fc.bias": (4 * d,),
            f"h.{i}.mlp.c_proj.weight": (d, 4 * d), f"h.{i}.mlp.c_proj.bias": (d,),
        }
    assert shapes == expected
    bare = make_core(n_layers=1, mlp=False, positions=False)
    assert {name for name, _ in bare.named_parameters()} == {
        "h.0.ln_1.weight", "h.0.ln_1.bias", "h.0.attn.c_attn.weight", "h.0.attn.c_attn.bias",
        "h.0.attn.c_proj.weight", "h.0.attn.c_proj.bias", "ln_f.weight", "ln_f.bias"}


def test_gpt2_initialisation():
    """Weights N(0, 0.02), residual projections N(0, 0.02/sqrt(2 L)), zero biases. The sample
    standard deviation of n normal draws has relative standard error 1/sqrt(2n); allow 5 of
    them."""
    torch.manual_seed(0)
    layers, d = 4, 32
    core = Transformer(TransformerConfig(d_model=d, n_layers=layers), IOSpec("tokens", 4, 4, 64))

    def check_std(tensors, std):
        values = torch.cat([t.detach().flatten() for t in tensors])
        assert abs(values.std().item() / std - 1) < 5 / math.sqrt(2 * values.numel())

    check_std([core.wpe.weight], 0.02)
    check_std([b.attn.c_attn.weight for b in core.h] + [b.mlp.c_fc.weight for b in core.h], 0.02)
    check_std([b.attn.c_proj.weight for b in core.h] + [b.mlp.c_proj.weight for b in core.h],
              0.02 / math.sqrt(2 * layers))
    biases = [p for name, p in core.named_parameters()
              if name.endswith("bias") and ".ln_" not in name and not name.startswith("ln_")]
    assert all(torch.count_nonzero(b) == 0 for b in biases)


def test_invalid_configs_and_overlong_sequences_raise():
    io = IOSpec("tokens", 4, 4, 8)
    with pytest.raises(ValueError, match="not divisible by n_heads"):
        Transformer(TransformerConfig(d_model=10, n_heads=3), io)
    with pytest.raises(ValueError, match="softmax, linear"):
        Transformer(TransformerConfig(attention="cosine"), io)
    with pytest.raises(ValueError, match="window"):
        Transformer(TransformerConfig(attention="linear", window=4), io)
    with pytest.raises(ValueError, match="qkv_conv and window"):
        Transformer(TransformerConfig(qkv_conv=-1), io)
    core = Transformer(TransformerConfig(), io)
    with pytest.raises(ValueError, match="exceeds io.max_len=8"):
        core(torch.zeros(1, 9, 16))


@pytest.mark.parametrize("yaml_name", ["transformer", "linear_transformer", "transformer_hmm"])
def test_yaml_lists_every_field_and_builds(yaml_name):
    path = CONF_DIR / f"{yaml_name}.yaml"
    assert path.read_text().startswith("# ")
    values = OmegaConf.to_container(OmegaConf.load(path))
    assert values.pop("family") == "transformer"
    assert set(values) == own_fields(TransformerConfig)
    assert model_families()["transformer"] is Transformer
    model = build_model("transformer", TransformerConfig(**values), IOSpec("vectors", 2, 2, 32))
    assert model(torch.randn(2, 32, 2)).shape == (2, 32, 2)


def test_mlp_width_d_ff():
    """d_ff sets the MLP's hidden width (paper 004 App. B.3: FFN 128 at width 64); 0 keeps
    GPT-2's 4·d_model."""
    io = IOSpec("vectors", 3, 2, 16)
    torch.manual_seed(0)
    default = Transformer(TransformerConfig(d_model=64, n_heads=4, n_layers=2), io)
    narrow = Transformer(TransformerConfig(d_model=64, n_heads=4, n_layers=2, d_ff=128), io)
    assert default.h[0].mlp.c_fc.weight.shape == (256, 64)
    for block in narrow.h:
        assert block.mlp.c_fc.weight.shape == (128, 64) and block.mlp.c_fc.bias.shape == (128,)
        assert block.mlp.c_proj.weight.shape == (64, 128)
    count = lambda core: sum(p.numel() for p in core.parameters())
    # per layer: c_fc (d×h + h) and c_proj (h×d), 128 hidden units fewer
    assert count(default) - count(narrow) == 2 * (64 * 128 + 128 + 128 * 64)
    x = torch.randn(2, 16, 64)
    assert narrow(x).shape == (2, 16, 64)
    with pytest.raises(ValueError, match="d_ff must be >= 0"):
        TransformerConfig(d_ff=-1)


def test_linear_transformer_yaml_matches_paper_004_size():
    """Paper 004 App. B.1: one layer, d = 16, ~4.1K parameters with 2-d observations."""
    values = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "linear_transformer.yaml"))
    values.pop("family")
    model = build_model("transformer", TransformerConfig(**values), IOSpec("vectors", 2, 2, 128))
    assert 3_000 < model.num_parameters() < 5_000


def test_transformer_hmm_yaml_matches_paper_004_b3():
    """Paper 004 App. B.3: embedding 64, one attention layer with 4 heads of dimension 16, a
    feed-forward layer of 128, learned positions; "approximately 82K" parameters. Here, for
    V = 100 characters and T = 512 positions, the count is exactly
    embedding 6,400 + positions 32,768 + attention 16,640 + norms 384 + MLP 16,576 + head
    6,500 = 79,268 (3% under the paper's figure, which does not itemise its count)."""
    values = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "transformer_hmm.yaml"))
    values.pop("family")
    config = TransformerConfig(**values)
    assert (config.d_model, config.n_layers, config.n_heads, config.d_ff) == (64, 1, 4, 128)
    assert config.d_model // config.n_heads == 16 and config.positions and config.mlp
    model = build_model("transformer", config, IOSpec("tokens", 100, 100, 512))
    assert model.num_parameters() == 79_268
    assert abs(model.num_parameters() - 82_000) / 82_000 < 0.05


@pytest.mark.parametrize("kind, overrides", [
    ("tokens", {}),
    ("tokens", {"qkv_conv": 4, "window": 8, "n_heads": 2}),
    ("vectors", {"attention": "linear", "positions": False}),
    ("vectors", {"qkv_conv": 2}),
])
def test_forward_backward(kind, overrides):
    torch.manual_seed(0)
    io = IOSpec(kind, 5 if kind == "tokens" else 3, 5 if kind == "tokens" else 2, 16)
    model = build_model("transformer", TransformerConfig(**overrides), io)
    if kind == "tokens":
        inputs = torch.randint(0, 5, (4, 16))
        log_probs = model.predict(inputs)
        torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(4, 16))
        loss = F.nll_loss(log_probs.flatten(0, 1), torch.randint(0, 5, (64,)))
    else:
        inputs = torch.randn(4, 16, 3)
        loss = (model.predict(inputs) - torch.randn(4, 16, 2)).pow(2).mean()
    loss.backward()
    for name, param in model.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), name
        assert param.grad.abs().sum() > 0, name


@pytest.mark.parametrize("overrides, blind", [
    (dict(positions=False), True),                 # paper 004's linear transformer
    (dict(positions=False, qkv_conv=2), False),    # a width-2 convolution sees the previous token
    (dict(positions=True), False),                 # learned positions tell the tokens apart
])
def test_position_free_linear_attention_sees_its_prefix_as_a_bag(overrides, blind):
    """Why the linear transformers stay at the zero predictor on interleaved regression prompts
    (conf/papers/002/claims.yaml): a position-free layer's output at t depends on token t and
    the *set* of tokens before it, so it cannot pair y_j with the x_j just before it, which is
    what one GD step needs; a convolution over two tokens or positions break the symmetry."""
    core = make_core(n_layers=1, attention="linear", **overrides)
    x = random_inputs(2, 12)
    shuffled = x.clone()
    shuffled[:, :-1] = x[:, torch.randperm(11, generator=torch.Generator().manual_seed(3))]
    last, last_shuffled = core(x)[:, -1], core(shuffled)[:, -1]
    if blind:
        torch.testing.assert_close(last_shuffled, last, **TOL)
    else:
        assert (last_shuffled - last).abs().max() > 1e-6


def test_without_norm_there_is_no_layer_norm():
    core = make_core(norm=False, mlp=True, n_layers=2)
    assert not any(isinstance(m, torch.nn.LayerNorm) for m in core.modules())
    default = make_core()
    assert all(isinstance(m, torch.nn.LayerNorm) for m in (default.ln_f, default.h[0].ln_1))


def test_one_layer_of_bare_linear_self_attention_is_one_gd_step_on_constructed_tokens():
    """von Oswald et al.'s construction, paper 002 Eq. 2, through conf/model/lsa.yaml: the query
    reads x_t, the key the product slot y_{t-1} x_{t-1}, the value is a constant (its bias), so
    the output at t is x_tᵀ Σ_{i<t} y_i x_i / d; the head's weight d η_T / T makes it the gd1
    reference at the final query. With a LayerNorm in the way no weights could do that."""
    f, examples = 3, 6
    task = LinearRegression(LinearRegression.Config(n_features=f, seq_len=examples,
                                                    prompt="tokens", score="last"))
    config = OmegaConf.to_object(OmegaConf.load(CONF_DIR / "lsa.yaml"))
    config.pop("family")
    model = build_model("transformer", TransformerConfig(**config),
                        IOSpec("vectors", task.input_dim, task.output_dim, examples)).double()
    d = config["d_model"]
    gd1 = task.references()["gd1"]
    step = (task.step_sizes(1)[examples - 1] / (examples - 1)).item()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.encoder.weight[:2 * f, :2 * f] = torch.eye(2 * f)  # the token, padded
        attn = model.core.h[0].attn
        attn.c_attn.weight[:f, f:2 * f] = torch.eye(f)  # q = x_t
        attn.c_attn.weight[d:d + f, :f] = torch.eye(f)  # k = y_{t-1} x_{t-1}
        attn.c_attn.bias[2 * d + 2 * f] = 1.0  # v = a constant unit, in a free coordinate
        attn.c_proj.weight[2 * f, 2 * f] = 1.0
        model.decoder.weight[0, 2 * f] = d * step
    batch = task.sample(4, torch.Generator().manual_seed(0))
    got = model(batch.inputs.double())[:, -1]  # tokens are float32, the reference float64
    assert torch.allclose(got, gd1.predict(batch)[:, -1], rtol=1e-6, atol=1e-7)
    assert not torch.allclose(model(batch.inputs.double())[:, -2], gd1.predict(batch)[:, -2],
                              rtol=1e-3)  # a fixed weight matches η_j / j at one context only
