"""Every task family's config: the typed, defaulted parameters (conf/task/<name>.yaml sets them)
and their checks, a ValueError naming the field. Kept apart from the families (tasks/<family>.py,
which take their `Config` from here) so that composing and checking a command line imports no
torch: `python -m bench run task.order=x` answers at once. CONFIGS maps a family to its config."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

# --- checks several families share ---------------------------------------------------------------
def check_pool_size(family: str, num_tasks: int, fresh: str) -> None:
    """num_tasks: the size of a pool of training tasks drawn once, or 0 for `fresh` ones."""
    if num_tasks < 0:
        raise ValueError(f"{family} needs num_tasks >= 0 (0: {fresh}), got {num_tasks}")


def check_context_ids(order: int, vocab_size: int) -> None:
    """Context ids S^k (+ 1, a start or switch symbol) are int64."""
    if order * math.log2(vocab_size) >= 62:
        raise ValueError(f"{vocab_size}^{order} contexts do not fit a 64-bit index; "
                         "lower task.order")


# --- markov --------------------------------------------------------------------------------------
MIN_REGION_MASS = 0.01  # prior mass each side of simplex_split must hold (rejection sampling)
SIMPLEX_EVAL = ("complement", "training")  # where the held-out kernels of a split come from


def region_mass(vocab_size: int, beta: float, split: float, draws: int = 1 << 15) -> float:
    """Prior probability that a Dir(β·1) row has P(symbol 1) <= split: the marginal is
    Beta(β, (S-1)β), estimated from `draws` fixed draws (standard error <= 0.003), enough to
    gate the rejection sampler's acceptance rate. (torch only here, when a split is set.)"""
    import torch

    from tasks.distributions import gamma
    generator = torch.Generator().manual_seed(0)
    first = gamma(torch.full((draws,), beta), generator)
    rest = gamma(torch.full((draws,), (vocab_size - 1) * beta), generator)
    return float((first / (first + rest) <= split).double().mean())


@dataclass
class MarkovConfig:
    order: int = 1  # k
    vocab_size: int = 2  # S
    beta: float = 1.0  # Dirichlet concentration of each kernel row
    seq_len: int = 256  # scored positions T (T + 1 tokens are sampled)
    num_tasks: int = 0  # training kernels: a pool of this many drawn once; 0: fresh per sequence
    simplex_split: float = 0.0  # > 0: train on rows with P(1 | ctx) <= it, evaluate on > it (E.5)
    simplex_eval: str = "complement"  # with a split, held-out kernels: complement | training

    def __post_init__(self):
        if self.order < 1 or self.vocab_size < 2 or self.beta <= 0 or self.seq_len < 1:
            raise ValueError("markov needs order >= 1, vocab_size >= 2, beta > 0, seq_len >= 1")
        check_context_ids(self.order, self.vocab_size)
        check_pool_size("markov", self.num_tasks, "a fresh kernel per training sequence")
        if self.simplex_eval not in SIMPLEX_EVAL:
            raise ValueError(f"markov simplex_eval must be one of {', '.join(SIMPLEX_EVAL)}, "
                             f"got '{self.simplex_eval}'")
        if self.simplex_eval != "complement" and not self.simplex_split:
            raise ValueError("markov simplex_eval=training needs a simplex_split (without one "
                             "the held-out set is the training prior's already)")
        if self.simplex_split != 0 and not 0 < self.simplex_split < 1:
            raise ValueError(f"markov simplex_split must be 0 (off) or in (0, 1), got "
                             f"{self.simplex_split}")
        if self.simplex_split:
            below = region_mass(self.vocab_size, self.beta, self.simplex_split)
            if min(below, 1 - below) < MIN_REGION_MASS:
                raise ValueError(
                    f"markov simplex_split={self.simplex_split} leaves "
                    f"{min(below, 1 - below):.2g} of the Dir({self.beta}) prior on one side "
                    f"(P(1 | context) <= split: {below:.3g}); each side needs >= {MIN_REGION_MASS}")


# --- switching_markov --------------------------------------------------------------------------
@dataclass
class SwitchingMarkovConfig:
    order: int = 1  # k
    vocab_size: int = 2  # S Markov symbols; the switch token adds one more
    beta: float = 1.0  # Dirichlet concentration of each kernel row
    p_switch: float = 0.01  # probability that any token is the switch token
    seq_len: int = 256  # scored positions T (T + 1 tokens are sampled)

    def __post_init__(self):
        if self.order < 1 or self.vocab_size < 2 or self.beta <= 0 or self.seq_len < 1:
            raise ValueError("switching_markov needs order >= 1, vocab_size >= 2, beta > 0, "
                             "seq_len >= 1")
        check_context_ids(self.order, self.vocab_size)
        if not 0 <= self.p_switch < 1:
            raise ValueError("switching_markov needs 0 <= p_switch < 1")


