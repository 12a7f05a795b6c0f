"""The guardian of paused trials: ``python -m autocompile.trial.pause_guard``, one per tuner that pauses any.

A stopped process acts on no signal but SIGKILL: a tuner killed with SIGKILL would leave the trials it paused
stopped for ever, their parent-death SIGTERM pending. The tuner tells this process every pause and resume on its
standard input (``stop PID`` / ``cont PID``); when that pipe closes (the tuner ended, however it ended), it resumes
every process still stopped, whose pending SIGTERM then ends it. Standard library only: it starts in milliseconds.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys


def main() -> int:
    stopped: set[int] = set()
    for line in sys.stdin:
        verb, _, pid = line.strip().partition(" ")
        if verb == "stop" and pid.isdigit():
            stopped.add(int(pid))
        elif verb == "cont" and pid.isdigit():
            stopped.discard(int(pid))
    for pid in stopped:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGCONT)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the tuner: it resumes what it paused itself
    sys.exit(main())
