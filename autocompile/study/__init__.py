"""Many trials: the shared Optuna study, the search and its confirmation phases, verdicts, tracking."""
