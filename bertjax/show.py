"""What `python -m bertjax` does: load a checkpoint, run one sentence pair, and say what came out
(the model's shape and size, the tokens, the outputs' shapes): a check that a checkpoint loads."""

from __future__ import annotations

import dataclasses

from bertjax.errors import UserError
from bertjax.settings import setting


@dataclasses.dataclass(frozen=True)
class ShowConfig:
    # Not required by the parser: the old positional CKPT may give it instead (bertjax.__main__).
    ckpt: str | None = setting(None, help="HF-format directory, bertjax run workdir or hub id (required)")
    step: int | None = setting(None, help="checkpoint step of a bertjax run (default: latest)")
    text: str = setting("The cat sat on the mat.", help="the first sentence of the pair run")
    text_pair: str = setting("It was happy there.", help="the second sentence")


def show(config: ShowConfig) -> str:
    """The lines `python -m bertjax` prints for `config`'s checkpoint."""
    if config.ckpt is None:
        raise UserError("no checkpoint to show: give ckpt (--ckpt CKPT)")
    import jax
    import numpy as np
    from flax import nnx

    from bertjax.pretrained import from_pretrained, load_tokenizer

    model = from_pretrained(config.ckpt, step=config.step)
    tokenizer = load_tokenizer(config.ckpt, step=config.step)
    batch = tokenizer([config.text], [config.text_pair], return_tensors="np")
    out = jax.jit(lambda m, b: m(**b, output_attentions=True))(
        # RoBERTa's and ModernBERT's tokenizers return no token_type_ids (one type, or none).
        model,
        {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch},
    )
    shape = model.config
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    lines = [
        f"{shape.model_type}: {shape.num_hidden_layers} layers × {shape.num_attention_heads} heads, "
        f"hidden {shape.hidden_size}, {n_params:,} parameters",
        "tokens: " + " ".join(tokenizer.convert_ids_to_tokens(batch["input_ids"][0])),
        f"last_hidden_state: {tuple(out.last_hidden_state.shape)}",
    ]
    if out.pooler_output is not None:  # ModernBERT has no pooler
        lines.append(f"pooler_output: {tuple(out.pooler_output.shape)}")
    lines.append(f"attentions: {len(out.attentions)} × {tuple(out.attentions[0].shape)}")
    return "\n".join(lines)
