"""Attention-based dependency probes (Clark et al. 2019, §5).

Every word i picks its head among the other words that kept a piece and ROOT, with
p(j | i) ∝ exp(Σ_f F_f(i, j) · w_f(i, j)). The features F:
- attention: α_k(i → j) and α_k(j → i) for every head k (2·L·H features); for j = ROOT they are the
  attention from i to [CLS]+[SEP] and the mean attention of [CLS]/[SEP] to i;
- distance: one-hot of j − i clipped to ±MAX_DISTANCE, plus a ROOT indicator (the baseline).
The weights w_f are constants (`attention-only`), or affine in the words' input embeddings,
w_f(i, j) = A_f·v_i + B_f·v_j + c_f with v_ROOT = 0 (`+ embeddings`); the model's own input word
embeddings, mean over pieces, stand in for the paper's GloVe. Trained with Adam (optax) on the
cross-entropy of the gold head; UAS counts non-punctuation words (UD label `punct` excluded).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bertjax import cli
from bertjax.progress import tqdm
from sieves.wordattn import WordAttention

MAX_DISTANCE = 10
WIDTH_BUCKET = 16
NEG = -1e9


@dataclass(frozen=True)
class ProbeSentence:
    """One sentence's probe inputs; ROOT is candidate W."""

    attention: np.ndarray  # float16 [W, W + 1, 2·L·H]
    embeddings: np.ndarray  # float32 [W, d]
    gold: np.ndarray  # int32 [W]: gold head, W for the root
    candidates: np.ndarray  # bool [W + 1]: words with a piece, and ROOT
    scored: np.ndarray  # bool [W]: words with a piece whose gold head has one too (or is ROOT)
    punct: np.ndarray  # bool [W]


def probe_sentence(word: WordAttention) -> ProbeSentence:
    # `wordattn.iter_word_attention`, which feeds the probes, records all three.
    assert word.to_special is not None and word.from_special is not None and word.embeddings is not None
    forward = np.concatenate([word.maps, word.to_special[..., None]], axis=-1)  # [L, H, W, W+1]
    backward = np.concatenate([np.swapaxes(word.maps, -1, -2), word.from_special[..., None]], axis=-1)
    width = len(word.word_dep)
    heads = forward.shape[0] * forward.shape[1]
    features = np.concatenate([forward.reshape(heads, width, width + 1), backward.reshape(heads, width, width + 1)])
    is_root = word.word_head == np.arange(width)
    gold = np.where(is_root, width, word.word_head).astype(np.int32)
    candidates = np.append(word.present, True)
    return ProbeSentence(
        attention=np.moveaxis(features, 0, -1).astype(np.float16),
        embeddings=word.embeddings.astype(np.float32),
        gold=gold,
        candidates=candidates,
        scored=word.present & candidates[gold],
        punct=np.array([d == "punct" for d in word.word_dep], bool),
    )


def distance_features(width: int) -> np.ndarray:
    """[W, W + 1, 2·MAX_DISTANCE + 2]: one-hot clipped j − i (0 unused, as j ≠ i) and ROOT."""
    offset = np.arange(width)[None, :] - np.arange(width)[:, None]
    bucket = np.clip(offset, -MAX_DISTANCE, MAX_DISTANCE) + MAX_DISTANCE
    features = np.zeros((width, width + 1, 2 * MAX_DISTANCE + 2), np.float32)
    features[np.arange(width)[:, None], np.arange(width)[None, :], bucket] = 1.0
    features[:, width, -1] = 1.0
    return features


