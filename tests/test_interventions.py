"""Steering head roles during pre-training (train.interventions, the `intervene` section).

The penalty's value equals a slow float64 numpy reference of its formula (docs/pretraining.md) on a
random batch, built with `sieves.builders`' own builders, and its gradient in the attention logits
equals central finite differences of that reference; a planted defect (another role's sieve, or
other heads) fails both. The in-step sieves equal the builders'. Each bad entry is one line before
any data work; a tiny run logs the penalties, refuses a resume under another section and resumes
after SIGKILL bit-identically; and on the synthetic language suppressing prev and next leaves fewer
positional heads than the unsteered run (the known answer, a short version).
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_emergence import language  # noqa: F401 — a fixture: the synthetic language
from test_probe import tensorboard_scalars
from test_train import _params, _train_command, corpus, prepared  # noqa: F401 — fixtures

from bertjax.errors import UserError
from sieves.align import EncodedSequence
from sieves.builders import SieveOptions, build_batch
from train import interventions as iv
from train.config import InterventionConfig

ROOT = Path(__file__).resolve().parents[1]
L, H, T = 2, 3, 12
# Every steerable role, both modes, and layer and head subsets.
ENTRIES = (
    InterventionConfig(role="prev", mode="suppress", weight=0.7, layers=[0, 1], heads=[0, 2]),
    InterventionConfig(role="next", mode="promote", target=3.0, layers=[1], heads=[1]),
    InterventionConfig(role="cls", mode="suppress", weight=1.3),
    InterventionConfig(role="block", mode="promote", target=2.0, layers=[0]),
    InterventionConfig(role="local", mode="suppress", heads=[1]),
    InterventionConfig(role="sep", mode="promote", target=1.5, layers=[1], heads=[0, 2]),
    InterventionConfig(role="delimiter", mode="suppress", weight=2.0, layers=[0], heads=[2]),
)


def pretraining_sequence(la: int, lb: int, index: int) -> EncodedSequence:
    """`[CLS] A [SEP] B [SEP]` with la and lb pieces, as `train.instances.pack` lays it out."""
    n = 3 + la + lb
    is_cls, is_sep = np.zeros(n, bool), np.zeros(n, bool)
    is_cls[0] = True
    is_sep[[1 + la, n - 1]] = True
    types = np.zeros(n, np.int32)
    types[2 + la :] = 1
    ids = np.arange(1000, 1000 + n, dtype=np.int32)
    return EncodedSequence(ids, types, is_cls | is_sep, is_cls, is_sep, np.full(n, -1, np.int32), (),
                           np.zeros(0, np.int32), 2, index)  # fmt: skip


# The shortest pair, a full-length one and others; padded to T.
SEQUENCES = [pretraining_sequence(la, lb, i) for i, (la, lb) in enumerate([(1, 1), (4, 5), (2, 1), (1, 6), (5, 4)])]


def padded(sequences) -> tuple[np.ndarray, np.ndarray]:
    mask, types = np.zeros((len(sequences), T), np.int32), np.zeros((len(sequences), T), np.int32)
    for b, s in enumerate(sequences):
        mask[b, : s.length], types[b, : s.length] = 1, s.token_type_ids
    return mask, types


@pytest.mark.parametrize("options", [SieveOptions(), SieveOptions(window=1, special_rows=False, first_sep_in_b=True)])
def test_the_sieves_built_in_the_step_are_the_builders(options):
    rows, sieves = build_batch(SEQUENCES, iv.STEERABLE, options, T)
    step_rows, step_sieves = iv.layout_masks(iv.STEERABLE, *map(jnp.asarray, padded(SEQUENCES)), options)
    np.testing.assert_array_equal(np.asarray(step_rows), rows)
    np.testing.assert_array_equal(np.asarray(step_sieves), sieves)


# -- the penalty against a slow float64 reference ------------------------------------------------


def logits_and_batch(seed: int = 13) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random attention logits [L, B, H, T, T] with a random pull, per head, towards or away from
    each role's keys, so the heads' β̄ spread to both sides of each hinge's kink. Seed 13 is the
    first whose batch passes the next test's conditions (every entry steers, no β̄ near a kink)."""
    rng = np.random.default_rng(seed)
    mask, types = padded(SEQUENCES)
    _, sieves = build_batch(SEQUENCES, iv.STEERABLE, SieveOptions(), T)
    pulls = rng.uniform(-2.5, 2.5, size=(L, H, len(iv.STEERABLE)))
    logits = rng.normal(scale=1.0, size=(L, len(SEQUENCES), H, T, T))
    logits += np.einsum("lhr,rbts->lbhts", pulls, sieves.astype(float))
    return logits, mask, types


