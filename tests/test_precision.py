"""The matrix products' precision (docs/precision.md): the analyses' `--precision`, resolved,
refused when unknown, applied where the forward passes are traced, recorded in run.json; and
run.json's identity of the code (`git_diff_sha256`). Training's `matmul_precision`: tests/test_train.py."""

from __future__ import annotations

import contextlib
import hashlib
import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from analysis import api
from analysis import roles as roles_cli
from analysis.ablation import kovaleva, michel
from analysis.ablation.options import KovalevaConfig, MichelConfig
from analysis.attention import pipeline as clark_pipeline
from analysis.attention.options import ClarkConfig
from analysis.common import forward
from analysis.heads import finetuning, pipeline, scoring, tracking
from analysis.heads.config import RolesConfig
from bertjax import runinfo
from bertjax.errors import UserError
from bertjax.precision import MATMUL_PRECISIONS


def _settings(shared_data: Path, cache: Path) -> dict:
    return dict(task="mrpc", glue_dir=str(shared_data / "glue"), n=12, batch_size=8, max_length=32,
                cache_dir=str(cache), figures="none")  # fmt: skip


def test_the_precision_setting_resolves_and_refuses_an_unknown_one(cli_error):
    for schema in (RolesConfig, ClarkConfig, KovalevaConfig, MichelConfig):
        assert schema.__dataclass_fields__["precision"].default == "float32", schema
    assert api.roles_config("ckpt", {"precision": "tf32"}).precision == "tf32"
    with pytest.raises(UserError, match=r"^--precision must be one of float32, tf32, bfloat16, got 'fp8'$"):
        api.roles_config("ckpt", {"precision": "fp8"})
    assert "--precision: invalid choice: 'fp8'" in cli_error(roles_cli.main, ["--ckpt", "x", "--precision", "fp8"])


def _dot_precisions(fn, *args) -> list[str]:
    """The precision of each dot product in `fn`'s lowered program, as jit traces it here."""
    lines = [line for line in jax.jit(fn).lower(*args).as_text().splitlines() if "dot_general" in line]
    return ["bf16 operands" if "lhs_precision_type = bf16" in line else line.split("precision = [")[1].split(",")[0]
            for line in lines]  # fmt: skip


@pytest.mark.parametrize("name,expected", [("float32", "HIGHEST"), ("tf32", "HIGH"), ("bfloat16", "bf16 operands")])
def test_a_tools_computation_traces_its_products_at_its_precision(name, expected):
    """What `at_precision` wraps is traced under the named precision, and a jitted function called
    inside is traced anew for it (jit keys its cache on the precision), whatever was compiled
    outside: JAX's default (DEFAULT) before and after."""
    x = jnp.arange(12.0, dtype=jnp.float32).reshape(3, 4)
    product = jax.jit(lambda a: a @ a.T)
    seen = []

    def record(a):
        seen.append(jax.config.jax_default_matmul_precision)
        return a @ a.T

    @forward.at_precision("roles.precision")
    def compute(config):
        product(x)  # compiled outside first, below: must be traced again in here
        return _dot_precisions(record, x)

    product(x)
    config = type("Track", (), {"roles": RolesConfig(ckpt="x", precision=name)})()
    assert compute(config) == [expected]
    assert seen == [MATMUL_PRECISIONS[name]]
    assert _dot_precisions(record, x) == ["DEFAULT"]  # the context ended with the computation


def test_float32_products_on_a_cpu_are_float32_whatever_the_setting():
    """On a CPU XLA multiplies float32 in float32 at every precision (it ignores the level and the
    bf16 algorithm): each setting's product is the float64 one to float32 rounding, n·eps·|a||b|
    for n = 256 terms, where bf16 operands (8 bits) would be ~2⁻⁸·|a||b| off."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((256, 256)).astype(np.float32) for _ in range(2))
    exact = a.astype(np.float64) @ b.astype(np.float64)
    bound = 256 * np.finfo(np.float32).eps * (np.abs(a).astype(np.float64) @ np.abs(b))
    bf16 = np.asarray(jnp.asarray(a, jnp.bfloat16).astype(np.float32)) @ np.asarray(jnp.asarray(b, jnp.bfloat16).astype(np.float32))  # fmt: skip
    assert np.any(np.abs(bf16 - exact) > bound)  # the bound tells bf16 operands apart
    for name in MATMUL_PRECISIONS:
        with forward.matmul_precision(name):
            got = np.asarray(jax.jit(jnp.matmul)(a, b))
        assert np.all(np.abs(got - exact) <= bound), name


def test_every_analysis_computes_under_its_precision(monkeypatch):
    """The one function of each tool that its CLI and its API both run enters the precision its
    config names, read where that tool's config holds it, before it does anything else."""

    class Entered(Exception):
        pass

    def enter(name):
        raise Entered(name)

    monkeypatch.setattr(forward, "matmul_precision", enter)
    own = SimpleNamespace(precision="tf32")
    for compute, config in ((pipeline.compute, own), (tracking.compute_members, SimpleNamespace(roles=own)),
                            (finetuning._compute, SimpleNamespace(data=own)), (clark_pipeline._compute, own),
                            (kovaleva._compute, own), (michel._compute, own)):  # fmt: skip
        with pytest.raises(Entered, match=r"^tf32$"):
            compute(config, *[None] * 6)


