"""Tied input/output embeddings of the shared backbone (`model.tie_embeddings=true`, a field every
family's config gets from models/backbone.py): the head's weight IS the embedding's Parameter,
the head has no bias, the matrix is counted and optimised once and gets the gradient of both its
uses; it stays tied through dtype conversion, autocast, torch.save/load of the state dict (also
with assign=True, and from a copy holding only one of the two keys) and a Lightning checkpoint
resumed by the runner."""
from __future__ import annotations

import dataclasses
import io as bytes_io
import json
import pickle

import pytest
import torch
import torch.nn.functional as F

from bench.cli.main import main
from bench.training.checks import compose_checked
from bench.config import ConfigError, compose
from models import IOSpec, build_model, model_families
from models.mamba import Mamba, MambaConfig

VOCAB = 7
TOKENS = IOSpec("tokens", VOCAB, VOCAB, 16)


def tied_and_untied(family: str, seed: int = 0, **fields):
    """A tied model and an untied one with the same core weights, whose head weight equals the
    tied model's embedding and whose head bias is zero: the same function of the inputs."""
    config = model_families()[family].Config(**fields, tie_embeddings=True)
    torch.manual_seed(seed)
    tied = build_model(family, config, TOKENS)
    untied = build_model(family, dataclasses.replace(config, tie_embeddings=False), TOKENS)
    state = tied.state_dict()
    state["decoder.bias"] = torch.zeros(VOCAB)
    untied.load_state_dict(state)
    return tied, untied


# --- tying, for every architecture with the backbone's adapters ------------------------------

BACKBONE_FAMILIES = [f for f, cls in model_families().items() if not cls.owns_io]


def test_every_family_config_accepts_tie_embeddings():
    for family, cls in model_families().items():
        names = [f.name for f in dataclasses.fields(cls.Config)]
        assert names[-1] == "tie_embeddings", family  # appended: positional order unchanged
        assert cls.Config().tie_embeddings is False
    # the config as written is a base of the family's Config: its checks still run
    assert issubclass(Mamba.Config, MambaConfig)
    with pytest.raises(ValueError, match="n_layers"):
        Mamba.Config(n_layers=0, tie_embeddings=True)
    # picklable (DDP spawn, checkpoints): pickle finds the class as Mamba.Config
    config = Mamba.Config(d_model=48, headdim=16, tie_embeddings=True)
    assert pickle.loads(pickle.dumps(config)) == config
    # a config of the class as written builds an untied model
    assert not build_model("mamba", MambaConfig(), TOKENS).tied


@pytest.mark.parametrize("family", BACKBONE_FAMILIES)
def test_tied_head_is_the_embedding_and_gets_both_gradients(family):
    tied, untied = tied_and_untied(family)
    assert tied.decoder.weight is tied.encoder.weight and tied.decoder.bias is None
    shared = tied.encoder.weight
    assert sum(p is shared for p in tied.parameters()) == 1
    # counted once: the untied model has one more V×d matrix and a V bias
    d_model = shared.shape[1]
    assert untied.num_parameters() - tied.num_parameters() == VOCAB * d_model + VOCAB
    assert len(list(tied.parameters())) == len(list(untied.parameters())) - 2
    # the same function as the untied twin, and d loss / d W = embedding part + head part
    inputs = torch.randint(0, VOCAB, (3, 12), generator=torch.Generator().manual_seed(1))
    for model in (tied, untied):
        loss = F.cross_entropy(model(inputs).transpose(1, 2), inputs.roll(-1, 1))
        loss.backward()
    torch.testing.assert_close(tied(inputs), untied(inputs))
    torch.testing.assert_close(shared.grad,
                               untied.encoder.weight.grad + untied.decoder.weight.grad)
    # an optimiser step moves the one matrix, and the head follows
    torch.optim.SGD(tied.parameters(), lr=0.1).step()
    assert tied.decoder.weight is tied.encoder.weight


def test_tied_matrix_starts_like_gpt2():
    """N(0, 0.02²), as GPT-2 and mamba_ssm initialise their (tied) embedding; not PyTorch's
    N(0, 1), which through a tied head would give initial logits ~sqrt(d_model) wide."""
    torch.manual_seed(0)
    model = build_model("mamba", Mamba.Config(d_model=64, tie_embeddings=True),
                        IOSpec("tokens", 1000, 1000, 16))
    assert abs(model.encoder.weight.std().item() - 0.02) < 0.001
    logits = model(torch.randint(0, 1000, (2, 16)))
    assert logits.std() < 1.0


def test_tying_needs_a_token_task_with_one_vocabulary():
    config = Mamba.Config(tie_embeddings=True)
    with pytest.raises(ValueError, match="needs a tokens task with input_dim == output_dim, got a "
                                         "vectors task with input_dim=3, output_dim=2"):
        build_model("mamba", config, IOSpec("vectors", 3, 2, 16))
    with pytest.raises(ValueError, match="got a tokens task with input_dim=5, output_dim=4"):
        build_model("mamba", config, IOSpec("tokens", 5, 4, 16))
    with pytest.raises(ValueError, match="the mambazero core maps inputs to predictions itself"):
        build_model("mambazero", model_families()["mambazero"].Config(tie_embeddings=True),
                    TOKENS)


def test_config_errors_about_tying_are_one_line():
    with pytest.raises(ConfigError) as error:
        compose_checked(["model=transformer", "model.tie_embeddings=true", "task=lgssm"])
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("model transformer cannot be built for task lgssm: "
                              "tie_embeddings=true")
    with pytest.raises(ConfigError, match="model.tie_embeddings: invalid value 2"):
        compose(["model.tie_embeddings=2"])
    with pytest.raises(ConfigError, match="model.tie_embeddings: invalid value maybe"):
        compose(["model.tie_embeddings=maybe"])
    assert compose(["model.tie_embeddings=true"]).model.tie_embeddings is True
    assert compose(["model=lstm", "model.tie_embeddings=yes"]).model.tie_embeddings is True


