"""Michel et al. 2019 §4 (`python -m analysis.prune`): head importance from ∂L/∂ξ, iterative
pruning by importance against random orders, and how many heads go before a one-point drop.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.ablation.evaluation import (
    ONE_POINT,
    MaskedEvaluator,
    check_classifier,
    full_mask,
    load_eval_set,
)
from analysis.ablation.figures import head_heatmap, plot_pruning
from analysis.ablation.options import MichelConfig
from analysis.common.examples import fit_max_length
from analysis.common.flags import select_formats
from analysis.common.forward import Devices, at_precision
from analysis.common.writing import write_tables_run
from analysis.tools import FigureJob
from bertjax import runinfo
from bertjax.pretrained import Checkpoint
from bertjax.progress import tqdm

# What `.bertjax-output` says of this tool's `--out` (`runinfo.atomic_out`): only its kind is replaced.
PRUNE_OUTPUT = "prune output"


def normalise_per_layer(importance: np.ndarray) -> np.ndarray:
    """Each layer's row scaled to unit L2 norm (an all-zero row stays zero)."""
    norms = np.linalg.norm(importance, axis=-1, keepdims=True)
    return np.divide(importance, norms, out=np.zeros_like(importance, dtype=float), where=norms > 0)


def pruning_counts(n_total: int, step: float) -> list[int]:
    """Heads pruned at each step: round(k · step · n_total) for k = 0, 1, … up to all heads."""
    steps = math.ceil(round(1.0 / step, 9))
    return sorted({min(n_total, round(k * step * n_total)) for k in range(steps + 1)} | {n_total})


@dataclasses.dataclass(frozen=True)
class PruneStep:
    heads_pruned: int
    metric: float
    mask: np.ndarray  # [L, H] float, 0 = pruned
    newly_pruned: tuple[int, ...] = ()  # flat indices (layer-major) masked at this step, in pruning order


def prune_in_order(
    order: Sequence[int] | np.ndarray,
    counts: Sequence[int],
    metric_fn: Callable[[np.ndarray], float],
    shape: tuple[int, int],
) -> list[PruneStep]:
    """Prunes heads (flat indices, layer-major) in a fixed order, measuring at each count."""
    steps = []
    previous = 0
    for count in counts:
        mask = full_mask(*shape).ravel()
        mask[list(order[:count])] = 0.0
        mask = mask.reshape(shape)
        steps.append(PruneStep(count, metric_fn(mask), mask, tuple(int(i) for i in order[previous:count])))
        previous = count
    return steps


def prune_by_importance(
    importance: np.ndarray,
    counts: Sequence[int],
    metric_fn: Callable[[np.ndarray], float],
    reestimate_fn: Callable[[np.ndarray], np.ndarray] | None = None,
) -> tuple[list[PruneStep], list[np.ndarray]]:
    """Michel's iterative pruning: at each step mask the least important heads still unpruned.

    `importance` [L, H] is the estimate at ξ = 1; with `reestimate_fn`, `reestimate_fn(mask)`
    replaces it after every step. Ties go to the lower flat index. Returns the steps and the
    importance estimates used.
    """
    mask = full_mask(*importance.shape)
    estimates = [importance]
    steps = []
    for count in counts:
        pruned = int((mask == 0).sum())
        chosen = np.array([], int)
        if count > pruned:
            if reestimate_fn is not None and pruned:
                estimates.append(reestimate_fn(mask))
            ranked = np.where(mask.ravel() > 0, estimates[-1].ravel(), np.inf)
            chosen = np.argsort(ranked, kind="stable")[: count - pruned]
            mask = mask.copy()
            mask.ravel()[chosen] = 0.0
        steps.append(PruneStep(count, metric_fn(mask), mask, tuple(int(i) for i in chosen)))
    return steps, estimates


