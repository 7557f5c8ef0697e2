"""`python -m bertjax --ckpt CKPT`: load a checkpoint, run one sentence pair, print what came out."""

from __future__ import annotations

import argparse
import sys

from bertjax import cli


def build_parser() -> argparse.ArgumentParser:
    parser = cli.parser("bertjax", __doc__)
    parser.add_argument("--ckpt", help="HF-format directory, bertjax run workdir or hub id (required)")
    parser.add_argument("old_ckpt", nargs="?", metavar="CKPT", help="the old spelling of --ckpt CKPT")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step of a bertjax run (default: latest)")
    parser.add_argument("--text", default="The cat sat on the mat.", help="the first sentence of the pair run")
    parser.add_argument("--text-pair", default="It was happy there.", help="the second sentence")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.old_ckpt is not None:
        if args.ckpt is not None:
            parser.error("give the checkpoint once, as --ckpt CKPT")
        print("warning: python -m bertjax CKPT is deprecated, use --ckpt CKPT", file=sys.stderr)
        args.ckpt = args.old_ckpt
    elif args.ckpt is None:
        parser.error("the following arguments are required: --ckpt")
    # After parsing: --help and flag errors need no JAX.
    import jax
    import numpy as np
    from flax import nnx

    from bertjax.pretrained import from_pretrained, load_tokenizer

    model = from_pretrained(args.ckpt, step=args.step)
    tokenizer = load_tokenizer(args.ckpt, step=args.step)
    batch = tokenizer([args.text], [args.text_pair], return_tensors="np")
    out = jax.jit(lambda m, b: m(**b, output_attentions=True))(
        # RoBERTa's and ModernBERT's tokenizers return no token_type_ids (one type, or none).
        model,
        {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch},
    )
    config = model.config
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    print(
        f"{config.model_type}: {config.num_hidden_layers} layers × {config.num_attention_heads} heads, "
        f"hidden {config.hidden_size}, {n_params:,} parameters"
    )
    print("tokens:", " ".join(tokenizer.convert_ids_to_tokens(batch["input_ids"][0])))
    print("last_hidden_state:", tuple(out.last_hidden_state.shape))
    if out.pooler_output is not None:  # ModernBERT has no pooler
        print("pooler_output:", tuple(out.pooler_output.shape))
    print(f"attentions: {len(out.attentions)} × {tuple(out.attentions[0].shape)}")


if __name__ == "__main__":
    cli.run(main)
