"""`python -m bertjax CKPT`: load a checkpoint, run one sentence pair, print what came out."""

from __future__ import annotations

import argparse

import jax
import numpy as np
from flax import nnx

from bertjax import cli
from bertjax.pretrained import from_pretrained, load_tokenizer


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bertjax", description=__doc__)
    cli.add_verbose_argument(parser)
    parser.add_argument("ckpt", help="HF-format directory, bertjax run workdir or hub id")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step of a bertjax run")
    parser.add_argument("--text", default="The cat sat on the mat.")
    parser.add_argument("--text-pair", default="It was happy there.")
    args = parser.parse_args(argv)

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