# --- hmm ---------------------------------------------------------------------------------------
@dataclass
class HMMConfig:
    num_states: int = 50  # H hidden topics
    vocab_size: int = 100  # V characters
    transition_concentration: float = 0.1  # Dirichlet concentration of each row of A
    emission_concentration: float = 0.05  # Dirichlet concentration of each row of C
    seq_len: int = 256  # scored positions T (T + 1 tokens are sampled; the paper uses 512)
    num_tasks: int = 0  # training HMMs: a pool of this many (the paper: 50,000); 0: fresh

    def __post_init__(self):
        if self.num_states < 1 or self.vocab_size < 2 or self.seq_len < 1:
            raise ValueError("hmm needs num_states >= 1, vocab_size >= 2, seq_len >= 1")
        check_pool_size("hmm", self.num_tasks, "a fresh HMM per training sequence")
        if self.transition_concentration <= 0 or self.emission_concentration <= 0:
            raise ValueError("hmm needs positive Dirichlet concentrations")


# --- lgssm -------------------------------------------------------------------------------------
@dataclass
class LGSSMConfig:
    seq_len: int = 128  # scored positions T (T + 1 observations are sampled); paper B.1: 128
    state_dim: int = 4  # d, latent z
    obs_dim: int = 2  # m, observed x
    eig_min: float = 0.7  # eigenvalues of A ~ U[eig_min, eig_max]
    eig_max: float = 0.95
    state_noise_min: float = 0.1  # eigenvalues of Q log-uniform in (min, max)
    state_noise_max: float = 1.0
    obs_noise_min: float = 0.05  # eigenvalues of R log-uniform in (min, max)
    obs_noise_max: float = 0.5
    erm_ridge: float = 0.0  # λ of the erm baseline (0: pooled mean)
    num_tasks: int = 0  # training systems: a pool of this many (paper 004 Fig. 2 left); 0: fresh
    bayes_particles: int = 512  # SMC particles per sequence in each run of bayes; 0: no bayes
    bayes_moves: int = 2  # Metropolis-Hastings moves of every particle after each resampling

    def __post_init__(self):
        if self.seq_len < 1 or self.state_dim < 1 or self.obs_dim < 1:
            raise ValueError("lgssm needs seq_len, state_dim, obs_dim >= 1")
        check_pool_size("lgssm", self.num_tasks, "a fresh system per training sequence")
        if not 0 <= self.eig_min <= self.eig_max < 1:
            raise ValueError("lgssm needs 0 <= eig_min <= eig_max < 1 (a stable A)")
        if not (0 < self.state_noise_min <= self.state_noise_max
                and 0 < self.obs_noise_min <= self.obs_noise_max):
            raise ValueError("lgssm needs 0 < *_noise_min <= *_noise_max")
        if self.erm_ridge < 0:
            raise ValueError("lgssm needs erm_ridge >= 0")
        if self.bayes_particles == 1 or self.bayes_particles < 0 or self.bayes_moves < 0:
            raise ValueError("lgssm needs bayes_particles = 0 (no bayes reference) or >= 2, and "
                             "bayes_moves >= 0")
        if self.bayes_particles > 65536 or self.bayes_moves > 1000:  # per sequence and position
            raise ValueError(f"lgssm needs bayes_particles <= 65536 and bayes_moves <= 1000, got "
                             f"{self.bayes_particles} and {self.bayes_moves}")


# --- lgssm_colored -------------------------------------------------------------------------------
USE_TRAINING_PRIOR = -1.0  # eval_rho value: evaluate on ρ drawn from the training prior
KNOWN_SIGNAL_DECAY = -1.0  # signal_decay_max value: a = signal_decay, not drawn
MAX_NODES = 4096  # quadrature nodes: per axis, and of the (a, ρ) product


