"""What a study found: the summary, the best_config.py snippet, terminal views, plots and knob effects."""
