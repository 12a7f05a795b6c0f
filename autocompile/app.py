"""Command line: ``python -m autocompile +model=NAME [task=measure] [key=value ...]`` (Hydra).

Before Hydra runs anything, every job the command line describes (each combination of a ``-m``
sweep) is composed and validated, so a typo fails in one line with nothing started or changed.
"""

from __future__ import annotations

import itertools
import logging
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from autocompile.config.commands import CONF_DIR, available_models
from autocompile.config.settings import ConfigError, register, settings_from

log = logging.getLogger(__name__)


def quote_script_args(argv: list[str]) -> list[str]:
    """``script.args=--max_iters=200 --batch_size=8`` (what the shell hands on from ``script.args='...'``) quoted
    for Hydra, whose grammar takes no ``=`` or space in a bare value; a value already quoted is left alone."""
    quoted = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if sep and key.lstrip("+~") == "script.args" and value and value[0] not in "'\"":
            arg = f"{key}='" + value.replace("'", "\\'") + "'"
        quoted.append(arg)
    return quoted


def check_command_line(argv: list[str]) -> None:
    """Compose and validate every job of the command line; raise ConfigError on the first problem."""
    from hydra import compose, initialize_config_dir

    args = [a for a in argv if not a.startswith("-") and not a.startswith(("hydra.", "hydra/", "+hydra"))]
    try:
        parsed = OverridesParser.create().parse_overrides(args)
    except HydraException as exc:
        raise ConfigError(one_line(exc)) from exc
    choices = [
        [f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()] if o.is_sweep_override() else [o.input_line]
        for o in parsed
    ]
    jobs = []
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for job in itertools.product(*choices):
            try:
                cfg = compose("config", overrides=list(job))
                jobs.append((settings_from(cfg, available_models()), Path(cfg.output_root)))
            except (HydraException, OmegaConfBaseException) as exc:
                raise ConfigError(explain(exc)) from exc
    # Stores are touched only once every job is known to be valid: a typo creates nothing.
    from autocompile.study.records.optuna_store import check_resumable

    opened: dict[str, Any] = {}
    for settings, output_root in jobs:
        if settings.task == "tune":  # opens the storage (a bad URL fails here) and checks a resumed study
            check_resumable(settings, output_root / settings.study.name, opened)
    for uri in dict.fromkeys(s.tracking_uri for s, _ in jobs if s.task == "tune" and s.tracking.enabled):
        from autocompile.report.tracking.mlflow_store import check_store

        check_store(uri)


def explain(exc: BaseException) -> str:
    text = str(exc)
    if "Could not find 'model/" in text:
        name = text.split("'model/", 1)[1].split("'", 1)[0]
        return f"unknown model {name!r}: choose one of {', '.join(available_models())} (+model=NAME)"
    cause = one_line(exc.__cause__) if exc.__cause__ is not None else ""
    if text.startswith("Could not override"):
        key = text.split("'", 2)[1]
        if key.startswith("model."):
            return f"model has no argument {key!r}: pass a new factory argument as +{key}=VALUE"
        return (f"unknown config key {key!r} ({cause}): check its spelling; "
                "`python -m autocompile +model=gpt2-tiny --cfg job` lists every key")
    return f"{one_line(exc)}: {cause}" if cause else one_line(exc)


def one_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip() and not ln.strip().startswith(
        ("full_key", "object_type", "reference_type", "Set the environment"))]
    return "; ".join(lines) or type(exc).__name__


class Terminated(KeyboardInterrupt):
    """SIGTERM (``timeout``, SLURM, ``kill``) stops the tuner as Ctrl-C does: being a KeyboardInterrupt,
    it takes the same path through the tuner and the launcher (trials killed, marked interrupted,
    queued again). Only the exit code differs."""


_signals: list[int] = []  # the signal that is stopping this process, once one is


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    if _signals:  # already stopping: let the trials be killed and queued again (SIGKILL still ends it)
        log.warning("SIGTERM again: still stopping the study")
        return
    _signals.append(signum)
    raise Terminated("SIGTERM")