def test_dtype_conversion_and_autocast_keep_the_tie():
    tied, _ = tied_and_untied("transformer", d_model=16)
    for dtype in (torch.float64, torch.bfloat16, torch.float32):
        tied = tied.to(dtype)
        assert tied.decoder.weight is tied.encoder.weight and tied.encoder.weight.dtype == dtype
    inputs = torch.randint(0, VOCAB, (2, 10))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = tied(inputs)
    assert logits.dtype == torch.bfloat16
    F.cross_entropy(logits.float().transpose(1, 2), inputs).backward()
    grad = tied.encoder.weight.grad
    assert grad is not None and grad.dtype == torch.float32 and torch.isfinite(grad).all()


# --- state dicts ------------------------------------------------------------------------------

def saved_and_loaded(state: dict) -> dict:
    buffer = bytes_io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def test_state_dict_round_trip_keeps_the_tie():
    tied, _ = tied_and_untied("mamba", seed=0, d_model=16)
    state = tied.state_dict()
    # both keys, one storage: torch.save writes the matrix once
    assert state["encoder.weight"].data_ptr() == state["decoder.weight"].data_ptr()
    loaded = saved_and_loaded(state)
    assert (loaded["encoder.weight"].untyped_storage().data_ptr()
            == loaded["decoder.weight"].untyped_storage().data_ptr())
    inputs = torch.randint(0, VOCAB, (2, 9))
    for assign in (False, True):
        fresh, _ = tied_and_untied("mamba", seed=1, d_model=16)
        assert not torch.equal(fresh.encoder.weight, tied.encoder.weight)
        fresh.load_state_dict(saved_and_loaded(state), assign=assign)
        assert fresh.decoder.weight is fresh.encoder.weight, f"assign={assign}"
        assert sum(1 for _ in fresh.parameters()) == sum(1 for _ in tied.parameters())
        torch.testing.assert_close(fresh(inputs), tied(inputs), rtol=0, atol=0)
        # still one matrix: a step changes the head with the embedding
        with torch.no_grad():
            fresh.encoder.weight.add_(1.0)
        assert torch.equal(fresh.decoder.weight, fresh.encoder.weight)


def test_a_state_dict_with_one_of_the_tied_keys_loads():
    tied, _ = tied_and_untied("transformer", seed=0, d_model=16)
    for dropped in ("decoder.weight", "encoder.weight"):
        state = {k: v for k, v in tied.state_dict().items() if k != dropped}
        fresh, _ = tied_and_untied("transformer", seed=1, d_model=16)
        fresh.load_state_dict(state)
        assert fresh.decoder.weight is fresh.encoder.weight
        assert torch.equal(fresh.encoder.weight, tied.encoder.weight)


def test_an_untied_state_dict_is_refused_by_a_tied_model():
    _, untied = tied_and_untied("lstm", seed=0)
    state = untied.state_dict()
    with torch.no_grad():
        state["decoder.weight"] += 1.0
    del state["decoder.bias"]
    tied, _ = tied_and_untied("lstm", seed=1)
    with pytest.raises(RuntimeError, match="encoder.weight and decoder.weight differ, but this "
                                           "model ties them"):
        tied.load_state_dict(state)


# --- Lightning checkpoints, through the runner ------------------------------------------------

SMALL_LM = ["model=mamba", "model.tie_embeddings=true", "model.d_model=32", "model.n_layers=2",
            "model.headdim=16", "model.mlp=false", "task=markov", "task.vocab_size=5",
            "task.seq_len=24", "trainer.warmup_steps=2",
            "trainer.eval_sequences=32", "trainer.bootstrap=200", "trainer.progress=false",
            "trainer.log_every=1"]


def test_a_lightning_checkpoint_keeps_the_tie_and_resumes_exactly(tmp_path, capsys):
    first = tmp_path / "first"
    assert main(["run", *SMALL_LM, "trainer.max_steps=6", "trainer.checkpoint_every=3",
                 f"out_dir={first}"]) == 0
    reference = json.loads(next(first.glob("*.json")).read_text())
    assert reference["model"]["config"]["tie_embeddings"] is True
    checkpoint = next(first.glob("checkpoints/*/*step=3.ckpt"))
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)["state_dict"]
    encoder, decoder = state["model.encoder.weight"], state["model.decoder.weight"]
    assert encoder.untyped_storage().data_ptr() == decoder.untyped_storage().data_ptr()
    assert "model.decoder.bias" not in state
    # the record counts the shared matrix once
    counted = sum(v.numel() for k, v in state.items() if k != "model.decoder.weight")
    assert reference["params"] == counted

    second = tmp_path / "second"
    assert main(["run", *SMALL_LM, "trainer.max_steps=6", f"resume={checkpoint}",
                 f"out_dir={second}"]) == 0
    capsys.readouterr()
    resumed = json.loads(next(second.glob("*.json")).read_text())
    assert resumed["status"] == "ok" and resumed["train"]["steps"] == 6
    # same batches, same weights: had the resumed head come loose from the embedding, steps 3-5
    # would train a different model
    curve, expected = resumed["train"]["loss_curve"], reference["train"]["loss_curve"]
    assert [s for s, _ in curve] == list(range(6))
    assert [v for _, v in curve] == pytest.approx([v for _, v in expected], rel=1e-5)
    assert resumed["metrics"]["loss"]["model"] == pytest.approx(
        reference["metrics"]["loss"]["model"], rel=1e-5)
