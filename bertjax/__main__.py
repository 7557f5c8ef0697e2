"""`python -m bertjax --ckpt CKPT`: load a checkpoint, run one sentence pair, print what came out."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from bertjax import cli, settings
from bertjax.show import ShowConfig, show


def build_parser() -> argparse.ArgumentParser:
    parser = cli.parser("bertjax", __doc__)
    settings.add_flags(parser, ShowConfig)
    parser.add_argument("old_ckpt", nargs="?", metavar="CKPT", help="the old spelling of --ckpt CKPT")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    config = settings.from_flags(ShowConfig, parser, args, argv)
    if args.old_ckpt is not None:
        if config.ckpt is not None:
            parser.error("give the checkpoint once, as --ckpt CKPT")
        print("warning: python -m bertjax CKPT is deprecated, use --ckpt CKPT", file=sys.stderr)
        config = dataclasses.replace(config, ckpt=args.old_ckpt)
    elif config.ckpt is None:
        parser.error("the following arguments are required: --ckpt")
    # show imports JAX when called: --help and flag errors need none.
    print(show(config))


if __name__ == "__main__":
    cli.run(main)
