"""Role probes and SAS inside pre-training (train.probe): logged at every probe step into
metrics.jsonl and TensorBoard, equal to `analysis.track` (with `--sas`) on the same checkpoints and
probe set, and a bad probe section stopped by one error line before any work.

One short run of configs/pretrain/synthetic.yaml (the known-answer language of tests/test_emergence)
with probes every 40 steps and at its log-spaced checkpoints, on gold trees written over sentences
of that language (each word's head its left neighbour, so a `prev` head would find every arc).
"""

from __future__ import annotations

import collections
import json
import struct
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bertjax.errors import UserError

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "pretrain" / "synthetic.yaml"
STEPS, EVERY, N, MAX_LENGTH, BATCH = 120, 40, 48, 32, 16
# `block` needs sentence pairs; CoNLL-U trees are single sentences.
ROLES = ("prev", "next", "local", "cls", "sep", "delimiter")
SAS_RELATIONS = ("punct",)
SAS_KEYS = ("", "/layer", "/head", "/direction", "/baseline_uas", "/baseline_offset", "/count")
# 120 steps leave every head's β within ~10% of chance (largest 1.10 at step 120, 1.05 at 24), so
# τ sits just above chance: the counts compared are then not all zero, and every p-value is far
# from α (β's SD across sequences is tiny), so equal counts are a real check.
TAU, ALPHA = 1.02, 0.05


@pytest.fixture(scope="module")
def language(tmp_path_factory) -> Path:
    from train import synthetic

    out = tmp_path_factory.mktemp("language") / "text"
    synthetic.write(out, words=64, successors=2, tokens=40_000, seed=0)
    return out


@pytest.fixture(scope="module")
def trees(language) -> Path:
    """The held-out text's first sentences as CoNLL-U: the first word the root, every other word
    (`dep`) and the full stop (`punct`) headed by its left neighbour."""
    blocks = []
    for line in (language / "heldout.txt").read_text().splitlines():
        if not line.strip():
            continue
        words = line.split()
        rows = [f"# text = {line}"]
        for i, word in enumerate(words, start=1):
            relation = "root" if i == 1 else "punct" if word == "." else "dep"
            rows.append(f"{i}\t{word}\t{word}\t_\t_\t_\t{i - 1}\t{relation}\t_\t_")
        blocks.append("\n".join(rows) + "\n")
        if len(blocks) == N:
            break
    path = language / "trees.conllu"
    path.write_text("\n".join(blocks))
    return path


def overrides(language: Path, trees: Path, *extra: str) -> list[str]:
    return [
        f"data.corpora.0.path={language / 'train.txt'}",
        f"heldout.corpora.0.path={language / 'heldout.txt'}",
        "heldout.sequences=128",
        f"train.steps={STEPS}",
        "train.log_every=20",
        "checkpoint.log_spaced=4",
        f"probe.task=conllu:{trees}",
        f"probe.n={N}",
        f"probe.max_length={MAX_LENGTH}",
        f"probe.batch_size={BATCH}",
        f"probe.every={EVERY}",
        f"probe.roles=[{','.join(ROLES)}]",
        f"probe.tau={TAU}",
        f"probe.alpha={ALPHA}",
        f"probe.sas_relations=[{','.join(SAS_RELATIONS)}]",
        *extra,
    ]


@pytest.fixture(scope="module")
def run(language, trees, tmp_path_factory) -> Path:
    from train import pretrain

    workdir = tmp_path_factory.mktemp("probe") / "run"
    pretrain.main(["--config", str(CONFIG), "--workdir", str(workdir), *overrides(language, trees)])
    return workdir


def probe_records(workdir: Path) -> dict[int, dict]:
    lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in lines if "probe/prev/heads" in r}


def checkpoint_steps(workdir: Path) -> list[int]:
    return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


def tensorboard_scalars(workdir: Path) -> dict[str, dict[int, float]]:
    """tag → {step: value}, read from the TFRecord event files (tensorboard itself is not a
    dependency): each record is length (u64), its CRC, the Event proto, its CRC."""
    from tensorboardX.proto import event_pb2

    scalars: dict[str, dict[int, float]] = {}
    for path in sorted((workdir / "tensorboard").glob("events.out.tfevents.*")):
        data = path.read_bytes()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset : offset + 8])
            event = event_pb2.Event.FromString(data[offset + 12 : offset + 12 + length])
            offset += 12 + length + 4
            for value in event.summary.value:
                scalars.setdefault(value.tag, {})[event.step] = value.simple_value
    return scalars


