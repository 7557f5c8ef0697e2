"""Benchmark 12: what `--attention norms` and `both` add to `analysis.roles`' forward passes.

The scoring stage of `analysis.roles` (per batch: the sieve masks, the jitted forward pass with β for
every role, layer and head, the scores back to the host) over the same encoded sequences, once per
`--attention` source: `weights` (the default program), `norms` (β on Kobayashi et al.'s
norm-weighted attention: the per-head value norms ‖f_h(x_j)‖ computed in the forward pass) and
`both` (β on each from one forward pass). One untimed pass per source compiles its shapes; the timed
passes then alternate the sources, so a noisy stretch of the machine hits all three.

    python -m benchmarks.attention_norms --glue-dir ../shared/data/glue     # MiniLM, 4 tasks
"""

from __future__ import annotations

import time

from analysis.common.examples import encode_tasks, fit_max_length, load_tasks, make_parser
from analysis.common.flags import ATTENTION_SOURCES, attention_readings
from analysis.heads.config import RolesConfig, config_tasks
from analysis.heads.scoring import make_scorer, score_readings
from benchmarks import common
from bertjax import cli
from bertjax.pretrained import from_pretrained, load_tokenizer
from bertjax.settings import comma_list


def run(args) -> list[dict]:
    config = RolesConfig(ckpt=args.ckpt, task=args.task, glue_dir=args.glue_dir, n=args.n, batch_size=args.batch_size,
                         cache_dir=args.cache_dir or RolesConfig.cache_dir)  # fmt: skip
    model, tokenizer = from_pretrained(args.ckpt), load_tokenizer(args.ckpt)
    config = fit_max_length(config, model.config.max_sequence_length)
    data = load_tasks(config, config_tasks(config))
    sequences = encode_tasks(config, data, tokenizer, make_parser(config), {})
    scorers = {source: make_scorer(model, readings=attention_readings(source)) for source in ATTENTION_SOURCES}

    def score(source: str) -> float:
        clock = time.perf_counter()
        # The scores reach the host batch by batch (np.asarray), so the pass has ended when it returns.
        score_readings(scorers[source], sequences, config, {}, attention_readings(source))
        return time.perf_counter() - clock

    for source in ATTENTION_SOURCES:
        common.log(f"untimed pass: compiles {source}")
        score(source)
    times: dict[str, list[float]] = {source: [] for source in ATTENTION_SOURCES}
    for _ in range(args.repeat):
        for source in ATTENTION_SOURCES:
            times[source].append(score(source))
    settings = {
        "model": args.ckpt,
        "tasks": {task: len(seqs) for task, seqs in sequences.items()},
        "n_sequences": sum(len(s) for s in sequences.values()),
        "batch_size": args.batch_size,
    }
    stats = {source: common.summary(t) for source, t in times.items()}
    lines = [common.emit("attention_norms", side=source, **settings, **stats[source]) for source in ATTENTION_SOURCES]
    base = stats["weights"]["median_s"]
    added = {source: stats[source]["median_s"] / base - 1 for source in ("norms", "both")}
    return [*lines, common.emit("attention_norms", side="added", **settings, added=added, target=0.15)]


def parse_args(argv: list[str] | None):
    p = common.arguments(__doc__.split("\n\n")[0], repeat=3)
    p.add_argument("--ckpt", help="checkpoint (default: all-MiniLM-L6-v2 from the test extra)")
    p.add_argument("--task", default="all", type=comma_list, help="tasks, as analysis.roles --task")
    p.add_argument("--glue-dir", required=True)
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--cache-dir", help="parse cache (default: analysis.roles')")
    a = p.parse_args(argv)
    a.ckpt = a.ckpt or common.minilm_checkpoint()
    return a


def main(argv: list[str] | None = None) -> None:
    cli.use_compilation_cache()
    run(parse_args(argv))


if __name__ == "__main__":
    cli.run(main)
