"""cce-bench: a benchmark suite for memory-efficient cross-entropy over large vocabularies."""