def softmax_over_real_keys(logits: np.ndarray, mask: np.ndarray) -> np.ndarray:
    keys = mask[None, :, None, None, :] > 0
    shifted = np.where(keys, logits - np.where(keys, logits, -np.inf).max(-1, keepdims=True), -np.inf)
    weights = np.exp(shifted)
    return weights / weights.sum(-1, keepdims=True)


def reference(logits: np.ndarray, mask: np.ndarray, entries=ENTRIES) -> dict[str, tuple[float, float]]:
    """name → (penalty, mean β̄) by the formula, one row, sequence and head at a time, in float64."""
    attentions = softmax_over_real_keys(logits, mask)
    out = {}
    for i, entry in enumerate(entries):
        rows, sieves = build_batch(SEQUENCES, [entry.role], SieveOptions(), T)
        layers = range(L) if entry.layers is None else entry.layers
        heads = range(H) if entry.heads is None else entry.heads
        penalties, betas = [], []
        for layer in layers:
            for head in heads:
                per_sequence = []
                for b, seq in enumerate(SEQUENCES):
                    n = seq.length
                    scored = [t for t in range(n) if rows[0, b, t]]
                    if not scored:
                        continue
                    beta = []
                    for t in scored:
                        row = attentions[layer, b, head, t]
                        keys = [s for s in range(n) if sieves[0, b, t, s]]
                        beta.append((sum(row[s] for s in keys) / len(keys)) / (sum(row[:n]) / n))
                    per_sequence.append(np.mean(beta))
                mean_beta = np.mean(per_sequence)
                betas.append(mean_beta)
                if entry.mode == "suppress":
                    penalties.append(max(np.log(mean_beta), 0.0))
                else:
                    penalties.append(max(np.log(entry.target) - np.log(mean_beta), 0.0))
        out[f"{i}-{entry.role}"] = (entry.weight * np.mean(penalties), np.mean(betas))
    return out


def implementation(logits, mask, types, steerings) -> dict[str, tuple[jax.Array, jax.Array]]:
    keys = jnp.asarray(mask)[None, :, None, None, :] > 0
    attentions = jax.nn.softmax(jnp.where(keys, logits, -jnp.inf), axis=-1)
    return iv.steering_terms(steerings, list(attentions), jnp.asarray(mask), jnp.asarray(types))


def total(terms) -> float:
    return sum(penalty for penalty, _ in terms.values())


def value_matches(steerings, logits, mask, types) -> bool:
    """Each intervention's penalty and β̄ equal the reference's to float64 rounding."""
    expected = reference(logits, mask)
    with jax.enable_x64(True):
        found = jax.device_get(implementation(jnp.asarray(logits), mask, types, steerings))
    return all(np.allclose(found[name], expected[name], rtol=1e-12, atol=0) for name in expected)


def gradient_matches(steerings, logits, mask, types, directions: int = 3) -> bool:
    """The gradient in the logits, along random directions, equals central differences of the
    reference: ε = 1e-5 leaves a truncation error ~ε² and a rounding error ~1e-16/ε, both far below
    the tolerance."""
    rng = np.random.default_rng(1)
    eps = 1e-5
    with jax.enable_x64(True):
        grad = jax.grad(lambda x: total(implementation(x, mask, types, steerings)))(jnp.asarray(logits))
        grad = np.asarray(grad)
    for _ in range(directions):
        v = rng.normal(size=logits.shape)
        up = sum(p for p, _ in reference(logits + eps * v, mask).values())
        down = sum(p for p, _ in reference(logits - eps * v, mask).values())
        numeric = (up - down) / (2 * eps)
        if not np.isclose(np.vdot(grad, v), numeric, rtol=1e-7, atol=1e-10):
            return False
    return True


@pytest.fixture(scope="module")
def steerings() -> list[iv.Steering]:
    return iv.check_config(ENTRIES, L, H)


