"""The study's statistics, pure functions of numbers: decision rules, intervals, effects."""
