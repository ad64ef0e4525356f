"""text -> subwords -> batches (§5.1)."""