def test_the_random_batch_is_away_from_the_hinges_kinks_and_steers_every_entry():
    """Finite differences across a kink would be wrong by half a slope; a zero penalty checks nothing."""
    logits, mask, _ = logits_and_batch()
    for entry, (penalty, _) in zip(ENTRIES, reference(logits, mask).values(), strict=True):
        assert penalty > 0.01, entry
    for entry in ENTRIES:
        single = reference(logits, mask, [InterventionConfig(role=entry.role, layers=[layer], heads=[head])
                                          for layer in range(L) for head in range(H)])  # fmt: skip
        kink = 1.0 if entry.mode == "suppress" else entry.target
        assert all(abs(np.log(beta / kink)) > 0.02 for _, beta in single.values()), entry.role


def test_value_and_gradient_equal_the_float64_reference(steerings):
    logits, mask, types = logits_and_batch()
    assert value_matches(steerings, logits, mask, types)
    assert gradient_matches(steerings, logits, mask, types)


@pytest.mark.parametrize("defect", ["the next sieve for prev", "the heads shifted by one"])
def test_a_planted_defect_fails_both_checks(defect, steerings, monkeypatch):
    logits, mask, types = logits_and_batch()
    if defect == "the next sieve for prev":
        monkeypatch.setitem(iv.LAYOUT_SIEVES, "prev", iv.LAYOUT_SIEVES["next"])
    else:
        steerings = [iv.Steering(**{**s.__dict__, "heads": tuple((h + 1) % H for h in s.heads)}) for s in steerings]
    assert not value_matches(steerings, logits, mask, types)
    assert not gradient_matches(steerings, logits, mask, types)


def test_the_float32_penalty_is_the_float64_one_to_float32_rounding(steerings):
    """The step runs in float32: each β̄ sums ~B·T² products of probabilities, so B·T² float32
    epsilons (8.6e-5 here) bound its relative rounding error; the planted defects move a penalty by
    far more (the float64 checks above)."""
    logits, mask, types = logits_and_batch()
    expected = reference(logits, mask)
    found = jax.device_get(implementation(jnp.asarray(logits, jnp.float32), mask, types, steerings))
    bound = len(SEQUENCES) * T * T * np.finfo(np.float32).eps
    for name, values in expected.items():
        np.testing.assert_allclose(found[name], values, rtol=bound, atol=bound, err_msg=name)


def test_the_gradient_of_suppress_is_bounded_and_of_promote_finite_with_no_attention_on_the_sieve():
    beta = jnp.array([0.0, 1e-30, 0.5, 1.0 + 1e-3, 40.0])
    suppress = jax.grad(lambda b: iv.hinge(b, "suppress", 3.0).sum())(beta)
    promote = jax.grad(lambda b: iv.hinge(b, "promote", 3.0).sum())(beta)
    assert np.all(np.abs(np.asarray(suppress)) <= 1.0) and np.isfinite(np.asarray(promote)).all()
    np.testing.assert_array_equal(np.asarray(iv.hinge(beta, "suppress", 3.0))[:3], 0.0)


def test_the_window_is_a_traced_mask():
    steering = iv.check_config([InterventionConfig(role="prev", start=3, stop=5)], L, H)[0]
    mask = jax.jit(lambda step: iv.active(steering, step))
    assert [float(mask(jnp.int32(step))) for step in range(7)] == [0, 0, 0, 1, 1, 0, 0]


