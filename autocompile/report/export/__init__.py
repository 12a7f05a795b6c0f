"""The winner as code and configs: ``best_config.py`` and the Accelerate, Trainer and torchtitan exports."""
