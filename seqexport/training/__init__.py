"""Training of the bundled checkpoints: the generic loop (`train`), the date task (`dates`)."""
