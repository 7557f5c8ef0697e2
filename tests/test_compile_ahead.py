"""`DataParallel.compile_ahead`: a task's padded shapes compiled side by side in worker threads
before its first batch, and the calls then running those programs without compiling again."""

from __future__ import annotations

import dataclasses
import threading
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.dispatch import BACKEND_COMPILE_EVENT

import bertjax
from analysis.common import examples, forward
from analysis.heads import config as roles_config
from analysis.heads import finetuning, scoring


@pytest.fixture
def compiles():
    """The threads in which XLA compiled a program, one entry per backend compile."""
    threads: list[str] = []

    def listen(event: str, duration: float, **_) -> None:
        if event == BACKEND_COMPILE_EVENT:
            threads.append(threading.current_thread().name)

    jax.monitoring.register_event_duration_secs_listener(listen)
    yield threads
    jax.monitoring.unregister_event_duration_listener(listen)


@partial(jax.jit, static_argnames=("scale",))
def _weighted(state, x, y, scale=1.0):
    return (state["w"] * x).sum(axis=-1) * scale + y.mean()


def _inputs(rows: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(length)
    return rng.normal(size=(rows, length)).astype(np.float32), rng.normal(size=(rows,)).astype(np.float32)


@pytest.mark.parametrize("devices", [None, "local"])
def test_the_calls_run_the_programs_compiled_ahead(compiles, devices):
    # Shapes no other test uses, so that nothing is in jit's cache before.
    lengths, rows = (7, 13, 21), 3 if devices is None else 5
    parallel = forward.DataParallel(
        _weighted, {"w": np.float32(2.0)}, None if devices is None else forward.Devices.local(), (0, 0), {"scale": 3.0}
    )
    parallel.compile_ahead(_inputs(rows, length) for length in lengths)
    forward.concurrent.futures.wait(list(forward._AHEAD.values()))
    ahead = list(compiles)
    outputs = [np.asarray(parallel(*_inputs(rows, length))) for length in lengths]
    assert len(ahead) == len(lengths) and all(name.startswith("compile-ahead") for name in ahead)
    assert compiles == ahead  # no call compiled again
    parallel.compile_ahead(_inputs(rows, length) for length in lengths)
    assert compiles == ahead  # asked again: nothing lowered or compiled
    for length, out in zip(lengths, outputs, strict=True):
        x, y = _inputs(rows, length)
        np.testing.assert_array_equal(out, np.asarray(_weighted({"w": np.float32(2.0)}, x, y, scale=3.0)))


def test_a_program_compiled_for_other_static_choices_is_compiled_again_at_the_call(compiles):
    # The planted defect: compiled ahead under another static choice, which the call's key must not
    # take for its own (the call compiles, in the calling thread, and computes with its own choice).
    ahead = forward.DataParallel(_weighted, {"w": np.float32(2.0)}, None, (0, 0), {"scale": 5.0})
    ahead.compile_ahead([_inputs(4, 9)])
    forward.concurrent.futures.wait(list(forward._AHEAD.values()))
    called = forward.DataParallel(_weighted, {"w": np.float32(2.0)}, None, (0, 0), {"scale": 1.0})
    x, y = _inputs(4, 9)
    out = np.asarray(called(x, y))
    assert len(compiles) == 2 and compiles[-1] == threading.current_thread().name
    np.testing.assert_array_equal(out, np.asarray(_weighted({"w": np.float32(2.0)}, x, y, scale=1.0)))


def test_a_function_jit_did_not_build_is_called_as_before(compiles):
    parallel = forward.DataParallel(lambda state, x: jnp.sum(x) * state, 2.0, None, (0,))
    parallel.compile_ahead([(np.ones(11, np.float32),)])
    assert compiles == []
    assert float(parallel(np.ones(11, np.float32))) == 22.0


def test_a_task_is_scored_with_every_padded_length_compiled_ahead(tiny_hf, shared_data, tmp_path, compiles):
    config = roles_config.RolesConfig(
        ckpt=str(tiny_hf), task=("sst2",), glue_dir=str(shared_data / "glue"), n=40, batch_size=6
    )
    # A model of its own (one layer fewer than other tests' tiny ones), so that no program is cached.
    model = bertjax.init_model(bertjax.preset("tiny", max_position_embeddings=128, num_hidden_layers=3))
    tokenizer = bertjax.load_tokenizer(str(tiny_hf))
    parser = examples.make_parser(dataclasses.replace(config, cache_dir=str(tmp_path)))
    seqs = examples.encode_tasks(config, examples.load_tasks(config, ["sst2"]), tokenizer, parser, {})["sst2"]
    lengths = forward.padded_lengths(seqs, config.batch_size, config.max_length)
    assert len(lengths) > 1  # several shapes, or the test shows nothing
    scorer = scoring.make_scorer(model, scoring.entropy_roles(config))
    compiles.clear()  # the model's initialisation
    ahead = scoring.score_task(scorer, seqs, config, "sst2")
    assert len(compiles) == len(lengths) and all(name.startswith("compile-ahead") for name in compiles)
    # The same scores as calls that compile at the call, in the calling thread.
    plain = forward.DataParallel(
        lambda state, *arrays: scorer.fn(state, *arrays, **scorer.static), scorer.state, None, ()
    )
    at_the_call = scoring.score_task(plain, seqs, config, "sst2")
    for role in ahead.scores:
        np.testing.assert_array_equal(ahead.scores[role], at_the_call.scores[role])
        np.testing.assert_array_equal(ahead.indices[role], at_the_call.indices[role])


def test_finetune_effect_compiles_its_padded_lengths_ahead(tiny_hf, shared_data, tmp_path, compiles):
    config = roles_config.RolesConfig(
        ckpt=str(tiny_hf), task=("sst2",), glue_dir=str(shared_data / "glue"), n=40, batch_size=6
    )
    # Models of their own size, so that no program is cached.
    pre, post = (
        bertjax.init_model(bertjax.preset("tiny", max_position_embeddings=128, num_hidden_layers=5), seed=seed)
        for seed in (0, 1)
    )
    tokenizer = bertjax.load_tokenizer(str(tiny_hf))
    parser = examples.make_parser(dataclasses.replace(config, cache_dir=str(tmp_path)))
    seqs = examples.encode_tasks(config, examples.load_tasks(config, ["sst2"]), tokenizer, parser, {})["sst2"]
    comparer = finetuning.make_comparer(pre, post)
    compiles.clear()  # the models' initialisation
    finetuning.compare_task(comparer, seqs, config, "sst2")
    lengths = forward.padded_lengths(seqs, config.batch_size, config.max_length)
    assert len(compiles) == len(lengths) and all(name.startswith("compile-ahead") for name in compiles)
