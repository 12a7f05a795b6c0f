"""The user's own training script as the job (``script.path=train.py script.args='--batch_size=4'``).

Every trial runs the script as it is, under torchrun, with autocompile's agent loaded into each rank through
the environment: a ``sitecustomize.py`` on ``PYTHONPATH`` (written into the trial directory) that chains any
other ``sitecustomize`` and, in the script's own processes only, starts :mod:`autocompile.trial.script.agent`.
The agent takes over the script's ``torch.compile`` calls with the trial's knobs, times windows of optimizer
steps and writes ``result.json``; see that module.

Standard library only: the agent reads :class:`ScriptSpec` in the script's processes, where only PyTorch is.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from autocompile.config.choices import Knobs
from autocompile.config.knob_spec import Env
from autocompile.config.spec import MeasureSettings, Workload
from autocompile.config.window_policy import WindowPolicy

TRIAL_VAR = "AUTOCOMPILE_SCRIPT_TRIAL"
"""Names the trial directory in the script's processes: the agent is active only where it is set."""
SITE_DIR = "agent_site"
"""The trial directory's folder put first on ``PYTHONPATH``: it holds the agent's ``sitecustomize.py``."""

SITECUSTOMIZE = '''"""autocompile's script agent (written for this trial; see autocompile/config/script_settings.py).

Python imports the first sitecustomize on sys.path: this one. It runs the one it shadows (a distribution's,
ddtrace's...), then starts the agent when the trial's variable is set and this process runs the script.
"""
import os
import sys


def _chain():
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        path = os.path.join(entry or os.getcwd(), "sitecustomize.py")
        if os.path.abspath(entry or os.getcwd()) != here and os.path.isfile(path):
            with open(path, "rb") as f:
                code = compile(f.read(), path, "exec")
            exec(code, {"__name__": "sitecustomize", "__file__": path})
            return


def _runs_script():
    """This process runs the trial's script (not torchrun's own process, nor a compile worker): decided before
    anything heavy is imported."""
    import json

    trial = os.environ.get("AUTOCOMPILE_SCRIPT_TRIAL")
    if not trial or not sys.argv or not sys.argv[0]:
        return False
    with open(os.path.join(trial, "trial.json")) as f:
        script = json.load(f)["script"]["path"]
    return os.path.realpath(sys.argv[0]) == os.path.realpath(script)


_chain()
if _runs_script():
    from autocompile.trial.script.agent import boot

    boot()
'''


def script_env(device: str, world_size: int, prepares: bool = False) -> Env:
    """What a script's trials may be asked, the same in the tuner and in the agent: only the knobs its agent
    reaches (``Env.script_mode``; with ``prepares``, those ``autocompile.prepare`` opens too). Its shapes are
    unknown, so ``compile.dynamic`` is offered (where they do not vary, its values compile one program and the
    study sees them as twins); so is regional compile (a model without repeated blocks fails that trial in one
    line)."""
    return Env.detect(device, world_size, True, None, {"script_mode": True, "script_prepares": prepares})


