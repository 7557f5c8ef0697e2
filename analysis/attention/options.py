"""The choices of `python -m analysis.clark`'s flags, apart from the modules that implement them
(which import JAX), so that its parser is built without them."""

ANALYSES = ("surface", "cluster", "gradients", "depheads", "probes", "coref")

# `--out`'s default; a call given no `out` writes nothing, and this names its settings' `out`.
DEFAULT_OUT = "clark_out"

WORD_TEXTS = ("original", "joined")

# pairs: token type 0 for [CLS], segment A and its [SEP], 1 for segment B and the last [SEP];
# zeros: 0 everywhere, as the authors' `extract_attention.py` feeds BERT.
SEGMENT_IDS = ("pairs", "zeros")

# `--coref-target` (analysis.attention.coref) and `--surface-weighting` (analysis.attention.surface).
COREF_TARGETS = ("head", "sum", "first")
# Which occurrences of a candidate count (analysis.attention.coref): every mention, or the marked one.
COREF_MENTIONS = ("all", "marked")
SURFACE_WEIGHTINGS = ("tokens", "sequences")