def pad(sentences: Sequence[ProbeSentence], kind: str) -> dict[str, np.ndarray]:
    """Stack sentences into arrays padded to a multiple of WIDTH_BUCKET words (ROOT at index W)."""
    width = -(-max(len(s.gold) for s in sentences) // WIDTH_BUCKET) * WIDTH_BUCKET
    n = len(sentences)
    first = sentences[0]
    n_features = first.attention.shape[-1] if kind == "attention" else 2 * MAX_DISTANCE + 2
    arrays: dict[str, np.ndarray] = {
        "features": np.zeros((n, width, width + 1, n_features), np.float16),
        "embeddings": np.zeros((n, width + 1, first.embeddings.shape[-1]), np.float32),
        "gold": np.zeros((n, width), np.int32),
        "allowed": np.zeros((n, width, width + 1), bool),
        "scored": np.zeros((n, width), bool),
        "punct": np.zeros((n, width), bool),
    }
    for b, s in enumerate(sentences):
        w = len(s.gold)
        columns = np.append(np.arange(w), width)  # the sentence's words, then ROOT
        features = s.attention if kind == "attention" else distance_features(w)
        arrays["features"][b, :w, columns] = np.swapaxes(features, 0, 1)
        arrays["embeddings"][b, :w] = s.embeddings
        arrays["gold"][b, :w] = np.where(s.gold == w, width, s.gold)
        allowed = np.zeros(width + 1, bool)
        allowed[columns] = s.candidates
        arrays["allowed"][b, :w] = allowed[None, :] & (np.arange(width + 1)[None, :] != np.arange(w)[:, None])
        arrays["scored"][b, :w] = s.scored
        arrays["punct"][b, :w] = s.punct
    return arrays


def init_params(n_features: int, dim: int, with_embeddings: bool) -> dict[str, jax.Array]:
    params = {"c": jnp.zeros(n_features)}
    if with_embeddings:
        params |= {"a": jnp.zeros((dim, n_features)), "b": jnp.zeros((dim, n_features))}
    return params


def scores(params, features, embeddings, allowed):
    """[B, W, W + 1] head scores; disallowed candidates (self, no piece, padding) get NEG."""
    weights = params["c"][None, None, None, :]
    if "a" in params:
        dependent = embeddings[:, :-1] @ params["a"]  # [B, W, F]
        candidate = embeddings @ params["b"]  # [B, W + 1, F]; ROOT's embedding row is zero
        weights = weights + dependent[:, :, None, :] + candidate[:, None, :, :]
    return jnp.where(allowed, jnp.sum(features.astype(jnp.float32) * weights, axis=-1), NEG)


def loss_fn(params, batch):
    logits = scores(params, batch["features"], batch["embeddings"], batch["allowed"])
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch["gold"])
    scored = batch["scored"].astype(jnp.float32)
    return jnp.sum(losses * scored) / jnp.maximum(scored.sum(), 1.0)


def train_probe(
    train: Sequence[ProbeSentence],
    kind: str,
    with_embeddings: bool,
    *,
    epochs: int,
    batch_size: int,
    learning_rate: float,
    seed: int = 0,
    desc: str = "probe",
) -> dict[str, jax.Array]:
    """Adam on the mean cross-entropy of the gold heads; batches of similar-length sentences."""
    order = sorted(range(len(train)), key=lambda i: len(train[i].gold))
    chunks = [pad([train[i] for i in order[b : b + batch_size]], kind) for b in range(0, len(order), batch_size)]
    first = chunks[0]
    params = init_params(first["features"].shape[-1], first["embeddings"].shape[-1], with_embeddings)
    state = optax.adam(learning_rate).init(params)
    rng = np.random.default_rng(seed)
    for _ in tqdm(range(epochs), desc=desc, unit="epoch"):
        cli.stop_if_terminated()
        for c in rng.permutation(len(chunks)):
            params, state, _ = _adam_step(params, state, chunks[c], learning_rate)
    return params


# Module-level, so that a second probe run in the process compiles nothing new (the rate is
# static: a jit built per call around its optimizer compiled on every call).
@partial(jax.jit, static_argnames="learning_rate")
def _adam_step(params, state, batch, learning_rate: float):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    updates, state = optax.adam(learning_rate).update(grads, state, params)
    return optax.apply_updates(params, updates), state, loss


@jax.jit
def _predict(params, batch):
    return jnp.argmax(scores(params, batch["features"], batch["embeddings"], batch["allowed"]), axis=-1)


def uas(params, sentences: Sequence[ProbeSentence], kind: str, batch_size: int) -> tuple[float, int]:
    """(unlabelled attachment score over scored non-punctuation words, number of such words)."""
    order = sorted(range(len(sentences)), key=lambda i: len(sentences[i].gold))
    correct = total = 0
    for begin in range(0, len(order), batch_size):
        batch = pad([sentences[i] for i in order[begin : begin + batch_size]], kind)
        predicted = np.asarray(_predict(params, batch))
        counted = batch["scored"] & ~batch["punct"]
        correct += int(np.sum((predicted == batch["gold"]) & counted))
        total += int(counted.sum())
    return correct / max(total, 1), total
