"""One trial: compile the step as configured, run it under torchrun in a fresh process, measure it."""