def stop_on_signals() -> None:
    """Python runs signal handlers in the main thread only, where the tuner's Ctrl-C handling lives.

    SIGINT is handled explicitly too: Python leaves it ignored when the process started with it ignored
    (a background job of a non-interactive shell: ``cmd &`` in a script, some CI runners), and then
    ``kill -INT`` would never stop the study."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)
        signal.signal(signal.SIGINT, signal.default_int_handler)


def interrupted_exit(exc: BaseException) -> None:
    """One line, then the shell's convention: 128 + the signal (130 for Ctrl-C, 143 for SIGTERM)."""
    signum = _signals[0] if _signals else signal.SIGINT
    why = f" by {signal.Signals(signum).name}" if signum != signal.SIGINT else ""
    detail = str(exc) if str(exc) and not isinstance(exc, Terminated) else ""
    print(f"autocompile: interrupted{why}{f': {detail}' if detail else ''}", file=sys.stderr)
    sys.exit(128 + signum)


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def hydra_main(cfg: DictConfig) -> Any:
    from autocompile.study.records.observers import StudyFailing, StudyInterrupted, ending_error

    stop_on_signals()  # again here: launchers such as submitit call this function without main()
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        settings = settings_from(cfg, available_models())
        if settings.task != "measure" and (note := settings.compare.processes_note()) is not None:
            log.warning(note)  # a decision needs 3 side-by-side processes: 3 run
        if settings.task == "measure":
            from autocompile.report.view import console, measurement_table
            from autocompile.study.measure import measure

            name, result = measure(settings, run_dir)
            console().print(measurement_table(result, name))
            if not result.ok:
                sys.exit(1)
            return result.to_json()
        if settings.task == "compare":
            from autocompile.report.compare_table import print_comparison
            from autocompile.study.compare import compare

            comparison = compare(settings, run_dir)
            print_comparison(comparison)
            if not comparison.complete:
                sys.exit(1)  # a candidate could not be compared: its reason is printed above
            return comparison.as_dict()
        from autocompile.report.watch import Watch
        from autocompile.study.tuner import tune

        watch = Watch(settings, run_dir)
        try:
            outcome = tune(settings, run_dir, OmegaConf.to_yaml(cfg, resolve=True), watch)
        except ConfigError as exc:  # found once the study had opened (its script does not train): its run says so
            watch.failed(str(exc))
            raise
        summary = watch.report(outcome)
        if (error := ending_error(outcome, settings.study.max_failure_rate, run_dir)) is not None:
            raise error
        return summary
    except (ConfigError, StudyFailing) as exc:
        print(f"autocompile: error: {exc}", file=sys.stderr)
        sys.exit(2 if isinstance(exc, ConfigError) else 3)
    except (StudyInterrupted, KeyboardInterrupt) as exc:
        interrupted_exit(exc)


class MultirunSummary(Callback):
    """After ``-m``: one table over every study of the sweep."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from autocompile.report.multirun import print_multirun_summary

        print_multirun_summary(Path(config.hydra.sweep.dir))


def main(argv: list[str] | None = None) -> None:
    argv = quote_script_args(sys.argv[1:] if argv is None else argv)
    stop_on_signals()
    try:
        register()
        if "task=answers" in argv:  # no model, no study: the store's answers (report/answers_table.py)
            from autocompile.report.answers_table import print_answers

            sys.exit(print_answers(argv))
        if not any(a in ("--help", "-h", "--hydra-help", "--info", "--version", "--cfg", "-c") for a in argv):
            try:
                check_command_line(argv)
            except ConfigError as exc:
                print(f"autocompile: error: {exc}", file=sys.stderr)
                sys.exit(2)
        sys.argv = [sys.argv[0], *argv]
        hydra_main()
    except KeyboardInterrupt as exc:  # before or between studies: nothing runs that needs stopping
        interrupted_exit(exc)
