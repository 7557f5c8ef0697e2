"""Pande et al. 2021, "The Heads Hypothesis": sieve bias scores and role tests (`analysis.roles`),
their change along a series of checkpoints (`analysis.track`) and through fine-tuning
(`analysis.finetune_effect`), and the interactive report (`analysis.report`)."""
