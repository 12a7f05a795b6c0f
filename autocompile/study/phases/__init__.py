"""The phases after the search: confirmation and verdicts, side by side or in fresh-process rounds."""
