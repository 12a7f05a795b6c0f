"""What a study keeps: the shared Optuna study, the typed trial record, the objective, observers."""
