"""What to try and how: the knob table, the search space, the typed settings and the command lines behind them."""
