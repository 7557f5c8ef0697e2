"""`python -m analysis.clark`: the analyses of Clark et al. 2019, "What Does BERT Look At?".

Sub-analyses (`--analyses`, default all): `surface` (attention to [CLS]/[SEP]/punctuation/
neighbours and entropies per head, on two-paragraph WikiText segments or a GLUE task), `cluster`
(Jensen–Shannon distances between heads and their 2-D MDS map), `gradients` (∂MLM-loss/∂attention;
needs a checkpoint with a trained MLM head), `depheads` (dependency heads on UD English-EWT, chosen
on dev, reported on test) and `probes` (attention-only, attention + embedding and distance +
embedding dependency probes, trained on EWT train, UAS on EWT test) and `coref` (coreference
heads on GAP, chosen on development, reported on test). Definitions are in the docstrings of
`analysis.attention.surface`, `.gradients`, `.depheads`, `.probes` and `.coref`, and of
`sieves.wordattn` (word-level attention) and `sieves.depattn` (the dependency-head counts). Everything streams batch by batch; no analysis holds the attention of a whole
dataset.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from analysis.attention.options import (
    ANALYSES,
    COREF_MENTIONS,
    COREF_TARGETS,
    DEFAULT_OUT,
    SEGMENT_IDS,
    SURFACE_WEIGHTINGS,
    WORD_TEXTS,
)
from analysis.common.flags import (
    ONE_READING,
    add_attention_argument,
    add_length_arguments,
    add_nonfinite_argument,
    add_out_arguments,
)
from bertjax import cli
from sieves import depattn

if TYPE_CHECKING:
    from analysis.api.attention import ClarkResult
    from analysis.attention.pipeline import ClarkConfig


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser("analysis.clark", __doc__)
    p.add_argument("--ckpt", required=True, help="HF-format directory, bertjax run workdir, or hub id")
    p.add_argument("--step", type=int, help="checkpoint step of a bertjax run (default: latest)")
    p.add_argument("--analyses", default="all", help=f"comma-separated subset of {','.join(ANALYSES)}, or all")
    p.add_argument("--data-dir", default="../shared/data", help="staged data (ud_english_ewt/, wikitext/, gap/)")
    p.add_argument("--task", "--inputs", dest="inputs", default="wikitext", action=cli.DeprecatedAliases,
                   help="surface/cluster/gradient inputs: wikitext or a GLUE task (qnli, qqp, mrpc, sst2); "
                        "--inputs: the old spelling")  # fmt: skip
    p.add_argument("--glue-dir", help="local GLUE directory for --task TASK (default: the hub)")
    p.add_argument("--split", default="dev", help="GLUE split for --task TASK")
    p.add_argument("--n", type=int, default=1000, help="number of input sequences (surface)")
    add_length_arguments(p)
    p.add_argument("--cluster-n", type=int, default=300, help="sequences averaged for the JS distances")
    p.add_argument("--gradient-n", type=int, default=256, help="masked sequences for the gradients")
    p.add_argument("--ewt-n", type=int, help="first N sentences of EWT dev and test (default all)")
    p.add_argument("--gap-n", type=int, help="first N rows of GAP development and test (default all)")
    p.add_argument("--first-piece", action="store_true", help="attention from a word = its first piece's")
    p.add_argument(
        "--coref-target",
        choices=COREF_TARGETS,
        default="head",
        help="attention to a GAP name: head (its last word's pieces), sum (all its pieces) or first (its first piece)",
    )
    p.add_argument(
        "--coref-mentions",
        choices=COREF_MENTIONS,
        default="all",
        help="which mentions of a GAP candidate count: all (every occurrence of its name, Clark et al.'s "
        "'any of the antecedent's mentions') or marked (the occurrence GAP marks)",
    )
    p.add_argument("--min-count", type=int, default=100, help="test arcs for a relation to be summarised")
    p.add_argument("--probe-train-n", type=int, default=2000, help="first N EWT train sentences for the probes")
    p.add_argument("--probe-epochs", type=int, default=10, help="epochs of each probe's training")
    p.add_argument("--probe-learning-rate", type=float, default=5e-3, help="the probes' Adam learning rate")
    p.add_argument("--seed", type=int, default=0, help="seed of the gradients' masking and the probes' initialisation")
    p.add_argument(
        "--surface-weighting",
        choices=SURFACE_WEIGHTINGS,
        default="tokens",
        help="tokens: every row counts once; sequences: every sequence counts once (the authors' notebook)",
    )
    p.add_argument(
        "--baseline-offsets",
        choices=list(depattn.BASELINE_OFFSETS),
        default="paper",
        help="paper: ±1…3, unclipped; authors: −3…+2, clipped into the sentence (the authors' notebook)",
    )
    p.add_argument(
        "--all-relations-include-root",
        action="store_true",
        help="count root arcs in the 'all' row of the dependency heads (the authors' notebook)",
    )
    p.add_argument(
        "--word-text",
        choices=WORD_TEXTS,
        default="original",
        help="EWT text the model reads: original (the sentence's # text) or joined (\" \".join(words), the authors' code)",
    )
    p.add_argument(
        "--segment-ids",
        choices=SEGMENT_IDS,
        default="pairs",
        help="token type ids the model reads: pairs (0 for A, 1 for B) or zeros (the authors' extract_attention.py)",
    )
    add_attention_argument(p, ONE_READING)
    add_out_arguments(p, DEFAULT_OUT)
    p.add_argument("--figure-format", default="png", help="comma-separated subset of png,svg,pdf (default: png)")
    add_nonfinite_argument(p)
    return p


def parse_args(argv: list[str] | None) -> ClarkConfig:
    a = build_parser().parse_args(argv)
    from analysis.attention.pipeline import ClarkConfig  # after parsing: --help and flag errors need no JAX

    explicit = a.analyses != "all"
    analyses = ANALYSES if not explicit else tuple(x.strip() for x in a.analyses.split(",") if x.strip())
    return ClarkConfig(
        ckpt=a.ckpt, out=a.out, step=a.step, analyses=analyses, data_dir=a.data_dir, inputs=a.inputs,
        glue_dir=a.glue_dir, split=a.split, n=a.n, max_length=a.max_length, batch_size=a.batch_size,
        cluster_n=a.cluster_n, gradient_n=a.gradient_n, ewt_n=a.ewt_n, first_piece=a.first_piece,
        min_count=a.min_count, probe_train_n=a.probe_train_n, probe_epochs=a.probe_epochs,
        probe_learning_rate=a.probe_learning_rate, seed=a.seed, surface_weighting=a.surface_weighting,
        baseline_offsets=a.baseline_offsets, all_relations_include_root=a.all_relations_include_root,
        word_text=a.word_text, segment_ids=a.segment_ids, gap_n=a.gap_n, coref_target=a.coref_target,
        coref_mentions=a.coref_mentions,
        overwrite=a.overwrite, analyses_explicit=explicit, figure_format=a.figure_format,
        allow_nonfinite=a.allow_nonfinite, attention=a.attention,
    )  # fmt: skip


def run(config: ClarkConfig) -> ClarkResult:
    from analysis.api.attention import run_clark  # after parsing: --help and flag errors need no JAX

    result = run_clark(config)  # computed and written
    if result.run.lines:
        print(result.run.text())
    cli.print_wrote(config.out)
    return result


def main(argv: list[str] | None = None) -> ClarkResult:
    return run(parse_args(argv))


if __name__ == "__main__":
    cli.run(main)
