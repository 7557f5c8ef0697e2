"""Reliability round four (issue 52): config files, the command line's early refusals, and what the
library prints into a user's own program.

Config files: one that is not UTF-8 was a traceback in every command; a track config's `shard:
[5, 2]` a ValueError; `${oc.env:HOME}` was kept literally by the analyses (a folder named
`${oc.env:HOME}`); `n: ???` became the default; a long list without aliases was refused as an alias
bomb; and what `--print-config` wrote could not be read back without the required flag.
Mistakes that need no model were refused only after JAX, flax and transformers had loaded.
orbax's "Given directory is read only" and transformers' "PyTorch was not found" reached a Python
user, and bertjax's warnings came out in Python's default `WARNING:name:` format."""

from __future__ import annotations

import importlib
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from test_settings import COMMANDS

from bertjax import settings
from bertjax.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
# What a refusal that needs no model must not wait for.
HEAVY = ("jax", "flax", "orbax", "transformers", "torch")


def _config(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "settings.yaml"
    if isinstance(text, str):
        path.write_text(text, encoding="utf-8")
    else:
        path.write_bytes(text)
    return path


# -- config files ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", COMMANDS)
def test_a_config_file_that_is_not_utf8_is_one_line_in_every_analysis(name, tmp_path):
    path = _config(tmp_path, b"n: 5\nout: caf\xe9\n")
    inputs, _, _ = COMMANDS[name]
    with pytest.raises(UserError, match=r"not UTF-8 text \(byte 13\)"):
        importlib.import_module(name).parse_args([*inputs, "--config", str(path)])


def test_a_config_file_that_is_not_utf8_is_one_line_in_training(tmp_path):
    from train import finetune, pretrain

    path = _config(tmp_path, b"train:\n  steps: 3 # \xff\n")
    with pytest.raises(UserError, match="not UTF-8 text"):
        pretrain.main(["--config", str(path), "--workdir", str(tmp_path / "w")])
    with pytest.raises(UserError, match="not UTF-8 text"):
        finetune.main(["--task", "mrpc", "--ckpt", "c", "--workdir", str(tmp_path / "w"), "--config", str(path)])
    assert not (tmp_path / "w").exists()


def test_a_config_that_is_a_pipe_or_a_directory_is_refused_as_such(tmp_path):
    """Before: a FIFO given as --config was called a file that does not exist."""
    import os

    from analysis import roles
    from train import pretrain

    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    for path in (fifo, tmp_path):
        with pytest.raises(UserError, match=r"not a regular file \(a pipe, device or directory\)"):
            roles.parse_args(["--ckpt", "c", "--config", str(path)])
        with pytest.raises(UserError, match=r"not a regular file \(a pipe, device or directory\)"):
            pretrain.main(["--config", str(path), "--workdir", str(tmp_path / "w")])
    with pytest.raises(UserError, match="config file does not exist"):
        roles.parse_args(["--ckpt", "c", "--config", str(tmp_path / "none.yaml")])


@pytest.mark.parametrize("shard", ["[5, 2]", "[2, 2]", "[-1, 2]"])
def test_a_track_config_with_a_shard_out_of_range_is_one_line(shard, tmp_path):
    from analysis import track

    path = _config(tmp_path, f"shard: {shard}\n")
    with pytest.raises(UserError, match=r"give \[I, N\] with 0 ≤ I < N"):
        track.parse_args(["--run", "w", "--config", str(path)])
    good = _config(tmp_path, "shard: [1, 2]\n")
    assert track.parse_args(["--run", "w", "--config", str(good)])[0].shard == (1, 2)


def test_an_environment_variable_in_an_analysis_config_is_resolved_as_in_training(tmp_path, monkeypatch):
    from analysis import roles
    from train.config import PretrainConfig

    monkeypatch.setenv("BERTJAX_R4_HOME", str(tmp_path))
    path = _config(tmp_path, "out: ${oc.env:BERTJAX_R4_HOME}/x\ncache_dir: ${out}/cache\n")
    config = roles.parse_args(["--ckpt", "c", "--config", str(path)])
    assert (config.out, config.cache_dir) == (f"{tmp_path}/x", f"{tmp_path}/x/cache")
    # The training configs, as they always have (the shipped recipes read ${oc.env:BERTJAX_DATA,...}).
    train_path = _config(tmp_path, "data_dir: ${oc.env:BERTJAX_R4_HOME}/shards\n")
    assert settings.load_config(PretrainConfig, train_path).data_dir == f"{tmp_path}/shards"
    with pytest.raises(UserError, match="BERTJAX_R4_UNSET"):
        roles.parse_args(["--ckpt", "c", "--config", str(_config(tmp_path, "out: ${oc.env:BERTJAX_R4_UNSET}\n"))])


def test_a_missing_value_marker_is_refused_not_taken_for_the_default(tmp_path):
    from analysis import roles
    from train.config import PretrainConfig

    path = _config(tmp_path, "n: ???\n")
    with pytest.raises(UserError, match=r"n: \?\?\? \(a missing value\) is no setting"):
        roles.parse_args(["--ckpt", "c", "--config", str(path)])
    with pytest.raises(UserError, match=r"train.steps: \?\?\? \(a missing value\)"):
        settings.load_config(PretrainConfig, _config(tmp_path, "train:\n  steps: ???\n"))


def test_a_long_list_without_aliases_is_read_and_an_alias_bomb_is_refused(tmp_path):
    from analysis import track

    steps = list(range(30_000))  # 30,000 nodes: over OmegaConf's default cap of 10,000
    path = _config(tmp_path, "steps:\n" + "".join(f"- {s}\n" for s in steps))
    assert track.parse_args(["--run", "w", "--config", str(path)])[0].steps == tuple(steps)
    bomb = 'a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]\n' + "".join(
        f"{new}: &{new} [{', '.join([f'*{old}'] * 9)}]\n" for old, new in zip("abcdef", "bcdefg", strict=True)
    )  # 9**7 = 4.8 million strings from 500 bytes
    with pytest.raises(UserError, match="an alias bomb"):
        track.parse_args(["--run", "w", "--config", str(_config(tmp_path, bomb))])


# The commands whose required settings a config file may give instead of the command line.
REQUIRED = {name: COMMANDS[name] for name in ("analysis.roles", "analysis.clark", "analysis.ablate",
                                              "analysis.prune", "analysis.report")}  # fmt: skip


@pytest.mark.parametrize("name", REQUIRED)
def test_what_print_config_writes_runs_with_config_alone(name, tmp_path, capsys):
    inputs, given, _ = REQUIRED[name]
    module = importlib.import_module(name)
    first = module.parse_args([*inputs, *given])
    with pytest.raises(SystemExit):
        module.parse_args([*inputs, *given, "--print-config"])
    path = _config(tmp_path, capsys.readouterr().out)
    assert module.parse_args(["--config", str(path)]) == first
    # Neither the file nor the command line: the flag is named, as argparse names it without --config.
    text = path.read_text(encoding="utf-8").splitlines()
    path.write_text("\n".join(line for line in text if not line.startswith(("ckpt:", "run_dir:"))) + "\n")
    with pytest.raises(UserError, match=r"the following arguments are required: (--ckpt|RUN_DIR)"):
        module.parse_args(["--config", str(path)])
    with pytest.raises(SystemExit):  # without --config the flag is required of the command line, as before
        module.parse_args([])


# -- refusals before the heavy imports -------------------------------------------------------

_REFUSE = """
import sys
from bertjax import cli
module = __import__(sys.argv[1], fromlist=["main"])
try:
    cli.run(module.main, sys.argv[2:])
except SystemExit as done:
    print(done.code)
print(sorted(m for m in sys.modules if m.split(".")[0] in {heavy!r}))
"""


def _refused(module: str, *argv: str, cwd: Path) -> tuple[str, str]:
    """What `python -m MODULE ARGV` says on stderr, and the heavy modules it had imported by then."""
    done = subprocess.run([sys.executable, "-c", _REFUSE.format(heavy=HEAVY), module, *argv], cwd=cwd,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    code, loaded = done.stdout.splitlines()[-2:]
    assert code == "2", done.stderr
    return done.stderr.strip(), loaded


def _fake_run(path: Path, steps) -> Path:
    """A training run's checkpoint folders as `bertjax.steps` finds them (no weights needed)."""
    for step in steps:
        (path / "checkpoints" / str(step) / "meta").mkdir(parents=True)
    return path


@pytest.mark.parametrize(
    ("module", "argv", "message"),
    [
        ("analysis.roles", ["--ckpt", "c", "--out", "{full}"], "--out {full} is not empty; pass --overwrite"),
        ("analysis.roles", ["--ckpt", "c", "--task", "mrcp"], "unknown task 'mrcp' (--task)"),
        ("analysis.roles", ["--ckpt", "c", "--task", "mrpc", "--glue-dir", "{tmp}"], "GLUE file not found: {tmp}/MRPC/dev.tsv"),
        ("analysis.roles", ["--ckpt", "{run}", "--step", "300"], "no checkpoint for step 300; available: [10, 40]"),
        ("analysis.track", ["--run", "{run}", "--out", "{full}"], "--out {full} is not empty"),
        ("analysis.track", ["--run", "{run}", "--run", "{run2}", "--out", "{full}"], "--out {full} is not empty"),
        ("analysis.finetune_effect", ["--pre", "c", "--post", "d", "--task", "mrcp"], "unknown task 'mrcp'"),
        ("analysis.clark", ["--ckpt", "{run}", "--step", "300"], "no checkpoint for step 300"),
        ("analysis.ablate", ["--ckpt", "c", "--task", "mrpc,mrcp"], "unknown task 'mrcp'"),
        ("analysis.prune", ["--ckpt", "c", "--out", "{full}"], "--out {full} is not empty"),
        ("train.finetune", ["--task", "mrcp", "--ckpt", "c", "--workdir", "{tmp}/w"], "unknown task 'mrcp'"),
        ("train.finetune", ["--task", "mrpc", "--ckpt", "c", "--workdir", "{tmp}/w", "--glue-dir", "{tmp}"],
         "GLUE file not found: {tmp}/MRPC/train.tsv"),
    ],
)  # fmt: skip
def test_a_mistake_that_needs_no_model_is_refused_before_jax_loads(module, argv, message, tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    (full / "notes.txt").write_text("mine\n")
    names = {
        "full": full,
        "tmp": tmp_path,
        "run": _fake_run(tmp_path / "run", (10, 40)),
        "run2": _fake_run(tmp_path / "run2", (5,)),
    }
    error, loaded = _refused(module, *(a.format(**names) for a in argv), cwd=tmp_path)
    assert error.startswith("error: ") and "\n" not in error
    assert message.format(**names) in error
    assert loaded == "[]", f"refused only after importing {loaded}"
    assert (full / "notes.txt").read_text() == "mine\n"


# -- what the library prints into a user's program --------------------------------------------


def test_from_pretrained_on_a_training_run_does_not_restate_the_read_only_directory(
    shared_data, tmp_path, caplog, capfd
):
    from test_track import write_run

    import bertjax

    run = write_run(tmp_path / "run", shared_data, (1, 3))
    with caplog.at_level(logging.INFO):
        bertjax.from_pretrained(run)
        bertjax.from_pretrained(run, step=1)
    assert not [r for r in caplog.records if "read only" in r.getMessage()]
    assert "read only" not in capfd.readouterr().err


_SESSION = """
import logging, sys
sys.modules["torch"] = None  # a session without torch
{configure}
import bertjax
from analysis import api
handlers = list(logging.getLogger().handlers)
import orbax.checkpoint  # its first absl call gives the root logger Python's default handler
from transformers import AutoTokenizer  # what api.roles imports to read a checkpoint's tokenizer
logging.getLogger("analysis.heads.pipeline").warning("a warning from the API")
logging.getLogger("analysis.heads.pipeline").info("progress, not shown")
print(len(handlers))
"""


@pytest.mark.parametrize("configured", [False, True])
def test_a_python_session_sees_bertjax_warnings_in_its_format_and_no_torch_notice(configured, tmp_path):
    configure = 'logging.basicConfig(format="MINE %(name)s %(message)s")' if configured else ""
    code = _SESSION.format(configure=configure)
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "PyTorch was not found" not in done.stderr
    assert "WARNING:analysis" not in done.stderr and "progress, not shown" not in done.stderr
    if configured:  # the program's own logging: bertjax's lines go to it, as they always did
        assert "MINE analysis.heads.pipeline a warning from the API" in done.stderr
        assert done.stdout.split() == ["1"]
    else:  # bertjax's format, and the root logger left as bertjax found it
        assert " WARNING analysis.heads.pipeline: a warning from the API" in done.stderr
        assert done.stdout.split() == ["0"]
    assert done.stderr.count("a warning from the API") == 1
