"""`python -m analysis.track --run WORKDIR | --ckpt SRC[@LABEL] ...`: head roles along a series of checkpoints.

The series is the checkpoints of a bertjax training run (pre-training or fine-tuning; `--with-init`
adds the checkpoint a fine-tuning run started from as step 0), or any ordered list of checkpoints
that `from_pretrained` loads: `--ckpt` repeated, each `SOURCE[@LABEL]`, or one `--ckpt` pattern with
a `{step}` placeholder filled from `--steps` (e.g. a hub series of intermediate checkpoints). The x
axis is the step: a run's step, an integer label, the placeholder's value, or, when some member has
no integer step, its position in the order given (0, 1, ...). The members must share the numbers
of layers and heads and the tokenizer vocabulary; a mismatch stops the run before any scoring.

The sequences (examples → parses → encodings) are prepared once and scored by each checkpoint
with `analysis.roles`' jitted forward + sieve kernel. The per-sequence scores of each step are
cached on disk under a key of every setting that changes them and of the checkpoint's identity (an
orbax step's params files; a HF directory's files, whose resolved hub-cache blobs name their
content hashes and whose snapshot path names the hub revision), so a re-run after more checkpoints
appear analyses only the new ones; the hypothesis tests are recomputed from the cached scores, so τ,
α, the test and the correction can change without re-scoring.

With `--shard I/N` this invocation is job I of N that share the scores cache (a SLURM array, a
pod's hosts): it scores only its members (every N-th of the series from the I-th) that are not
cached yet and writes nothing into `--out`; once every job has ended, the command without `--shard`
finds every step cached and writes the outputs.

Outputs (written into a temporary sibling of `--out` and renamed when complete): `track.csv` (the
`roles.csv` columns plus `step`), `onset.csv` (when each head takes on each role: `analysis.heads.onset`),
with `--sas` `sas.csv` (per step and relation, the best head's UAS and the best offset baseline:
`analysis.attention.sas`) and `sas_margin.csv` (that head against that offset, each chosen on half the
trees and scored on the other, with an interval: `sieves.depattn.sas_against_offsets`), `curve_onsets.csv` (the steepest change and the onset of the held-out MLM
loss, the SAS and each role's count of heads), per task the figures `role_fractions`, `emergence`,
`mean_beta` and `onset` (the run's held-out MLM loss when it recorded one, the SAS when tracked and
the heads holding each role, on one step axis), and `run.json` (with the series: each member's
step, label, source and resolved path).
"""

from __future__ import annotations

import argparse

from analysis.common.flags import refuse_early
from analysis.heads.config import SEEDS_CSV, TRACK_CSV, TRACK_SECTIONS, RolesConfig, TrackConfig
from analysis.tools import Command
from bertjax import cli, settings


def _series_flags(p: argparse.ArgumentParser) -> None:
    series = p.add_mutually_exclusive_group(required=True)
    series.add_argument("--run", action="append",
                        help="a bertjax pre-training or fine-tuning workdir (checkpoints/<step>/); repeated: the seeds "
                             "of one recipe, each tracked into <out>/<name>/ with an across-seed summary in <out>")  # fmt: skip
    series.add_argument("--ckpt", action="append", metavar="SOURCE[@LABEL]",
                        help="a member of the series (HF directory, hub id, bertjax workdir or step folder), repeated; "
                             "an integer LABEL is its step; or one pattern with {step}, filled from --steps")  # fmt: skip
    settings.add_flags(p, TrackConfig)


def _parse(p: argparse.ArgumentParser, a: argparse.Namespace, argv: list[str] | None) -> tuple[TrackConfig, list[str]]:
    """The track's config and the workdirs of --run (several: the seeds of one recipe)."""
    roles = settings.from_flags(
        RolesConfig, p, a, argv, sections=TRACK_SECTIONS, file_schemas=[TrackConfig], ckpt=a.run[0] if a.run else ""
    )
    config = settings.from_flags(TrackConfig, p, a, argv, sections=TRACK_SECTIONS, file_schemas=[RolesConfig],
                                 roles=roles, series=tuple(a.ckpt or ()))  # fmt: skip
    settings.print_config_if_asked(a, roles, config, sections=TRACK_SECTIONS)
    return config, list(a.run or ())


_command = Command("track", __doc__, _series_flags, _parse)
build_parser, parse_args = _command.build_parser, _command.parse_args


def run(config: TrackConfig) -> None:
    # A shard writes only into the cache.
    refuse_early(config.roles, writes_out=config.shard is None, replaces=TRACK_CSV)
    _command.run(config)


def main(argv: list[str] | None = None) -> None:
    config, runs = parse_args(argv)
    if len(runs) > 1:
        refuse_early(config.roles, replaces=SEEDS_CSV)
        from analysis.api.heads import run_seeds

        run_seeds(config, runs)
        cli.print_wrote(config.roles.out)
    else:
        run(config)


if __name__ == "__main__":
    cli.run(main)
