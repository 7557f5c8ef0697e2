"""Every output of `analysis.roles`, `analysis.track`, `analysis.finetune_effect`, `analysis.clark`,
`analysis.ablate` and `analysis.prune` (CSVs, scores, figures, run.json, the report page and the
printed lines) equals, byte for byte, what the code
wrote before the analyses became compute → result → writer (issue 40): the files under
tests/fixtures/outputs/ were written by that code (BERTJAX_RECORD_FIXTURES=1 writes them again).

What may differ between two runs of unchanged code is masked, and only that: the timings, the
versions, host and command of run.json, and the paths of this run's temporary folders (in
run.json and the printed lines); the scores-cache file names hold a digest of the settings,
which name the jax version and the data files' paths, so their 16 hex digits are masked too.

Figures are compared as bytes. That holds on any machine with the pinned matplotlib: Agg's PNG
writer adds no date, matplotlib bundles the DejaVu fonts it draws with, and the values drawn are
the CSVs' (compared exactly, so a difference in a figure is a difference in the drawing code);
the checkpoints are named relative to the folder the runs start in, as their titles show them.
The tiny model is random (seed 1), 2 layers of width 128: its sums are short enough that XLA's
CPU code gives the same float32 bits under AVX2 and AVX-512 (checked by hand with
XLA_FLAGS=--xla_cpu_max_isa=AVX2 on an AVX-512 machine when the fixtures were written).
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from test_track import write_checkpoint, write_run

import bertjax
from analysis import ablate, clark, finetune_effect, prune, roles, track

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "outputs"
RECORD = os.environ.get("BERTJAX_RECORD_FIXTURES") == "1"
# run.json's keys that differ between two runs of the same code on the same inputs.
VOLATILE = ("timings_s", "versions", "host", "command", "cwd")
# ... and, at any depth, the count of programs compiled, which depends on what this process
# compiled before (ablate and prune record it).
VOLATILE_NESTED = ("compiled_executables",)
DIGEST = re.compile(r"-[0-9a-f]{16}\.npz")


def _vector_code_as_recorded() -> bool:
    """Whether XLA emits the vector code the fixtures were recorded with: 256-bit (AVX2) or wider,
    which gave the same bits as AVX-512. 128-bit code (a CPU without AVX2, or XLA_FLAGS holding
    --xla_cpu_max_isa=SSE4_2 or AVX) rounds some float32 sums otherwise, and all six comparisons
    then differ in last digits (seen under SSE4_2): byte identity is a property of one code
    generation, so it is checked where it can hold and skipped, not loosened, elsewhere."""
    isa = re.search(r"--xla_cpu_max_isa=(\w+)", os.environ.get("XLA_FLAGS", ""))
    if isa and not (isa.group(1).upper() == "AVX2" or isa.group(1).upper().startswith(("AVX512", "AVX10", "AMX"))):
        return False
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return platform.machine() in ("x86_64", "AMD64") and " avx2" in flags


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not _vector_code_as_recorded(), reason="the fixtures hold for AVX2-or-wider XLA code"),
]


@pytest.fixture(scope="module")
def places(tmp_path_factory, tiny_hf, shared_data) -> dict[str, Path]:
    """The inputs, written afresh into one folder the runs start in and name relative to it (the
    figures' titles name the checkpoint as given), and the parse cache."""
    root = tmp_path_factory.mktemp("identical")
    shutil.copytree(tiny_hf, root / "ckpt")
    run = write_run(root / "run", shared_data, (1, 4))
    post = root / "post" / "tiny-mrpc"
    shutil.copytree(run / "tokenizer", post / "tokenizer")
    write_checkpoint(post, 40, seed=2, cls=bertjax.BertForSequenceClassification)
    for name, cls, seed in (
        ("pretraining", "BertForPreTraining", 1),
        ("classifier", "BertForSequenceClassification", 3),
    ):
        config = bertjax.preset("tiny", max_position_embeddings=128)
        bertjax.save_pretrained(bertjax.init_model(config, cls, seed=seed), root / name)
        bertjax.load_tokenizer(tiny_hf).save_pretrained(root / name)
    return {"<data>": shared_data, "<tmp>": root}


def _flags(places: dict[str, Path]) -> list[str]:
    # Length 32: every batch one padded shape; 8 examples in batches of 4, the last one padded.
    return ["--glue-dir", str(places["<data>"] / "glue"), "--n", "6", "--batch-size", "4", "--max-length", "32",
            "--cache-dir", str(places["<tmp>"] / "parses")]  # fmt: skip


def _command(tool: str, out: Path, places: dict[str, Path]):
    """The entry point and flags of `tool`'s run: each output kind at least once (roles: two
    figure kinds of two tasks, one without `block`, and the report page)."""
    if tool == "roles":
        return roles.main, ["--ckpt", "ckpt", "--task", "mrpc,sst2", "--figures", "role_grid,coarse_overlap",
                            "--html", "--out", str(out), *_flags(places)]  # fmt: skip
    if tool == "track":
        return track.main, ["--run", "run", "--task", "mrpc", "--bootstrap", "50", "--out", str(out), *_flags(places)]
    if tool == "finetune_effect":
        return finetune_effect.main, ["--pre", "ckpt", "--post", "post/tiny-mrpc", "--task", "mrpc", "--out", str(out),
                                      *_flags(places)]  # fmt: skip
    small = ["--n", "6", "--batch-size", "4", "--max-length", "32", "--out", str(out)]
    glue = ["--task", "mrpc", "--glue-dir", str(places["<data>"] / "glue")]
    if tool == "clark":  # every analysis, the gradients through the random MLM head
        return clark.main, ["--ckpt", "pretraining", "--data-dir", str(places["<data>"]), "--cluster-n", "4",
                            "--gradient-n", "4", "--ewt-n", "12", "--gap-n", "8", "--probe-train-n", "8",
                            "--probe-epochs", "1", "--min-count", "1", *small]  # fmt: skip
    if tool == "ablate":
        return ablate.main, ["--ckpt", "classifier", *glue, *small]
    return prune.main, ["--ckpt", "classifier", *glue, "--prune-step", "0.25", "--random-seeds", "2", *small]


TOOLS = ("roles", "track", "finetune_effect", "clark", "ablate", "prune")


def _mask(text: str, places: dict[str, Path]) -> str:
    for name, path in sorted(places.items(), key=lambda item: -len(str(item[1]))):
        text = text.replace(str(path.resolve()), name).replace(str(path), name)
    return DIGEST.sub("-<digest>.npz", text)


def _run_json(path: Path, places: dict[str, Path]) -> str:
    info = json.loads(path.read_text())
    for key in VOLATILE:
        info.pop(key, None)
    info = _without(info, VOLATILE_NESTED)
    return _mask(json.dumps(info, indent=2, sort_keys=True), places) + "\n"


def _without(value, keys: tuple[str, ...]):
    if isinstance(value, dict):
        return {k: _without(v, keys) for k, v in value.items() if k not in keys}
    if isinstance(value, list):
        return [_without(v, keys) for v in value]
    return value


def _outputs(out: Path, printed: str, places: dict[str, Path]) -> dict[str, bytes]:
    """Every file of `out` as bytes (run.json masked; scores.npz as its arrays, compared apart),
    and the printed lines as `stdout.txt`."""
    files = {"stdout.txt": _mask(printed, places).encode()}
    for path in sorted(out.rglob("*")):
        name = path.relative_to(out).as_posix()
        if path.is_dir() or name == "scores.npz":
            continue
        files[name] = _run_json(path, places).encode() if name == "run.json" else path.read_bytes()
    return files


@pytest.mark.parametrize("tool", TOOLS)
def test_outputs_equal_the_pre_change_codes(tool, places, monkeypatch, capsys):
    monkeypatch.chdir(places["<tmp>"])
    out = places["<tmp>"] / "out" / tool
    main, argv = _command(tool, out, places)
    capsys.readouterr()
    main(argv)
    files = _outputs(out, capsys.readouterr().out, places)
    expected_dir = FIXTURES / tool
    if RECORD:
        shutil.rmtree(expected_dir, ignore_errors=True)
        for name, data in files.items():
            (expected_dir / name).parent.mkdir(parents=True, exist_ok=True)
            (expected_dir / name).write_bytes(data)
        if (out / "scores.npz").is_file():
            shutil.copy(out / "scores.npz", expected_dir / "scores.npz")
    expected = {p.relative_to(expected_dir).as_posix(): p.read_bytes() for p in sorted(expected_dir.rglob("*"))
                if p.is_file() and p.name != "scores.npz"}  # fmt: skip
    assert sorted(files) == sorted(expected)
    for name, data in files.items():
        if name.endswith((".csv", ".json", ".txt", ".html", ".svg")):
            assert data.decode() == expected[name].decode(), name  # a diff pytest can show
        assert data == expected[name], name
    if (expected_dir / "scores.npz").is_file():
        with np.load(out / "scores.npz") as got, np.load(expected_dir / "scores.npz") as want:
            assert sorted(got.files) == sorted(want.files)
            for key in want.files:
                assert got[key].dtype == want[key].dtype, key
                np.testing.assert_array_equal(got[key], want[key], err_msg=key, strict=True)
