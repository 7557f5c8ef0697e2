"""Benchmark 2 (and 6b on a GPU): `analysis.roles` end to end against the forward passes alone.

Both sides see the same encoded sequences in the same length-sorted, bucket-padded batches. The
forward side is the model's jitted forward pass with attention probabilities (the form the analysis
needs), every batch dispatched and the last one waited for: the floor of any analysis. The end-to-end
side is `analysis.api.run_roles` exactly as the CLI runs it (load the checkpoint, read the data, encode
with cached parses, β for every role/layer/head, the tests, CSV/NPZ, figures, run.json). One
untimed run first fills the parse cache and compiles; the timed runs then alternate the two sides,
so a noisy stretch of the machine hits both.

Each `--tasks SPEC:SPLIT` is one `analysis.roles` run (e.g. `qnli,qqp:dev mrpc,sst2:train` gives
four tasks of up to 1000 sequences from the splits that have them); the lines report their sum.

    python -m benchmarks.roles_overhead --glue-dir ../shared/data/glue                 # MiniLM
    python -m benchmarks.roles_overhead --random-preset base --vocab VOCAB --glue-dir ...   # BERT-base
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path

import jax
from flax import nnx

from analysis.api import run_roles
from analysis.common.examples import encode_tasks, fit_max_length, load_tasks, make_parser
from analysis.common.flags import add_figure_arguments
from analysis.common.forward import padded_batches
from analysis.heads.config import DEFAULT_ROLES_FIGURES, ROLES_FIGURES, RolesConfig, config_tasks
from benchmarks import common
from bertjax import cli
from bertjax.pretrained import from_pretrained, load_tokenizer, open_checkpoint
from bertjax.settings import comma_list
from sieves.parse import Parse, parse_from_json, parse_to_json


class PreparsedParser:
    """Parses read from a JSON file written by `--export-parses`: lets a machine without spaCy
    (an accelerator box) run the analysis on exactly the parses made here."""

    def __init__(self, path: Path):
        payload = json.loads(Path(path).read_text())
        self.name, self.version = payload["name"], payload["version"]
        self.parses = {text: parse_from_json(words) for text, words in payload["parses"].items()}

    def parse(self, texts: list[str]) -> list[Parse]:
        return [self.parses[text] for text in texts]


def export_parses(configs: list[RolesConfig], path: Path) -> None:
    """The parses of every text the runs of `configs` analyse, as JSON for `PreparsedParser`."""
    parser = make_parser(configs[0])
    texts = []
    for config in configs:
        for data in load_tasks(config, config_tasks(config)).values():
            texts += [text for segments in data.segments for text in segments]
    texts = list(dict.fromkeys(texts))
    parses = {text: parse_to_json(words) for text, words in zip(texts, parser.parse(texts), strict=True)}
    Path(path).write_text(json.dumps({"name": parser.name, "version": parser.version, "parses": parses}))
    common.log(f"{len(parses)} parses written to {path}")


def forward_only(model: nnx.Module):
    graphdef, state = nnx.split(model)

    @jax.jit
    def forward(state, input_ids, attention_mask, token_type_ids):
        out = nnx.merge(graphdef, state)(input_ids, attention_mask, token_type_ids, output_attentions=True)
        return out.last_hidden_state, out.attentions

    return lambda *arrays: forward(state, *arrays)


def time_forward(forward, sequences, batch_size: int, max_length: int) -> float:
    clock = time.perf_counter()
    last = None
    for task, seqs in sequences.items():
        for _, arrays in padded_batches(seqs, batch_size, max_length, f"{task} forward"):
            last = forward(arrays["input_ids"], arrays["attention_mask"], arrays["token_type_ids"])
    jax.block_until_ready(last)
    return time.perf_counter() - clock


def analyse(configs: list[RolesConfig], parser) -> None:
    """The roles runs, their printed summaries sent to stderr: stdout carries only JSON lines."""
    with contextlib.redirect_stdout(sys.stderr):
        for config in configs:
            run_roles(config, parser=parser, source=open_checkpoint(config.ckpt, config.step))


def group_configs(args, ckpt: str, out: Path, cache_dir: str) -> list[RolesConfig]:
    configs = []
    for i, spec in enumerate(args.tasks):
        task, _, split = spec.rpartition(":") if ":" in spec else (spec, "", "dev")
        configs.append(
            RolesConfig(
                ckpt=ckpt, task=comma_list(task), split=split, glue_dir=args.glue_dir, n=args.n,
                batch_size=args.batch_size,
                cache_dir=cache_dir, out=str(out / f"roles{i}"), overwrite=True, figures=args.figures,
                figure_format=args.figure_format,
            )
        )  # fmt: skip
    return configs


def stages(configs: list[RolesConfig]) -> dict[str, float]:
    """Seconds by stage (scoring, figures, …) of the last analysis run, summed over its configs."""
    breakdown: dict[str, float] = {}
    for config in configs:
        timings = json.loads((Path(config.out) / "run.json").read_text())["timings_s"]
        for key, value in timings.items():
            stage = key.split("/")[-1]
            breakdown[stage] = round(breakdown.get(stage, 0.0) + value, 3)
    return breakdown


def run(args) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="bench-roles-") as scratch:
        scratch = Path(scratch)
        ckpt = args.ckpt
        if args.random_preset:
            (scratch / "model").mkdir()
            ckpt = common.random_checkpoint(args.random_preset, args.vocab, scratch / "model")
        configs = group_configs(args, ckpt, scratch, args.cache_dir or str(scratch / "cache"))
        if args.export_parses:
            export_parses(configs, args.export_parses)
            return []
        parser = PreparsedParser(args.parses) if args.parses else make_parser(configs[0])

        common.log("untimed first run: parses into the cache, compiles")
        clock = time.perf_counter()
        analyse(configs, parser)
        first_run_s = time.perf_counter() - clock
        first_run_stages = stages(configs)

        model = from_pretrained(ckpt)
        tokenizer = load_tokenizer(ckpt)
        forward = forward_only(model)
        sequences = {}
        for config in configs:
            data = load_tasks(config, config_tasks(config))
            for task, seqs in encode_tasks(config, data, tokenizer, parser, {}).items():
                sequences[f"{task}:{config.split}"] = seqs
        n_sequences = sum(len(s) for s in sequences.values())
        max_length = fit_max_length(configs[0], model.config.max_position_embeddings).max_length
        time_forward(forward, sequences, args.batch_size, max_length)  # compiles the forward's shapes

        forward_times, e2e_times, breakdown = [], [], {}
        for _ in range(args.repeat):
            forward_times.append(time_forward(forward, sequences, args.batch_size, max_length))
            clock = time.perf_counter()
            analyse(configs, parser)
            e2e_times.append(time.perf_counter() - clock)
            breakdown = stages(configs)

    settings = {
        "model": args.random_preset or args.ckpt,
        "tasks": args.tasks,
        "sequences": {k: len(v) for k, v in sequences.items()},
        "n_sequences": n_sequences,
        "batch_size": args.batch_size,
        "figures": args.figures,
        "figure_format": args.figure_format,
    }
    forward_stats, e2e_stats = common.summary(forward_times), common.summary(e2e_times)
    return [
        common.emit("roles_overhead", side="forward_only", **settings, **forward_stats),
        common.emit(
            "roles_overhead",
            side="roles_end_to_end",
            **settings,
            **e2e_stats,
            first_run_s=first_run_s,
            first_run_stages_s=first_run_stages,
            stages_s=breakdown,
        ),
        common.emit(
            "roles_overhead",
            side="ratio",
            **settings,
            overhead=e2e_stats["median_s"] / forward_stats["median_s"] - 1,
            target=0.10,
        ),
    ]


def parse_args(argv: list[str] | None):
    p = common.arguments(__doc__.split("\n\n")[0], repeat=3)
    common.add_model_arguments(p)
    p.add_argument("--tasks", nargs="+", default=["all:dev"], help="TASKS:SPLIT, one analysis.roles run each")
    p.add_argument("--glue-dir", required=True)
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=32)
    add_figure_arguments(p, ROLES_FIGURES, DEFAULT_ROLES_FIGURES)
    p.add_argument("--cache-dir", help="parse cache (default: a fresh one, filled by the untimed run)")
    p.add_argument("--parses", help="JSON of parses from --export-parses: no spaCy needed")
    p.add_argument("--export-parses", help="only write the parses these runs need to this JSON file, then stop")
    a = p.parse_args(argv)
    return common.check_model_arguments(p, a)


def main(argv: list[str] | None = None) -> None:
    # As the CLI does: with a cache left by an earlier process, `first_run_s` is a cold process's
    # run without XLA compilation.
    cli.use_compilation_cache()
    run(parse_args(argv))


if __name__ == "__main__":
    cli.run(main)