@pytest.mark.slow  # the `run` fixture pre-trains with probes: ~33 s of CPU
def test_probe_metrics_are_logged_at_every_probe_step(run):
    saves = checkpoint_steps(run)
    expected = sorted({*range(EVERY, STEPS + 1, EVERY), *saves})
    records = probe_records(run)
    assert sorted(records) == expected
    keys = [f"probe/{role}/{what}" for role in ROLES for what in ("heads", "max_beta", "max_layer", "max_head", "n")]
    # SAS is on by default for gold trees: overall and for each of probe.sas_relations.
    keys += [f"probe/sas{relation}{key}" for relation in ("", *(f"/{r}" for r in SAS_RELATIONS)) for key in SAS_KEYS]
    scalars = tensorboard_scalars(run)
    for step, record in records.items():
        for key in keys:
            assert key in record, (step, key)
            assert scalars[key][step] == pytest.approx(record[key], rel=1e-6)  # TensorBoard stores float32
        assert record["probe/prev/n"] == N
    run_json = json.loads((run / "run.json").read_text())
    assert run_json["timings_s"]["probe_s"] > 0


@pytest.mark.slow  # the `run` fixture, when run alone
def test_probe_equals_analysis_track(run, trees, tmp_path):
    from analysis import track

    out = tmp_path / "track"
    track.main(["--run", str(run), "--parser", "conllu", "--conllu", str(trees), "--n", str(N), "--max-length",
                str(MAX_LENGTH), "--batch-size", str(BATCH), "--roles", ",".join(ROLES), "--tau", str(TAU),
                "--alpha", str(ALPHA), "--sas", str(trees), "--sas-n", str(N), "--no-figures",
                "--out", str(out)])  # fmt: skip
    table = pd.read_csv(out / "track.csv")
    records = probe_records(run)
    steps = sorted(table["step"].unique())
    assert steps == checkpoint_steps(run) and len(steps) >= 3
    # β is a ratio of float32 sums over ≤ T keys, averaged over ≤ T rows: each computation is within
    # ~3·T·u of the exact value (u = 2⁻²⁴), so two differently compiled ones within 6·T·u.
    # A probe in bf16, or with another sieve or padding, is off by orders of magnitude more.
    bound = 6 * MAX_LENGTH * 2.0**-24
    assigned_somewhere = 0
    for step in steps:
        record = records[step]
        for role in ROLES:
            rows = table[(table["step"] == step) & (table["role"] == role)].sort_values(["layer", "head"])
            # A p-value within rounding of α would make an exact count ill-posed on another CPU.
            assert not np.any(np.abs(rows["p_value"] - ALPHA) < 1e-9)
            assert record[f"probe/{role}/heads"] == int(rows["assigned"].sum()), (step, role)
            assert record[f"probe/{role}/n"] == int(rows["n"].iloc[0])
            best = rows.loc[rows["mean"].idxmax()]
            assert record[f"probe/{role}/max_beta"] == pytest.approx(best["mean"], rel=bound, abs=0)
            assert (record[f"probe/{role}/max_layer"], record[f"probe/{role}/max_head"]) == (
                best["layer"],
                best["head"],
            )
            assigned_somewhere += int(rows["assigned"].sum())
    assert assigned_somewhere > 0  # the counts compared are not all zeros

    # SAS: arc counts over the same sentences, cut at the same length, in the same batches; the
    # UAS are ratios of integer counts, so equal, not close, where no argmax that decides an arc is
    # within rounding of a tie (`fragile_arcs`); where one is, within those arcs. A word-map entry,
    # like β, is a float32 sum of ≤ T attention terms: two compiles are within `bound` of each other.
    sas = pd.read_csv(out / "sas.csv")
    assert sorted(sas["step"].unique()) == steps
    exact = 0
    for step in steps:
        record = records[step]
        fragile = fragile_arcs(run, step, trees, bound)
        for relation in ("all", *SAS_RELATIONS):
            row = sas[(sas["step"] == step) & (sas["relation"] == relation)].iloc[0]
            prefix = "probe/sas" if relation == "all" else f"probe/sas/{relation}"
            if fragile[relation]:
                assert abs(record[prefix] - row["uas"]) * row["count"] <= fragile[relation] + 1e-9
                continue
            exact += 1
            assert {key: record[prefix + key] for key in SAS_KEYS} == {
                "": row["uas"],
                "/layer": row["layer"],
                "/head": row["head"],
                "/direction": ["dep2head", "head2dep"].index(row["direction"]),
                "/baseline_uas": row["baseline_uas"],
                "/baseline_offset": row["baseline_offset"],
                "/count": row["count"],
            }, (step, relation)
    # Measured: 5 of the 8 comparisons well-posed (steps 5 and 24 each have a near-tie), all 8 equal.
    assert exact >= len(steps)
    # The run moves SAS: the compared values are not one constant.
    assert len({records[step]["probe/sas"] for step in steps}) > 1


