"""The program a trial runs: the training step, the apply parts, the build, its graphs and FLOPs."""