# -- the section's checks ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ({}, "intervene.1.role: '' is not a role; steerable: "),
        (
            {"role": "prevv"},
            "intervene.1.role: 'prevv' is not a role; steerable: local, prev, next, block, cls, sep, delimiter",
        ),
        (
            {"role": "nsubj"},
            "intervene.1.role: nsubj needs dependency parses, which the pre-training data does not carry",
        ),
        ({"role": "prev", "mode": "boost"}, "intervene.1.mode: 'boost' is not suppress or promote"),
        ({"role": "prev", "weight": -1.0}, "intervene.1.weight: must be a finite number ≥ 0, got -1.0"),
        ({"role": "prev", "target": 0.0}, "intervene.1.target: must be a finite number > 0 (a β), got 0.0"),
        ({"role": "prev", "layers": [0, 2]}, "intervene.1.layers: 2 is out of range; the model has 2 layers (0 to 1)"),
        ({"role": "prev", "layers": []}, "intervene.1.layers: name at least one, or null for all 2"),
        (
            {"role": "prev", "heads": [-1]},
            "intervene.1.heads: -1 is out of range; the model has 3 heads per layer (0 to 2)",
        ),
        ({"role": "prev", "heads": [1, 1]}, "intervene.1.heads: [1, 1] names one twice"),
        ({"role": "prev", "start": -2}, "intervene.1.start: must be a step ≥ 0, got -2"),
        (
            {"role": "prev", "start": 5, "stop": 5},
            "intervene.1.stop: 5 is not after start 5; the window [start, stop) is empty",
        ),
    ],
)
def test_each_refusal_is_one_line_naming_the_entry(entry, expected):
    with pytest.raises(UserError) as error:
        iv.check_config([InterventionConfig(role="cls"), InterventionConfig(**entry)], L, H)
    message = str(error.value)
    assert "\n" not in message and message.startswith(expected), message


def test_a_bad_entry_stops_pretrain_before_any_data_work(tmp_path, cli_error):
    from train import pretrain

    workdir = tmp_path / "work"
    argv = ["--config", str(ROOT / "configs/pretrain/tiny.yaml"), "--workdir", str(workdir),
            f"data.corpora=[{{name: none, source: local, path: {tmp_path / 'missing'}, kind: plain}}]",
            "intervene=[{role: prev, layers: [7]}]"]  # fmt: skip
    message = cli_error(pretrain.main, argv)
    assert message == "error: intervene.0.layers: 7 is out of range; the model has 2 layers (0 to 1)"
    assert not workdir.exists()


def test_a_resume_under_another_section_is_refused_and_an_old_run_resumes_without_one():
    from train.checkpoints import setting_changes

    before = {"train": {"steps": 10}, "intervene": [{"role": "prev", "mode": "suppress", "weight": 1.0}]}
    after = {"train": {"steps": 10}, "intervene": [{"role": "prev", "mode": "suppress", "weight": 2.0}]}
    assert setting_changes(before, after) == [f"intervene: {before['intervene']!r} vs {after['intervene']!r}"]
    recorded_before_the_section = {"train": {"steps": 10}}
    assert setting_changes(recorded_before_the_section, {"train": {"steps": 10}, "intervene": []}) == []
    assert setting_changes(recorded_before_the_section, after) != []


# -- a tiny run: logged, checkpointed, resumed exactly ---------------------------------------------

# prev promoted (β̄ starts near chance, so the penalty is positive) for the first 6 updates; cls
# suppressed on one head throughout.
STEERED = "intervene=[{role: prev, mode: promote, weight: 0.5, stop: 6}, {role: cls, layers: [1], heads: [0]}]"


@pytest.fixture(scope="module")
def steered_run(corpus, prepared, tmp_path_factory) -> Path:  # noqa: F811 — fixtures imported above
    workdir = tmp_path_factory.mktemp("steered")
    subprocess.run(_train_command(workdir, corpus, prepared, 12, STEERED), check=True, cwd=ROOT, timeout=600)
    return workdir


def test_a_steered_run_logs_each_penalty_and_its_beta(steered_run):
    lines = [json.loads(line) for line in (steered_run / "metrics.jsonl").read_text().splitlines()]
    logged = {row["step"]: row for row in lines if "intervene/0-prev" in row}
    assert sorted(logged) == [1, 2, 4, 6, 8, 10, 12]  # the first step, then every log_every
    for step, row in logged.items():
        assert row["intervene/0-prev/beta"] > 0 and row["intervene/1-cls/beta"] > 0
        # Steps 5 and 6 are the updates from steps 4 and 5, inside [0, 6); 7 on are outside.
        assert (row["intervene/0-prev"] > 0) == (step <= 6), (step, row)
    scalars = tensorboard_scalars(steered_run)
    assert set(scalars["intervene/1-cls/beta"]) == set(logged)
    config = json.loads((steered_run / "run.json").read_text())["config"]
    assert [entry["role"] for entry in config["intervene"]] == ["prev", "cls"]


