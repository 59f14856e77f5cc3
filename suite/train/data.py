"""The training data: a deterministic synthetic corpus (a sparse bigram Markov chain with a Zipf
prior over successors) in the instruction-tuning layout (the prompt's targets ignored)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

IGNORE_INDEX = -100


@dataclass
class MarkovChain:
    succ: torch.Tensor      # (V, k) successor token ids of each token
    cum_prob: torch.Tensor  # (V, k) cumulative transition probabilities
    start: torch.Tensor     # (V,) distribution of the first token (the Zipf prior)


def zipf_prior(vocab: int, exponent: float, gen: torch.Generator) -> torch.Tensor:
    """Zipf(exponent) probabilities over the vocabulary; ranks are a random permutation of the
    ids (token ids do not follow frequency)."""
    p = torch.arange(1, vocab + 1, dtype=torch.float64).pow(-exponent)
    p = p / p.sum()
    return p[torch.argsort(torch.randperm(vocab, generator=gen))]


def markov_chain(vocab: int, *, branching: int = 8, zipf: float = 1.1, seed: int = 0) -> MarkovChain:
    """Each token has ``branching`` successors drawn from the Zipf prior, with peaked random
    weights: the marginal token frequencies follow the prior (E[P(j | s)] = prior_j), and the
    next token is predictable from the current one (entropy well below log V)."""
    if vocab < 2 or branching < 1:
        raise ValueError(f"markov_chain: need vocab >= 2 and branching >= 1, got {vocab}, {branching}")
    gen = torch.Generator().manual_seed(seed)
    prior = zipf_prior(vocab, zipf, gen)
    succ = torch.multinomial(prior, vocab * branching, replacement=True, generator=gen)
    weights = torch.rand(vocab, branching, generator=gen, dtype=torch.float64).pow(4)  # peaked
    prob = weights / weights.sum(1, keepdim=True)
    cum = prob.cumsum(1)
    cum[:, -1] = 1.0
    return MarkovChain(succ.view(vocab, branching), cum, prior)


def sample_tokens(chain: MarkovChain, n_seq: int, length: int, *, seed: int,
                  device="cpu") -> torch.Tensor:
    """(n_seq, length) int64 token ids on ``device``. The random numbers come from a CPU
    generator seeded with ``seed`` and the walk only compares them with the chain's
    probabilities, so the tokens are the same on every device."""
    gen = torch.Generator().manual_seed(seed)
    first = torch.multinomial(chain.start, n_seq, replacement=True, generator=gen)
    u = torch.rand(n_seq, length, generator=gen, dtype=torch.float64).to(device)
    succ, cum = chain.succ.to(device), chain.cum_prob.to(device)
    out = torch.empty(n_seq, length, dtype=torch.long, device=device)
    cur = first.to(device)
    out[:, 0] = cur
    for t in range(1, length):  # one vectorised step of every sequence's walk
        j = (cum[cur] < u[:, t:t + 1]).sum(1).clamp_max(succ.shape[1] - 1)
        cur = succ[cur, j]
        out[:, t] = cur
    return out


def instruction_batch(tokens: torch.Tensor, *, prompt_frac=(0.5, 0.7), seed: int,
                      ignore_index: int = IGNORE_INDEX):
    """Inputs and next-token targets from (B, T+1) tokens; the first prompt_frac of every
    sequence (uniform in the range, per sequence) is prompt, labelled ``ignore_index``."""
    lo, hi = prompt_frac
    if not 0 <= lo <= hi < 1:
        raise ValueError(f"prompt_frac must satisfy 0 <= lo <= hi < 1, got {prompt_frac}")
    idx, targets = tokens[:, :-1], tokens[:, 1:].clone()
    b, t = idx.shape
    gen = torch.Generator().manual_seed(seed)
    prompt_len = ((lo + (hi - lo) * torch.rand(b, generator=gen)) * t).long().to(tokens.device)
    positions = torch.arange(t, device=tokens.device)
    targets[positions.unsqueeze(0) < prompt_len.unsqueeze(1)] = ignore_index
    return idx.contiguous(), targets

