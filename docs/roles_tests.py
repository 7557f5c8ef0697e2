"""The tests' size on skewed scores, and how the paper's, the authors' and bertjax's tests decide.

    python docs/roles_tests.py                 # the size table of docs/roles.md
    python docs/roles_tests.py ROLES_RUN_DIR   # also: the tests' decisions on a run's scores.npz

Size: the share of samples of N = 200 per-sequence scores, drawn with a true mean exactly τ, that
a test at α = 0.05 assigns (4000 samples per population, seed 20210202; the bootstrap-t with 999
resamples, seed 3). A calibrated test has size 0.05.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
from scipy import special

from sieves import stats

ALPHA, TAU, N, SAMPLES, SEED = 0.05, 3.0, 200, 4000, 20210202
POPULATIONS = {
    "exponential": lambda rng, size: rng.exponential(1.0, size) - 1.0,
    "lognormal σ 0.75": lambda rng, size: rng.lognormal(0.0, 0.75, size) - math.exp(0.75**2 / 2),
    "lognormal σ 1": lambda rng, size: rng.lognormal(0.0, 1.0, size) - math.exp(0.5),
}


def sizes() -> None:
    print("| population (centred at τ) | skew | t-test (ddof 1) | bootstrap-t |")
    print("| --- | --- | --- | --- |")
    for name, draw in POPULATIONS.items():
        for direction, skew in ((1, "right"), (-1, "left")):
            x = TAU + direction * draw(np.random.default_rng(SEED), (N, SAMPLES))
            t = (stats.one_sided_test(x, TAU).p_value < ALPHA).mean()
            boot = (stats.one_sided_test(x, TAU, test="bootstrap", replicates=999, seed=3).p_value < ALPHA).mean()
            print(f"| {name} | {skew} | {t:.3f} | {boot:.3f} |")


def decisions(run: Path) -> None:
    """Heads holding each role under the four tests, on the run's per-sequence scores."""
    tau = float(json.loads((run / "run.json").read_text())["tau"])
    print(f"\n{run}: heads holding each role (τ = {tau:g}, α = {ALPHA})")
    print("| task/role | n | paper: z, ddof 1 | authors: t tail, ddof 0 | bertjax: t, ddof 1 | bootstrap-t |")
    print("| --- | --- | --- | --- | --- | --- |")
    with np.load(run / "scores.npz") as scores:
        for key in sorted(k for k in scores.files if k.count("/") == 1):
            x = scores[key].astype(np.float64)
            n = x.shape[0]
            if n < 2:
                continue
            mean, sd0 = x.mean(0), x.std(0, ddof=0)
            with np.errstate(divide="ignore", invalid="ignore"):
                authors = special.stdtr(n - 1, -(mean - tau) / (sd0 / math.sqrt(n))) < ALPHA
            z = stats.one_sided_test(x, tau, test="z").p_value < ALPHA
            t = stats.one_sided_test(x, tau).p_value < ALPHA
            boot = stats.one_sided_test(x, tau, test="bootstrap").p_value < ALPHA
            print(f"| {key} | {n} | {int(z.sum())} | {int(authors.sum())} | {int(t.sum())} | {int(boot.sum())} |")


if __name__ == "__main__":
    sizes()
    for arg in sys.argv[1:]:
        decisions(Path(arg))
