"""Kovaleva et al. 2019 and Michel et al. 2019: attention patterns and features, disabling and
masking heads (`analysis.ablate`), head importance and pruning (`analysis.prune`)."""
