"""The authors' variants of Pande et al.'s scores (docs/fidelity.md) against hand computations on
planted attention maps: `--block-score entropy` and `--syntactic-average arcs`."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.stats import entropy as scipy_entropy

from analysis import roles as roles_cli
from analysis.heads import config as roles_config
from analysis.heads import scoring
from bertjax.errors import UserError
from sieves.align import EncodedSequence
from sieves.builders import SieveOptions, arc_row_weights, build_batch
from sieves.kernel import sieve_scores

CLS, SEP = 101, 102
F32 = 2.0**-24


def make_seq(types, word_ids=None, deps=(), heads=()) -> EncodedSequence:
    n = len(types)
    is_sep = np.array([t == n - 1 or types[t + 1] != types[t] for t in range(n)])
    is_cls = np.arange(n) == 0
    return EncodedSequence(
        input_ids=np.where(is_cls, CLS, np.where(is_sep, SEP, 1000)).astype(np.int32),
        token_type_ids=np.asarray(types, dtype=np.int32),
        special=is_cls | is_sep,
        is_cls=is_cls,
        is_sep=is_sep,
        word_ids=np.asarray(word_ids if word_ids is not None else [-1] * n, dtype=np.int32),
        word_dep=tuple(deps),
        word_head=np.asarray(heads, dtype=np.int32),
        num_segments=len(set(types)),
        index=0,
    )


# [CLS] a1 a2 a3 [SEP] b1 b2 b3 b4 [SEP]: |A| = 3, |B| = 4, n = 10.
PAIR = make_seq([0] * 5 + [1] * 5)


def perfect_block_head(seq: EncodedSequence) -> np.ndarray:
    """Each row attends uniformly to the non-special tokens of its own segment (token type)."""
    same = (seq.token_type_ids[:, None] == seq.token_type_ids[None, :]) & ~seq.special[None, :]
    return same / same.sum(-1, keepdims=True)


def block_scores(attention: np.ndarray, seq: EncodedSequence, entropy: bool, dtype) -> float:
    rows, sieves = build_batch([seq], ["block"], SieveOptions(), seq.length)
    scores, _ = sieve_scores(
        jnp.asarray(attention[None, None, None], dtype), np.ones((1, seq.length), bool), rows, sieves,
        entropy_roles=(entropy,),
    )  # fmt: skip
    return float(scores[0, 0, 0, 0])


def test_entropy_block_score_of_a_perfect_block_head_by_hand():
    attention = perfect_block_head(PAIR)
    # Rows of segment A ([CLS], a1..a3, first [SEP]) spread over 3 keys: β = 10/3, H = ln 3; the
    # five rows of segment B spread over 4: β = 10/4, H = ln 4.
    paper = (5 * 10 / 3 + 5 * 10 / 4) / 10
    authors = (5 * 10 / 3 * math.log(3) + 5 * 10 / 4 * math.log(4)) / 10
    assert paper == pytest.approx(2 + 2 / 3 + 1 / 4)  # the README's 2 + 2/|A| + 1/|B| < τ = 3
    assert authors > 3  # ... while the entropy score of the same head clears τ = 3
    with jax.enable_x64(True):
        # float64: ~n² = 100 terms of 2⁻⁵³ each, far below 1e-12.
        assert block_scores(attention, PAIR, False, jnp.float64) == pytest.approx(paper, rel=1e-12, abs=0)
        assert block_scores(attention, PAIR, True, jnp.float64) == pytest.approx(authors, rel=1e-12, abs=0)
    # float32: the β contraction has T² + T + 2 rounding steps (tests/test_sieves_kernel.py), the
    # entropy T more plus the log's few ulps; 4·(T² + 2T + 2) · 2⁻²⁴ bounds them all.
    bound = 4 * (PAIR.length**2 + 2 * PAIR.length + 2) * F32
    got = block_scores(attention.astype(np.float32), PAIR, True, jnp.float32)
    assert got == pytest.approx(authors, rel=bound, abs=0)
    # A planted bug the bound still catches: the notebook's own segment rule (the first [SEP] row
    # counts as segment B: 4 keys, β = 10/4, H = ln 4, instead of 10/3 · ln 3).
    notebook_rule = authors + (10 / 4 * math.log(4) - 10 / 3 * math.log(3)) / 10
    assert abs(notebook_rule - authors) > 10 * bound * authors


def test_first_sep_row_in_segment_b_by_hand():
    # A head that splits the rows as the authors' notebook does (`tok_id < sep1_idx` is A): the
    # first [SEP] row attends uniformly to segment B. By token type that row's sieve is A, so its
    # β is 0; with `first_sep_in_b` it is 10/4 with entropy ln 4, like the rows of B.
    rows_in_b = np.arange(PAIR.length) >= 4
    attention = np.where(rows_in_b[:, None], perfect_block_head(PAIR)[-1], perfect_block_head(PAIR)[0])
    by_type = (4 * 10 / 3 * math.log(3) + 0 + 5 * 10 / 4 * math.log(4)) / 10
    notebook = (4 * 10 / 3 * math.log(3) + 6 * 10 / 4 * math.log(4)) / 10
    with jax.enable_x64(True):
        for options, expected in ((SieveOptions(), by_type), (SieveOptions(first_sep_in_b=True), notebook)):
            rows, sieves = build_batch([PAIR], ["block"], options, PAIR.length)
            scores, _ = sieve_scores(
                jnp.asarray(attention[None, None, None]), np.ones((1, PAIR.length), bool), rows, sieves,
                entropy_roles=(True,),
            )  # fmt: skip
            # float64: ~n² = 100 terms of 2⁻⁵³ each, far below 1e-12.
            assert float(scores[0, 0, 0, 0]) == pytest.approx(expected, rel=1e-12, abs=0)
    # Only the first [SEP] row's sieve moves.
    by_type_sieve = build_batch([PAIR], ["block"], SieveOptions(), PAIR.length)[1][0, 0]
    notebook_sieve = build_batch([PAIR], ["block"], SieveOptions(first_sep_in_b=True), PAIR.length)[1][0, 0]
    assert np.flatnonzero((by_type_sieve != notebook_sieve).any(axis=1)).tolist() == [4]


def test_block_first_sep_flag_is_checked_and_recorded():
    assert roles_cli.parse_args(["--ckpt", "x", "--block-first-sep", "b"]).block_first_sep == "b"
    assert roles_cli.parse_args(["--ckpt", "x"]).block_first_sep == "a"
    with pytest.raises(UserError, match="--block-first-sep"):
        roles_config.RolesConfig(ckpt="x", block_first_sep="B")


def slow_entropy_scores(attention, real, rows, sieves):
    """β(t) · scipy.stats.entropy(row t over the real keys), averaged over the scored rows, in float64."""
    layers, batch, heads = attention.shape[:3]
    out = np.full((rows.shape[0], batch, layers, heads), np.nan)
    for r in range(rows.shape[0]):
        for b in range(batch):
            n = int(real[b].sum())
            scored = np.flatnonzero(rows[r, b])
            for layer in range(layers):
                for head in range(heads):
                    values = []
                    for t in scored:
                        alpha = attention[layer, b, head, t, :n].astype(np.float64)
                        beta = alpha[sieves[r, b, t, :n]].mean() / (alpha.sum() / n)
                        values.append(beta * scipy_entropy(alpha))
                    if values:
                        out[r, b, layer, head] = np.mean(values)
    return out


def test_entropy_roles_match_scipy_and_leave_the_other_roles_bit_identical():
    rng = np.random.default_rng(7)
    layers, batch, heads, length = 2, 3, 2, 7
    lengths = np.array([7, 5, 3])
    real = np.arange(length)[None] < lengths[:, None]
    logits = rng.normal(scale=3.0, size=(layers, batch, heads, length, length))
    attention = np.where(real[None, :, None, None, :], np.exp(logits), 0.0)
    attention = attention / attention.sum(-1, keepdims=True)
    attention = np.where(real[None, :, None, :, None], attention, 0.0)
    sieves = (rng.random((3, batch, length, length)) < 0.5) & real[None, :, None, :]
    rows = (rng.random((3, batch, length)) < 0.8) & real[None] & sieves.any(-1)
    with jax.enable_x64(True):
        plain, _ = sieve_scores(attention, real, rows, sieves)
        mixed, _ = sieve_scores(attention, real, rows, sieves, entropy_roles=(False, True, False))
        plain, mixed = np.asarray(plain), np.asarray(mixed)
    expected = slow_entropy_scores(attention, real, rows, sieves)
    np.testing.assert_allclose(mixed[1], expected[1], rtol=1e-12, atol=0)  # float64, ≤ 49 terms
    np.testing.assert_array_equal(mixed[[0, 2]], plain[[0, 2]])


# [CLS] w0 w0 w1 w2 [SEP]: w0 (two pieces) and w1 are nsubj dependents of w2, the root.
ARCS = make_seq([0] * 6, word_ids=[-1, 0, 0, 1, 2, -1], deps=("nsubj", "nsubj", "root"), heads=(2, 2, 2))


def test_arc_average_counts_each_dependent_word_once_by_hand():
    attention = np.zeros((6, 6))
    attention[np.arange(6), np.arange(6)] = 1.0  # rows other than the dependents attend to themselves
    # β(t) = α(t, w2) / (1/6): 6, 3 and 1.5 on the rows of w0, w0 and w1.
    for row, to_head in ((1, 1.0), (2, 0.5), (3, 0.25)):
        attention[row] = 0.0
        attention[row, 4] = to_head
        attention[row, row] = 1.0 - to_head
    rows, sieves = build_batch([ARCS], ["nsubj"], SieveOptions(), 6)
    weights = arc_row_weights([ARCS], ["nsubj"], 6)
    np.testing.assert_array_equal(weights[0, 0], [1, 0.5, 0.5, 1, 1, 1])
    real = np.ones((1, 6), bool)
    with jax.enable_x64(True):
        by_rows, _ = sieve_scores(attention[None, None, None], real, rows, sieves)
        by_arcs, _ = sieve_scores(attention[None, None, None], real, rows, sieves, weights)
        by_rows, by_arcs = float(by_rows[0, 0, 0, 0]), float(by_arcs[0, 0, 0, 0])
    assert by_rows == pytest.approx((6 + 3 + 1.5) / 3, rel=1e-12, abs=0)
    assert by_arcs == pytest.approx(((6 + 3) / 2 + 1.5) / 2, rel=1e-12, abs=0)


def test_variant_flags_are_checked_and_recorded():
    config = roles_cli.parse_args(["--ckpt", "x", "--block-score", "entropy", "--syntactic-average", "arcs"])
    assert (config.block_score, config.syntactic_average) == ("entropy", "arcs")
    assert scoring.entropy_roles(config) == tuple(r == "block" for r in config.roles)
    default = roles_cli.parse_args(["--ckpt", "x"])
    assert (default.block_score, default.syntactic_average) == ("paper", "rows")
    assert not any(scoring.entropy_roles(default))
    with pytest.raises(UserError, match="--block-score"):
        roles_config.RolesConfig(ckpt="x", block_score="notebook")


@pytest.mark.slow
def test_cli_variants_change_only_their_roles_and_are_recorded(tiny_hf, shared_data, tmp_path):
    base = ["--ckpt", str(tiny_hf), "--task", "mrpc", "--glue-dir", str(shared_data / "glue"), "--n", "16",
            "--batch-size", "8", "--no-figures", "--cache-dir", str(tmp_path / "cache")]  # fmt: skip
    roles_cli.main([*base, "--out", str(tmp_path / "paper")])
    roles_cli.main(
        [*base, "--block-score", "entropy", "--syntactic-average", "arcs", "--out", str(tmp_path / "authors")]
    )
    config = json.loads((tmp_path / "authors" / "run.json").read_text())["config"]
    assert (config["block_score"], config["syntactic_average"]) == ("entropy", "arcs")
    paper, authors = np.load(tmp_path / "paper" / "scores.npz"), np.load(tmp_path / "authors" / "scores.npz")
    # The other roles take the same β through a differently grouped contraction: the kernel's
    # float32 bound, (T² + T + 2) · 2⁻²⁴ with T ≤ 128 (tests/test_sieves_kernel.py), 2.5e-3 ≫ it
    # would still catch a role scored with the wrong sieve.
    bound = (128**2 + 128 + 2) * F32
    for role in ("local", "prev", "next", "cls", "sep", "delimiter"):
        np.testing.assert_allclose(authors[f"mrpc/{role}"], paper[f"mrpc/{role}"], rtol=bound, atol=0)
    assert not np.allclose(authors["mrpc/block"], paper["mrpc/block"], rtol=1e-2)
    assert np.isfinite(authors["mrpc/block"]).all()
    for role in ("nsubj", "syntactic"):
        np.testing.assert_array_equal(authors[f"mrpc/{role}/index"], paper[f"mrpc/{role}/index"])