def calls_prepare(path: str | os.PathLike[str]) -> bool:
    """Whether the script's own file calls ``autocompile.prepare`` (``import autocompile`` then
    ``autocompile.prepare(...)``, or ``from autocompile import prepare``): read from its source, the same in the
    tuner and in the agent. A call in another module of the user's is not seen: its knobs stay closed."""
    import ast

    try:
        tree = ast.parse(Path(path).read_text(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return False
    imported = any(isinstance(n, ast.ImportFrom) and n.module == "autocompile"
                   and any(a.name == "prepare" for a in n.names) for n in ast.walk(tree))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr == "prepare" and isinstance(f.value, ast.Name) \
                    and f.value.id == "autocompile":
                return True
            if imported and isinstance(f, ast.Name) and f.id == "prepare":
                return True
    return False


LAUNCHERS = ("auto", "torchrun", "accelerate")


@dataclass
class ScriptSettings:
    """``script.*``: the user's own training script, run as it is in every trial (no model config needed)."""

    path: str = ""
    """The script, relative to the directory the command runs in (where every trial runs it, so it opens
    its relative paths as it always does); empty = autocompile's own loop over ``+model=NAME``."""
    args: str = ""
    """The script's command-line arguments, one string split as a shell would (``'--batch_size=4 --compile'``).
    The script must run at least ``measure.warmup_steps + measure.windows x measure.window_steps`` optimizer
    steps with them: the trial ends it right after the timed part."""

    launcher: str = "auto"
    """How each trial starts the script: ``auto`` runs one process with plain ``python`` (as one starts a
    single-process script: torchrun's RANK would send a script such as nanoGPT's ``train.py`` into its DDP
    branch) and several under torchrun; ``torchrun`` always uses torchrun (a script started with it even alone);
    ``accelerate`` runs ``accelerate launch`` with ``script.accelerate_config``, as a script built on Accelerate is
    started (its mixed precision, its distributed type: what ``Accelerator()`` reads from the launcher)."""
    accelerate_config: str = ""
    """``script.launcher=accelerate``: the ``accelerate config`` file to launch with (``--config_file``); empty =
    Accelerate's own default (``accelerate config``'s, if the user saved one)."""
    seed: int | None = 0
    """Seeds ``torch``, ``random`` and numpy in each trial's processes before the script runs: every trial of a
    script that draws its data or weights unseeded then sees the same numbers, so its losses can be compared with
    the eager reference's (``objective.loss_rtol``). A script that seeds itself overrides it; null leaves it
    unseeded (each trial's losses then differ from the reference's by the draws alone)."""

    def __post_init__(self) -> None:
        if self.launcher not in LAUNCHERS:
            raise ValueError(f"script.launcher={self.launcher!r} is none of {', '.join(LAUNCHERS)}")
        if self.accelerate_config and (self.launcher != "accelerate" or not Path(self.accelerate_config).is_file()):
            raise ValueError(f"script.accelerate_config={self.accelerate_config!r} needs script.launcher=accelerate "
                             "and an existing file (the one accelerate launch --config_file takes)")
        if self.args and not self.path:
            raise ValueError("script.args is given without script.path: name the script (script.path=train.py)")
        if self.path and not Path(self.path).is_file():
            raise ValueError(f"script.path={self.path!r} is no file (from {os.getcwd()}): the script runs from "
                             "the directory the command runs in")
        if self.args.startswith("[") and self.args.endswith("]"):  # Hydra's list syntax reaches a str field as text
            raise ValueError(f"script.args={self.args!r} is a list: give one string, split as a shell would "
                             "(script.args='--dataset fake --niter 2')")
        try:
            shlex.split(self.args)
        except ValueError as exc:
            raise ValueError(f"script.args={self.args!r} cannot be split as a shell would: {exc}") from exc

    @property
    def given(self) -> bool:
        return bool(self.path)

    @property
    def name(self) -> str:
        """The script's file name without ``.py``: the study's name starts with it."""
        return Path(self.path).stem

    def argv(self) -> list[str]:
        return shlex.split(self.args)

    def accelerate_args(self, processes: int) -> list[str]:
        """``accelerate launch``'s options for ``processes`` processes with the user's config (trials and winner)."""
        return [*(["--config_file", self.accelerate_config] if self.accelerate_config else []),
                f"--num_processes={processes}"]

    def source_hash(self) -> str:
        """Identity of the script's code: a changed script is another study."""
        return hashlib.sha256(Path(self.path).read_bytes()).hexdigest()[:16]

    def job_name(self) -> str:
        """``train-3f2a9c1b``: the script and a hash of its arguments (other arguments, another study)."""
        return f"{self.name}-{hashlib.sha256(self.args.encode()).hexdigest()[:8]}"


@dataclass
class ScriptRotation:
    """Several candidates side by side in one process of the script (``ScriptSpec.rotation``): the agent holds a
    compiled variant of each unit per candidate, warms each in turn, then switches the active one window by
    window in rotating order (the fields of :class:`autocompile.config.spec.SideBySideSpec`)."""

    knobs: list[Knobs]
    """Each candidate's knobs; what ``prepare()`` applies is the same in all (``ScriptSpec.knobs``)."""
    labels: list[str]
    expected: list[str | None]
    """Each candidate's fingerprint in its own cold process: another one beside the others fails it."""
    artifacts: list[str | None]
    policy: WindowPolicy
    """Its windows and stopping rule (``compare``'s)."""
    shape_states: list[str | None] = field(default_factory=list)
    """Each candidate's automatic-dynamic memory at its cold run's first training step (``shape_state``)."""
    shift: int = 0


@dataclass
class ScriptSpec:
    """What one trial of a script runs; written as ``trial.json`` (the agent reads it back)."""

    knobs: Knobs
    script: ScriptSettings
    workload: Workload
    """Only the launch facts are read (nproc_per_node, nnodes): the script builds its own job."""
    measure: MeasureSettings
    device: str = "cpu"
    threads: int = 1
    rotation: ScriptRotation | None = None
    """Candidates side by side in this process (None: one configuration, ``knobs``)."""

    module = "autocompile.trial.script.agent"
    """Not a worker torchrun runs: the script is (see :meth:`entry`); named for readers of trial specs."""

    def entry(self, trial_dir: Path) -> list[str]:
        """What torchrun runs in each process: the script and its arguments."""
        return [self.script.path, *self.script.argv()]

    def command(self, trial_dir: Path) -> list[str] | None:
        """``script.launcher=accelerate``: ``accelerate launch`` on the script with the trial's process count (its
        processes run the script: the agent boots in each); None: python or torchrun (the launcher decides)."""
        if getattr(self.script, "launcher", "auto") != "accelerate":
            return None
        w = self.workload
        return [sys.executable, "-m", "accelerate.commands.launch", *self.script.accelerate_args(w.world_size),
                f"--num_machines={w.nnodes}",
                *(["--multi_gpu"] if w.world_size > 1 and self.device == "cuda" else []),
                *self.entry(trial_dir)]

    def plain_python(self) -> bool:
        """One process started with ``python`` itself, not torchrun (``script.launcher=auto``)."""
        return (getattr(self.script, "launcher", "auto") == "auto"
                and self.workload.nnodes * self.workload.nproc_per_node == 1)

    def environment(self, trial_dir: Path, base: dict[str, str]) -> dict[str, str]:
        """The agent's variables over the launcher's ``base``: its trial, and its ``sitecustomize`` first on
        the import path."""
        site = str((trial_dir / SITE_DIR).resolve())
        return {TRIAL_VAR: str(trial_dir.resolve()),
                "PYTHONPATH": os.pathsep.join(p for p in (site, base.get("PYTHONPATH", "")) if p)}

    def write(self, trial_dir: Path) -> Path:
        site = trial_dir / SITE_DIR
        site.mkdir(parents=True, exist_ok=True)
        (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
        path = trial_dir / "trial.json"
        path.write_text(json.dumps({"kind": "script", **asdict(self)}, indent=2, sort_keys=True))
        return path

    @classmethod
    def read(cls, trial_dir: Path) -> ScriptSpec:
        raw = json.loads((trial_dir / "trial.json").read_text())
        raw.pop("kind", None)
        # The script was checked when the study started; its directory may have moved since (a replay).
        script = ScriptSettings.__new__(ScriptSettings)
        script.__dict__.update(raw.pop("script"))
        rotation = raw.pop("rotation", None)
        return cls(script=script, workload=Workload(**raw.pop("workload")),
                   measure=MeasureSettings(**raw.pop("measure")),
                   rotation=ScriptRotation(**{**rotation, "policy": WindowPolicy(**rotation["policy"])})
                   if rotation else None, **raw)

    @property
    def needed_steps(self) -> int:
        """Optimizer steps the measurement needs at least: warm-up and every timed window."""
        return self.measure.warmup_steps + self.measure.windows * self.measure.window_steps
