"""autocompile: find the best way to apply torch.compile to a training job, by measurement."""

from autocompile.apply import TrainStep, apply, lm_loss
from autocompile.knobs import KNOBS, Env, KnobError, TrialConfig

__all__ = ["KNOBS", "Env", "KnobError", "TrainStep", "TrialConfig", "apply", "lm_loss"]