def test_a_steered_run_resumes_after_sigkill_bit_identically(steered_run, corpus, prepared, tmp_path):  # noqa: F811
    workdir = tmp_path / "killed"
    command = _train_command(workdir, corpus, prepared, 12, STEERED)
    process = subprocess.Popen(command, cwd=ROOT)
    deadline = time.time() + 300
    while not (workdir / "checkpoints" / "4").is_dir():
        assert process.poll() is None and time.time() < deadline, "the run ended before step 4"
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (workdir / "checkpoints" / "12").exists(), "killed too late to test a resume"
    subprocess.run(command, check=True, cwd=ROOT, timeout=600)
    uninterrupted, resumed = _params(steered_run), _params(workdir)
    for key in uninterrupted:
        np.testing.assert_array_equal(resumed[key], uninterrupted[key], err_msg=key)


def test_resuming_a_steered_run_with_another_section_is_refused(steered_run, corpus, prepared, tmp_path, cli_error):  # noqa: F811
    import shutil

    from train import pretrain

    workdir = tmp_path / "other"
    shutil.copytree(steered_run / "checkpoints", workdir / "checkpoints")
    argv = _train_command(workdir, corpus, prepared, 12, STEERED.replace("weight: 0.5", "weight: 0.6"))[3:]
    message = cli_error(pretrain.main, argv)
    assert "was trained with other settings (intervene: " in message, message


# -- the known answer, short: the synthetic language needs each token's neighbours ----------------

SYNTHETIC = ROOT / "configs" / "pretrain" / "synthetic.yaml"
POSITIONAL = ("prev", "next", "local")


def synthetic_run(text: Path, workdir: Path, *extra: str) -> dict:
    """The synthetic recipe (1000 steps, 2 × 2 heads), probed and evaluated once, at its end: the
    last row of each."""
    from train import pretrain

    pretrain.main(["--config", str(SYNTHETIC), "--workdir", str(workdir),
                   f"data.corpora.0.path={text / 'train.txt'}", f"heldout.corpora.0.path={text / 'heldout.txt'}",
                   "heldout.every=0", "checkpoint.log_spaced=0", "checkpoint.steps=[]",
                   f"probe.task=text:{text / 'pairs.txt'}", "probe.n=64", "probe.max_length=32",
                   "probe.batch_size=64", "probe.every=1000", f"probe.roles=[{','.join(POSITIONAL)}]", *extra])  # fmt: skip
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    last = {}
    for row in rows:
        last |= row
    return last


@pytest.mark.slow  # three runs of the synthetic recipe: 40 s, 74 s and 74 s of CPU on 2 shared cores
def test_suppressing_prev_and_next_keeps_the_positional_heads_from_forming(language, tmp_path):  # noqa: F811
    plain = synthetic_run(language, tmp_path / "plain")
    data = f"data_dir={tmp_path / 'plain' / 'data-T32'}"
    steered = synthetic_run(language, tmp_path / "steered", data,
                            "intervene=[{role: prev, mode: suppress}, {role: next, mode: suppress}]")  # fmt: skip
    # The control: a role the language does not need, suppressed the same way.
    control = synthetic_run(language, tmp_path / "control", data, "intervene=[{role: cls, mode: suppress}]")
    runs = (("plain", plain), ("steered", steered), ("control", control))
    heads = {name: sum(run[f"probe/{role}/heads"] for role in POSITIONAL) for name, run in runs}
    assert heads["plain"] >= 2, heads  # the unsteered run forms them (else the comparison says nothing)
    assert heads["steered"] <= 1 and heads["steered"] < heads["plain"], heads
    # With [CLS] suppressed they still form: here one head holding next and local (β 3.5 and 3.8 on
    # the probe), against none steered. At least one, not a count: at this size the count moves with
    # the float rounding of another CPU; docs/emergence.md's 1b gives the across-seed answer.
    assert heads["control"] >= 1, heads
    assert control["intervene/0-cls/beta"] < 1.05, control
    # Without the heads the loss drop does not come within the budget.
    assert steered["heldout_mlm_loss"] > plain["heldout_mlm_loss"] + 0.5, (plain, steered)
    assert steered["intervene/0-prev/beta"] < 1.05 and steered["intervene/1-next/beta"] < 1.05
    # What docs/pretraining.md quotes (`pytest -rP` shows it).
    print({name: {key: run[key] for key in sorted(run) if key.startswith(("probe/", "heldout_mlm_loss", "intervene/"))}
           for name, run in runs})  # fmt: skip
