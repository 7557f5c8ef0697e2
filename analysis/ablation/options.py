"""The choices of `python -m analysis.ablate`'s and `analysis.prune`'s flags, apart from the
modules that implement them (which import JAX), so that their parsers are built without them."""

# The GLUE splits with labels, which the metrics need (`--split`, `--importance-split`).
SPLITS = ("train", "dev", "validation")

# `analysis.ablate --analyses`.
ANALYSES = ("patterns", "features", "disable", "mask")