def pruning_order(steps: Sequence[PruneStep], shape: tuple[int, int]) -> pd.DataFrame:
    """One row per head in the order it was pruned, with the curve point (`heads_pruned`) at which
    it was first masked: under --reestimate the order is not recoverable from any one estimate."""
    rows = [
        {"layer": flat // shape[1], "head": flat % shape[1], "heads_pruned": step.heads_pruned}
        for step in steps for flat in step.newly_pruned
    ]  # fmt: skip
    return pd.DataFrame(rows, columns=["layer", "head", "heads_pruned"]).rename_axis("rank").reset_index()


def heads_within(curve: pd.DataFrame, tolerance: float = ONE_POINT) -> int:
    """The most heads pruned with the metric never below (unpruned metric − tolerance) up to there."""
    curve = curve.sort_values("heads_pruned")
    baseline = curve["metric"].iloc[0]
    # A tiny slack absorbs float noise in metrics that are ratios of counts.
    ok = (curve["metric"] >= baseline - tolerance - 1e-12).cummin()
    return int(curve["heads_pruned"][ok].max())


def heads_within_per_seed(random_runs: pd.DataFrame, tolerance: float = ONE_POINT) -> dict:
    """`heads_within` of each random order on its own, and their median and range: the mean curve
    over seeds can stay within the tolerance where every single order has already left it."""
    per_seed = [heads_within(runs, tolerance) for _, runs in random_runs.groupby("seed")]
    return {"median": float(np.median(per_seed)), "min": min(per_seed), "max": max(per_seed), "per_seed": per_seed}


@dataclasses.dataclass(eq=False)
class MichelRun:
    """A prune run held in memory: `tables` by CSV name without `.csv` (pruning, and per task
    importance, pruning_order, pruning_random_seeds), `figures` (stem → a function drawing it into
    a folder), `result` (run.json's: the heads prunable within one point, the passes), the line
    the CLI prints, `info` (run.json's provenance and settings, without the figures and the
    environment, which the writer adds), the timings so far and the clock the run started at."""

    config: MichelConfig
    tables: dict[str, pd.DataFrame]
    figures: dict[str, Callable[[Path], list[Path]]]
    result: dict
    line: str
    info: dict
    timings: dict[str, float]
    started: float

    def text(self) -> str:
        return self.line

    def job(self, stem: str, out_dir: Path) -> FigureJob:
        """The drawing job of figure `stem` into `out_dir`: its function and arguments."""
        return self.figures[stem], (out_dir,)

    def draw(self, stem: str, out_dir: Path) -> list[Path]:
        """The figure `stem` into `out_dir`, in the `figure_formats` in force."""
        return self.figures[stem](out_dir)


def compute(config: MichelConfig, source: Checkpoint, model, tokenizer) -> MichelRun:
    """The whole analysis of `source` (`config.ckpt` opened) in memory; writes nothing. `model`
    and `tokenizer`: `config.ckpt` loaded (a BertForSequenceClassification with its classifier)."""
    started = time.perf_counter()
    select_formats(config.figure_format)
    return _compute(config, source, started, model, tokenizer)


def write(result: MichelRun, directory: Path) -> dict:
    """The one writer of a prune run (the CLI's and the API's): the tables, every figure (in the
    formats `result.config` asks for) and run.json, into `directory`; returns the run.json written."""
    return write_tables_run(result, directory)


@at_precision()
def _compute(config: MichelConfig, source: Checkpoint, started: float, model, tokenizer) -> MichelRun:
    timings: dict[str, float] = {}
    task, metric = config.task, config.metric_name
    clock = time.perf_counter()
    check_classifier(model, config.ckpt, source, [task])
    config = fit_max_length(config, model.config.max_sequence_length)
    shape = (model.config.num_hidden_layers, model.config.num_attention_heads)
    devices = Devices.local(config.devices)
    evaluator, importance_evaluator, files = evaluators_of(config, model, tokenizer, devices)
    timings["load"] = time.perf_counter() - clock

    tables: dict[str, pd.DataFrame] = {}
    clock = time.perf_counter()
    raw = importance_evaluator.mask_gradients()
    importance = normalise_per_layer(raw)
    timings["importance"] = time.perf_counter() - clock
    layers, heads = np.indices(shape)
    columns = {"layer": layers, "head": heads, "importance": importance, "importance_raw": raw}
    tables[f"{task}_importance"] = pd.DataFrame({k: v.ravel() for k, v in columns.items()})
    importance_examples = importance_evaluator.eval_set.size
    title = (f"{task}: head importance E|∂L/∂ξ| on {config.importance_split} ({importance_examples} examples), "
             "unit L2 norm per layer")  # fmt: skip
    figures: dict[str, Callable[[Path], list[Path]]] = {
        f"{task}_importance": functools.partial(head_heatmap, importance, title, "normalised importance",
                                                stem=f"{task}_importance")
    }  # fmt: skip

    clock = time.perf_counter()
    steps, estimates, random_steps = prune_orders(config, importance, shape, evaluator, importance_evaluator)
    timings["pruning"] = time.perf_counter() - clock
    curve, random_runs = pruning_tables(steps, random_steps, shape[0] * shape[1])
    if len(random_runs):
        tables[f"{task}_pruning_random_seeds"] = random_runs
    tables["pruning"] = curve
    tables[f"{task}_pruning_order"] = pruning_order(steps, shape)
    figures[f"{task}_pruning"] = functools.partial(plot_pruning, curve, random_runs, metric, task, config.split)

    within: dict = {"importance": heads_within(curve[curve["order"] == "importance"])}
    if len(random_runs):
        within["random"] = heads_within_per_seed(random_runs)
    result = {
        "task": task,
        "metric": metric,
        "split": config.split,
        "examples": evaluator.eval_set.size,
        "importance_set": {"split": config.importance_split, "examples": importance_examples},
        "baseline": evaluator.metrics(),
        "heads_prunable_within_one_point": within,
        "importance_estimates": len(estimates),
        "forward_passes": evaluator.forward_passes,
        "importance_passes": importance_evaluator.gradient_passes,
        "compiled_executables": sum(
            e.compiled_shapes() for e in {id(e): e for e in (evaluator, importance_evaluator)}.values()
        ),
        "data_files": [{"path": str(f), "sha256": runinfo.input_sha256(f)} for f in dict.fromkeys(files)],
    }
    timings["total"] = time.perf_counter() - started
    info = {
        "config": dataclasses.asdict(config),
        "checkpoint": source.describe(),
        "model_config": model.config.to_hf_dict(),
        "result": result,
        "figures": [],  # the writer's
        "mesh": devices.record(),
    }
    line = summary_line(task, metric, steps[0].metric, within, shape[0] * shape[1])
    return MichelRun(config, tables, figures, result, line, info, timings, started)


def evaluators_of(config: MichelConfig, model, tokenizer, devices: Devices):
    """The evaluator of the metric set and the one importance is estimated on (the same one when
    the two sets are), and the data files read."""
    glue_dir = None if config.glue_dir is None else Path(config.glue_dir)
    metric_set, files = load_eval_set(
        tokenizer, config.task, config.split, glue_dir, config.n, config.max_length, config.batch_size
    )  # fmt: skip
    evaluator = MaskedEvaluator(model, metric_set, devices, config.allow_nonfinite)
    if config.importance_split == config.split and config.importance_n == config.n:
        return evaluator, evaluator, files
    importance_set, more = load_eval_set(
        tokenizer, config.task, config.importance_split, glue_dir, config.importance_n,
        config.max_length, config.batch_size,
    )  # fmt: skip
    return evaluator, MaskedEvaluator(model, importance_set, devices, config.allow_nonfinite), files + more


def prune_orders(config: MichelConfig, importance: np.ndarray, shape: tuple[int, int], evaluator,
                 importance_evaluator) -> tuple[list[PruneStep], list, dict[int, list[PruneStep]]]:  # fmt: skip
    """The pruning by importance (re-estimated after each step with --reestimate) and in
    `config.random_seeds` random orders, with one progress bar over every step measured."""
    counts = pruning_counts(shape[0] * shape[1], config.prune_step)
    with tqdm(total=len(counts) * (1 + config.random_seeds), desc=f"{config.task} prune", unit="step") as progress:

        def measured(mask: np.ndarray) -> float:
            progress.update()
            return evaluator.metrics(head_mask=mask)[config.metric_name]

        def importance_fn(mask: np.ndarray) -> np.ndarray:
            return normalise_per_layer(importance_evaluator.mask_gradients(head_mask=mask))

        steps, estimates = prune_by_importance(
            importance, counts, measured, importance_fn if config.reestimate else None
        )
        random_steps = {
            seed: prune_in_order(np.random.default_rng(seed).permutation(shape[0] * shape[1]), counts, measured, shape)
            for seed in range(config.random_seeds)
        }
    return steps, estimates, random_steps


def pruning_tables(steps: Sequence[PruneStep], random_steps: dict[int, list[PruneStep]],
                   n_total: int) -> tuple[pd.DataFrame, pd.DataFrame]:  # fmt: skip
    """pruning.csv (the importance curve, then the random orders' mean) and the random orders' runs."""
    rows = [
        {"fraction_pruned": s.heads_pruned / n_total, "heads_pruned": s.heads_pruned, "metric": s.metric,
         "order": "importance"}
        for s in steps
    ]  # fmt: skip
    random_runs = pd.DataFrame(
        [{"seed": seed, "fraction_pruned": s.heads_pruned / n_total, "heads_pruned": s.heads_pruned, "metric": s.metric}
         for seed, run_steps in random_steps.items() for s in run_steps]
    )  # fmt: skip
    if len(random_runs):
        mean = random_runs.groupby(["fraction_pruned", "heads_pruned"], as_index=False)["metric"].mean()
        rows += [{**r, "order": "random"} for r in mean.to_dict("records")]
    return pd.DataFrame(rows, columns=["fraction_pruned", "heads_pruned", "metric", "order"]), random_runs


def summary_line(task: str, metric: str, unpruned: float, within: dict, n_total: int) -> str:
    """What the CLI prints: the unpruned metric and the heads prunable before a one-point drop."""
    summary = f"importance {within['importance']}/{n_total}"
    if "random" in within:
        r = within["random"]
        summary += (
            f", random median {r['median']:g}/{n_total} (range {r['min']}–{r['max']} over {len(r['per_seed'])} seeds)"
        )
    return f"{task}: unpruned {metric} {unpruned:.4f}; heads prunable before a one-point drop: {summary}"
