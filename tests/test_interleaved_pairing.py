"""Why a position-free linear transformer stays at the zero predictor on interleaved prompts
(paper 002 Fig. 4C; conf/papers/002/claims.yaml, the Fig. 4C rows): with one layer it cannot pair
x_j with y_j at all, and with two the zero predictor is a saddle. The paper's constructed tokens
[x_j y_j, x_{j+1}] (suite paper002_tokens) carry the pairs in the token itself."""
import torch

from bench.config import compose
from bench.training.train import build

INTERLEAVED = ["task=linreg", "task.n_features=10", "task.seq_len=20", "task.score=last",
               "model=linear_transformer", "model.d_model=32"]


def prompts(task, n: int = 256):
    batch = task.sample(n, torch.Generator().manual_seed(0))
    query = int(batch.loss_mask[0].nonzero().flatten()[-1])  # the final x-token, scored
    return batch, query


def shuffled_pairs(inputs: torch.Tensor, query: int) -> torch.Tensor:
    """The prompts with their context y-tokens moved among themselves: the same tokens, each y
    now beside another example's x."""
    y_positions = torch.arange(1, query, 2)
    order = y_positions[torch.randperm(len(y_positions), generator=torch.Generator().manual_seed(1))]
    out = inputs.clone()
    out[:, y_positions] = inputs[:, order]
    return out


def test_one_layer_without_positions_cannot_pair_x_with_y():
    """At the final query a 1-layer causal linear attention without positions sums a function of
    (token, query) over the earlier tokens: moving the y-tokens among the examples leaves its
    prediction unchanged for any weights, while one GD step's prediction changes. So it cannot
    represent GD on interleaved prompts, and 'does not reach GD' holds whatever it learns."""
    task, model = build(compose(INTERLEAVED))
    with torch.no_grad():
        for parameter in model.parameters():  # any weights, not only the initial ones
            parameter.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(2))
    batch, query = prompts(task)
    moved = shuffled_pairs(batch.inputs, query)
    with torch.no_grad():
        prediction = model(batch.inputs)[:, query]
        same = prediction - model(moved)[:, query]
    assert prediction.std() > 0.1  # not a constant: it reads the prompt
    gd_moves = task.gd1_on_prompts(batch.inputs)[:, query] - task.gd1_on_prompts(moved)[:, query]
    assert same.abs().max() < 1e-4
    assert gd_moves.abs().mean() > 0.3


def test_two_layers_can_pair_and_the_zero_predictor_is_a_saddle():
    """With a second layer the prediction does depend on the pairing (layer 1's outputs differ by
    prefix), and a feature two layers can form, x_q · Σ_j y_j C_j with C_j = Σ_{i<=j} x_i, alone
    beats the zero predictor (least squares on it: 2.85 against E y² = 3.38; one GD step 1.75):
    the zero predictor the trained models sit at is not a minimum, only a plateau."""
    config = compose([*INTERLEAVED, "model.n_layers=2"])
    task, model = build(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(2))
    batch, query = prompts(task)
    with torch.no_grad():
        moved = model(batch.inputs)[:, query] - model(shuffled_pairs(batch.inputs, query))[:, query]
    assert moved.abs().mean() > 1e-3

    big, query = prompts(task, 20000)
    f = task.config.n_features
    x, y = big.inputs[:, 0:query:2, :f], big.inputs[:, 1:query:2, f:f + 1]
    x_query, target = big.inputs[:, query, :f], big.targets[:, query, 0]
    feature = (x_query * (y * x.cumsum(1)).sum(1)).sum(-1)
    scale = (feature * target).sum() / (feature * feature).sum()
    saddle = float(((target - scale * feature) ** 2).mean())
    zero = float((target ** 2).mean())
    gd = float(((target - task.gd1_on_prompts(big.inputs)[:, query, 0]) ** 2).mean())
    assert gd < saddle < 0.9 * zero
