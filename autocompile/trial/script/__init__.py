"""The user's own script: the agent inside its processes, the meter, and ``prepare()``."""
