"""The search: samplers, one trial measured and told, the numerics reference, the winner's warm start."""
