"""The user's training job: model, data, loss, optimizer and schedule, built from their ``_target_`` paths."""