def _spy_on_scoring(monkeypatch) -> list:
    """The precision in force each time the scorer is traced (a fresh compile cache, so it is)."""
    seen = []
    kernel = scoring.sieve_scores

    def spy(*args, **kwargs):
        seen.append(jax.config.jax_default_matmul_precision)
        return kernel(*args, **kwargs)

    monkeypatch.setattr(forward, "_COMPILED", {})
    monkeypatch.setattr(scoring, "sieve_scores", spy)
    return seen


def test_roles_scores_under_its_precision_and_records_it(tiny_hf, shared_data, tmp_path, monkeypatch):
    seen = _spy_on_scoring(monkeypatch)
    settings = _settings(shared_data, tmp_path / "parses")
    api.roles(str(tiny_hf), out=tmp_path / "bf16", precision="bfloat16", **settings)
    assert set(seen) == {"BF16_BF16_F32"}
    assert json.loads((tmp_path / "bf16" / "run.json").read_text())["config"]["precision"] == "bfloat16"
    seen.clear()
    api.roles(str(tiny_hf), out=tmp_path / "default", **settings)
    assert set(seen) == {"highest"}
    assert json.loads((tmp_path / "default" / "run.json").read_text())["config"]["precision"] == "float32"


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="JAX's default is true float32 on a CPU only")
def test_float32_scores_equal_jax_defaults_on_a_cpu(tiny_hf, shared_data, tmp_path, monkeypatch):
    """`--precision float32` (HIGHEST) changes no bit of a CPU run against JAX's default level,
    which every run before the setting used: the recorded outputs stay as they were."""
    settings = _settings(shared_data, tmp_path / "parses")
    ours = api.roles(str(tiny_hf), **settings)
    monkeypatch.setattr(forward, "matmul_precision", lambda name: contextlib.nullcontext())
    theirs = api.roles(str(tiny_hf), **settings)
    for role, scores in ours.scores["mrpc"].items():
        np.testing.assert_array_equal(scores, theirs.scores["mrpc"][role], err_msg=role, strict=True)


def _git(repo: Path, *args: str) -> bytes:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                          capture_output=True).stdout  # fmt: skip


def test_run_json_names_the_uncommitted_diff(tmp_path, monkeypatch):
    """Clean: None; dirty: the sha256 of `git diff HEAD --binary` as bytes (a Latin-1 line is no
    UTF-8, a binary file's change is in the diff); not a checkout: None."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "code.py").write_text("x = 1\n")
    (repo / "weights.bin").write_bytes(bytes(range(256)))
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "first")
    # git reads the repository from these wherever `runinfo` runs it.
    monkeypatch.setenv("GIT_DIR", str(repo / ".git"))
    monkeypatch.setenv("GIT_WORK_TREE", str(repo))
    assert runinfo.versions()["git_dirty"] is False and runinfo.versions()["git_diff_sha256"] is None
    (repo / "code.py").write_bytes("x = 2  # café\n".encode("latin-1"))
    (repo / "weights.bin").write_bytes(bytes(range(255, -1, -1)))
    diff = _git(repo, "diff", "HEAD", "--binary")
    assert b"GIT binary patch" in diff
    found = runinfo.versions()
    assert found["git_dirty"] is True and found["git_diff_sha256"] == hashlib.sha256(diff).hexdigest()
    (repo / "code.py").write_text("x = 3\n")
    assert runinfo.git_diff_sha256() != found["git_diff_sha256"]
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "nothing"))
    assert runinfo.git_diff_sha256() is None and runinfo.git_dirty() is None