def fragile_arcs(run: Path, step: int, trees: Path, bound: float) -> collections.Counter[str]:
    """relation → the (arc, layer, head, direction) decisions of `run`'s checkpoint at `step`, as
    the analyses compute its word attention, whose argmax is within relative `bound` of a tie that
    involves the arc's true head: another compile of the same sums may decide them the other way."""
    from analysis.attention.wordattn import iter_word_attention, make_word_attention_fn
    from bertjax.pretrained import from_pretrained, load_tokenizer
    from sieves.align import encode_batch
    from sieves.parse import read_conllu

    sentences = read_conllu(trees, limit=N)
    seqs = encode_batch(load_tokenizer(run), [(t,) for t, _ in sentences], [(w,) for _, w in sentences], MAX_LENGTH)
    fragile: collections.Counter[str] = collections.Counter()
    model = from_pretrained(run, step=step)
    for word in iter_word_attention(make_word_attention_fn(model), seqs, BATCH, MAX_LENGTH):
        width = len(word.word_head)
        arcs = np.flatnonzero((word.word_head != np.arange(width)) & word.present)
        arcs = arcs[word.present[word.word_head[arcs]]]
        allowed = word.present[None, :] & ~np.eye(width, dtype=bool)
        for maps in (word.maps, np.swapaxes(word.maps, -1, -2)):
            scores = np.where(allowed, maps, -np.inf)[..., arcs, :]  # [L, H, arcs, W]
            near = scores >= scores.max(axis=-1, keepdims=True) * (1 - bound)
            tied_with_truth = (near.sum(axis=-1) > 1) & near[..., np.arange(arcs.size), word.word_head[arcs]]
            per_arc = tied_with_truth.sum(axis=(0, 1))
            fragile["all"] += int(per_arc.sum())
            for arc, count in zip(arcs, per_arc, strict=True):
                fragile[word.word_dep[arc]] += int(count)
    return fragile


@pytest.mark.parametrize(
    "extra, message",
    [
        (["probe.task=nosuch"], "probe.task: 'nosuch' is none of"),
        (["probe.task=text:/no/such/file.txt"], "probe.task text:/no/such/file.txt: /no/such/file.txt is not a file"),
        (["probe.every=0"], "probe.every must be at least 1, got 0"),
        # Accepted before: every head held every role (β is never negative).
        (["probe.tau=-1"], "probe.tau must be a finite number ≥ 0, got -1"),
        (["probe.roles=[prev,nosuch]"], "probe.roles: unknown role 'nosuch'"),
        ([f"probe.max_length={MAX_LENGTH + 1}"], f"probe.max_length {MAX_LENGTH + 1} exceeds the model's"),
        (["probe.task=mrpc", "probe.sas=true"], "probe.sas needs gold trees: probe.task must be conllu:FILE, got mrpc"),
        (["probe.sas=false"], "probe.sas_relations: SAS is off (probe.sas: false)"),
        (["probe.sas_relations=[all]"], "probe.sas_relations: the overall SAS (all) is always logged"),
        (["probe.sas_relations=[nsubj]"], f"probe.sas_relations: no nsubj arc in the first {N} trees of "),
    ],
)
def test_probe_config_errors_stop_before_any_work(language, trees, tmp_path, extra, message):
    from train import pretrain

    workdir = tmp_path / "run"
    with pytest.raises(UserError) as error:
        pretrain.main(["--config", str(CONFIG), "--workdir", str(workdir), *overrides(language, trees, *extra)])
    assert str(error.value).startswith(message) and "\n" not in str(error.value)
    assert not workdir.exists()


def test_probe_corrections_count_as_the_analysis_tests():
    """The probe's heads per role under each correction equal test_roles' on the same scores (the
    family: every test of the step), and the number of tests is logged."""
    from analysis.heads.config import RolesConfig
    from analysis.heads.scoring import TaskScores, test_roles
    from train.probe import summarise

    rng = np.random.default_rng(0)
    scores = {"prev": rng.gamma(2.0, 1.6, (60, 2, 3)), "cls": rng.gamma(2.0, 1.4, (60, 2, 3))}
    result = {"t": TaskScores(scores, {r: np.arange(60) for r in scores}, [], 60)}
    for correction in ("none", "holm", "bh"):
        metrics = summarise(scores, 3.0, 0.05, "t", correction)
        table, _ = test_roles(result, RolesConfig(ckpt="x", correction=correction))
        for role in scores:
            assert metrics[f"probe/{role}/heads"] == int(table[table["role"] == role]["assigned"].sum())
        assert metrics["probe/tests"] == 12
