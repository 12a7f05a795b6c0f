"""Timing inside a trial's process: the worker, the side-by-side worker, clocks, readings, statistics."""
