"""Attention sieves and the sieve bias kernel.

`parse` (spaCy / CoNLL-U words) → `align` (wordpieces ↔ words) → `builders` (role masks) →
`kernel` (per-sequence β scores). Submodules are imported on demand so the kernel does not pull in
spaCy or transformers.
"""