@dataclass
class LGSSMColoredConfig:
    seq_len: int = 256  # scored positions T (T + 1 observations are sampled)
    signal_decay: float = 0.9  # a
    rho_min: float = 0.9  # training prior: ρ ~ U(rho_min, rho_max)
    rho_max: float = 0.99
    eval_rho: float = 0.95  # ρ of the held-out set; -1: draw it from the training prior
    grid_size: int = 64  # Gauss-Legendre nodes of the Bayes quadrature over ρ
    erm_ridge: float = 0.0  # λ of the erm baseline (0: pooled mean)
    # a ~ U(signal_decay, signal_decay_max) per sequence; -1: a = signal_decay, known (paper)
    signal_decay_max: float = -1.0
    signal_grid_size: int = 16  # Gauss-Legendre nodes over a (used only when a is unknown)

    def __post_init__(self):
        if self.seq_len < 1 or self.grid_size < 1:
            raise ValueError("lgssm_colored needs seq_len >= 1 and grid_size >= 1")
        if self.grid_size > MAX_NODES:  # Gauss-Legendre nodes come from an n x n eigenproblem
            raise ValueError(f"lgssm_colored grid_size must be at most {MAX_NODES}, got "
                             f"{self.grid_size}")
        if not 0 <= self.signal_decay < 1:
            raise ValueError("lgssm_colored needs 0 <= signal_decay < 1")
        if not 0 < self.rho_min <= self.rho_max < 1:
            raise ValueError("lgssm_colored needs 0 < rho_min <= rho_max < 1")
        if self.eval_rho != USE_TRAINING_PRIOR and not 0 < self.eval_rho < 1:
            raise ValueError("lgssm_colored needs eval_rho in (0, 1), or -1 for the prior")
        if self.erm_ridge < 0:
            raise ValueError("lgssm_colored needs erm_ridge >= 0")
        if self.signal_decay_max != KNOWN_SIGNAL_DECAY and not (
                self.signal_decay <= self.signal_decay_max < 1):
            raise ValueError("lgssm_colored needs signal_decay <= signal_decay_max < 1, or "
                             "signal_decay_max = -1 (a known)")
        if not 1 <= self.signal_grid_size <= MAX_NODES:
            raise ValueError(f"lgssm_colored needs 1 <= signal_grid_size <= {MAX_NODES}, got "
                             f"{self.signal_grid_size}")
        if self.signal_decay_unknown and self.grid_size * self.signal_grid_size > MAX_NODES:
            # one Kalman filter per (a, ρ) node: the paper task's largest grid bounds the work
            raise ValueError(f"lgssm_colored needs grid_size * signal_grid_size <= {MAX_NODES}, "
                             f"got {self.grid_size} * {self.signal_grid_size}")

    @property
    def signal_decay_unknown(self) -> bool:
        """Whether a is drawn per sequence (a prior of positive width)."""
        return self.signal_decay_max > self.signal_decay


# --- linreg, linreg_tokens, nonlinreg ------------------------------------------------------------
SCORES = ("all", "last")  # values of `score`: every query, or only the final one (paper 002)
MAX_GD_STEPS = 1000  # K of a gd<K> reference: its response is iterated K times, its step tuned


def check_score(family: str, score: str) -> None:
    if score not in SCORES:
        raise ValueError(f"{family} score must be one of {', '.join(SCORES)}, got '{score}'")


@dataclass
class LinRegConfig:
    seq_len: int = 32  # interleaved: 2 × examples; tokens: examples
    n_features: int = 5  # f
    n_outputs: int = 1  # N; the paper's N-D regression uses N = f
    noise_std: float = 0.0  # σ; the paper's targets are noiseless
    prompt: str = "interleaved"  # "interleaved" | "tokens"
    gd_steps: list[int] = field(default_factory=lambda: [1, 2, 5])
    score: str = "all"  # "all": every query is scored; "last": only the final one (paper)
    eval_x_scale: float = 1.0  # held-out x ~ U(-α, α)^f (paper Fig. 1D/2D); 1: in distribution
    num_tasks: int = 0  # training weights: a pool of this many drawn once; 0: fresh per prompt

    def __post_init__(self):
        check_score("linreg", self.score)
        check_pool_size("linreg", self.num_tasks, "fresh weights per training prompt")
        if not self.eval_x_scale > 0:
            raise ValueError(f"linreg eval_x_scale must be > 0, got {self.eval_x_scale}")
        if self.prompt not in ("interleaved", "tokens"):
            raise ValueError(f"prompt must be 'interleaved' or 'tokens', got '{self.prompt}'")
        if self.seq_len < 1 or self.n_features < 1 or self.n_outputs < 1:
            raise ValueError("linreg needs seq_len, n_features, n_outputs >= 1")
        if self.noise_std < 0:
            raise ValueError("linreg needs noise_std >= 0")
        if any(k < 1 for k in self.gd_steps):
            raise ValueError("linreg gd_steps must be positive step counts")
        if any(k > MAX_GD_STEPS for k in self.gd_steps):  # the GD references run step by step
            raise ValueError(f"linreg gd_steps must be at most {MAX_GD_STEPS}, got "
                             f"{max(self.gd_steps)}")


