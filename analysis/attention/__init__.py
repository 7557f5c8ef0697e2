"""Clark et al. 2019, "What Does BERT Look At?" (`analysis.clark`): surface statistics, head
clusters, attention gradients, dependency heads and attention probes."""
