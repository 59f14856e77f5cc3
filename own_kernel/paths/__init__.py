"""What each path runs, by the call's route: the forward pass, the recompute, low-memory,
three-matmul and vocab-parallel paths with their autograd entries, the W writers."""