@dataclass
class NonLinRegConfig:
    seq_len: int = 20  # 2 × examples
    noise_std: float = 0.1  # σ > 0: the Bayes quadrature needs a likelihood with a density
    amplitude_min: float = 0.1
    amplitude_max: float = 5.0
    x_max: float = 5.0  # x ~ U[-x_max, x_max]
    grid_phase: int = 512  # midpoint nodes in φ (the integral over a is exact)
    knn_k: int = 1  # 1 beats 2 and 3 at 10 examples (sparse x)
    score: str = "all"  # "all": every query is scored; "last": only the final one (paper)

    def __post_init__(self):
        check_score("nonlinreg", self.score)
        if self.seq_len < 1 or self.grid_phase < 1 or self.knn_k < 1:
            raise ValueError("nonlinreg needs seq_len, grid_phase and knn_k >= 1")
        if self.grid_phase > 65536:  # a likelihood per node, position and sequence
            raise ValueError(f"nonlinreg grid_phase must be at most 65536, got "
                             f"{self.grid_phase}")
        if self.noise_std <= 0:
            raise ValueError("nonlinreg needs noise_std > 0 (the Bayes posterior needs a "
                             "likelihood with a density)")
        if not 0 <= self.amplitude_min < self.amplitude_max or self.x_max <= 0:
            raise ValueError("nonlinreg needs 0 <= amplitude_min < amplitude_max, x_max > 0")


# --- text -----------------------------------------------------------------------------------------
PYDOC = "pydoc-topics"  # real English text that ships with Python: always available offline
CORPUS_NAMES = ("wikitext-103", "wikitext-2", "pg19")  # tasks/corpora/sources.py CORPORA's keys


@dataclass
class TextConfig:
    corpus: str = "wikitext-103"  # wikitext-103 | wikitext-2 | pg19 | pydoc-topics | a label
    data_dir: str = "data/wikitext-103"  # local files (read first); "" = the hub only
    hub_name: str = ""  # overrides the corpus's hub dataset ("" = its default)
    hub_config: str = ""
    text_field: str = "text"  # the column of parquet/jsonl files that holds the text
    sample_by: str = ""  # document | line | paragraph: what a row of a .txt is ("" = the corpus's)
    tokenizer: str = "gpt2"  # gpt2 | byte | bpe
    tokenizer_file: str = ""  # gpt2: a local tokenizer.json ("" = the hub's)
    bpe_vocab_size: int = 8192  # bpe: trained on the training split, cached beside the tokens
    cache_dir: str = ""  # token cache ("" = <data_dir>/cache, or ~/.cache/icl-bench/text)
    seq_len: int = 256
    eval_split: str = "validation"  # validation | test
    eval_stride: int = 0  # 0 = seq_len: non-overlapping windows; smaller: strided perplexity
    eval_windows: int = 0  # 0 = the whole split; else that many windows evenly spaced over it
    cache_lambda: float = 0.1  # weight of the in-context counts in the unigram-cache baseline

    def __post_init__(self):
        if self.tokenizer not in ("gpt2", "byte", "bpe"):
            raise ValueError(f"tokenizer must be gpt2, byte or bpe, got '{self.tokenizer}'")
        if self.sample_by not in ("", "document", "line", "paragraph"):
            raise ValueError(f"sample_by must be document, line or paragraph, got "
                             f"'{self.sample_by}'")
        if self.eval_split not in ("validation", "test"):
            raise ValueError(f"eval_split must be validation or test, got '{self.eval_split}'")
        if self.seq_len < 1 or self.eval_stride < 0 or self.eval_windows < 0:
            raise ValueError("seq_len must be >= 1, eval_stride and eval_windows >= 0")
        if self.eval_stride > self.seq_len:
            raise ValueError(f"eval_stride={self.eval_stride} exceeds seq_len={self.seq_len}")
        if self.tokenizer == "bpe" and not 257 <= self.bpe_vocab_size <= 1 << 20:
            raise ValueError(f"bpe_vocab_size must be in [257, 2^20], got {self.bpe_vocab_size}")
        if not 0 <= self.cache_lambda < 1:
            raise ValueError(f"cache_lambda must be in [0, 1), got {self.cache_lambda}")
        if not (self.data_dir or self.hub_name or self.corpus in CORPUS_NAMES
                or self.corpus == PYDOC):
            raise ValueError(f"corpus '{self.corpus}' needs a data_dir (or a hub_name)")


CONFIGS: dict[str, type] = {
    "markov": MarkovConfig, "switching_markov": SwitchingMarkovConfig, "hmm": HMMConfig,
    "lgssm": LGSSMConfig, "lgssm_colored": LGSSMColoredConfig, "linreg": LinRegConfig,
    "nonlinreg": NonLinRegConfig, "text": TextConfig}
