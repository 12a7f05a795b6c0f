"""MLflow: the store, a parent run per study, a child run per trial, the plots they carry."""
