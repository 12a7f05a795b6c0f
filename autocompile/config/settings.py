"""The tuner's configuration: the Hydra schema and its conversion into validated, typed settings.

The schema is registered in Hydra's ConfigStore, so a misspelled key or a value of the wrong type
fails at composition. Knob groups (``compile.*``, ``amp.*``...) are generated from the knob table:
a knob left at ``???`` is searched by ``task=tune`` and takes its default under ``task=measure``;
a knob given a value is fixed.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import logging
from dataclasses import asdict, dataclass, field, fields, make_dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from autocompile.config.choices import Knobs, compiles
from autocompile.config.compare_settings import CompareSettings, overrides
from autocompile.config.gpus import check_triton, device_name
from autocompile.config.knobs import KNOBS, Env, KnobError, TrialConfig
from autocompile.config.script_settings import ScriptSettings, ScriptSpec, calls_prepare, script_env
from autocompile.config.sections import LaunchSettings, ObjectiveSettings, StudySettings, TrackingSettings
from autocompile.config.space import lead_knobs
from autocompile.config.spec import MeasureSettings, ModelSpec, TrialSpec, Workload
from autocompile.workload.infer import ModelFacts
from autocompile.workload.models import factory_kwargs, resolve
from autocompile.workload.parts import DataFacts, data_problem, knob_facts
from autocompile.workload.units import Structure

log = logging.getLogger(__name__)

TASKS = ("tune", "measure", "compare")


def _knob_groups() -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for key in KNOBS:
        *parents, leaf = key.split(".")
        node = tree
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = MISSING
    return tree


@dataclass
class _BaseConfig:
    task: str = "tune"
    """tune: run a study; measure: one trial of the knobs given; compare: compare.candidates side by side."""
    output_root: str = "runs"
    """Where run directories (and the default MLflow store) go."""
    model: Any = None
    """Chosen with +model=NAME (conf/model/NAME.yaml) or your own model._target_."""
    workload: Workload = field(default_factory=Workload)
    measure: MeasureSettings = field(default_factory=MeasureSettings)
    study: StudySettings = field(default_factory=StudySettings)
    objective: ObjectiveSettings = field(default_factory=ObjectiveSettings)
    tracking: TrackingSettings = field(default_factory=TrackingSettings)
    launch: LaunchSettings = field(default_factory=LaunchSettings)
    compare: CompareSettings = field(default_factory=CompareSettings)
    script: ScriptSettings = field(default_factory=ScriptSettings)
    """``script.path=train.py``: every trial runs your own training script as it is (no +model needed)."""


# One field per knob group of the knob table (compile, amp, ...), every knob ??? until given.
AppConfig = make_dataclass(
    "AppConfig",
    [(f.name, Any, field(default_factory=lambda name=f.name: _knob_groups()[name])) for f in fields(TrialConfig)],
    bases=(_BaseConfig,),
)


def register() -> None:
    """Put the schema in Hydra's ConfigStore (config.yaml lists it first in its defaults)."""
    OmegaConf.register_new_resolver("ac_join", lambda xs: "-".join(str(x) for x in xs), replace=True)
    OmegaConf.register_new_resolver(
        "ac_ws", lambda *, _root_: _root_.workload.nproc_per_node * _root_.workload.nnodes, replace=True)
    OmegaConf.register_new_resolver(
        "ac_device", lambda device: Workload(device=device).resolved_device(), replace=True)
    OmegaConf.register_new_resolver("ac_fixed", study_variant, replace=True)
    OmegaConf.register_new_resolver("ac_knobs_help", knobs_help, replace=True)
    OmegaConf.register_new_resolver("ac_job", job_name, replace=True)
    OmegaConf.register_new_resolver("ac_basename", lambda path: str(path).rsplit(".", 1)[-1], replace=True)
    cs = ConfigStore.instance()
    cs.store(name="autocompile_schema", node=AppConfig)


def job_name(*, _root_: DictConfig) -> str:
    """The study name's first part: the model and workload (``gpt2-tiny-bs8-seq128``), or the script and a hash
    of its arguments (``train-3f2a9c1b``)."""
    script = _root_.get("script")
    if script is not None and script.path:
        return _script(script).job_name()
    w = _root_.workload
    return f"{_root_.model.name}-bs{w.batch_size}-seq{'-'.join(str(x) for x in w.seq_len)}"


def _script(node: DictConfig) -> ScriptSettings:
    script = ScriptSettings.__new__(ScriptSettings)  # named before it is validated (settings_from does that)
    script.path, script.args = str(node.path), str(node.args)
    return script


def study_variant(*, _root_: DictConfig) -> str:
    """What a study fixes, for its name: given knobs, and an objective whose values differ from the
    default's (Optuna keeps each trial's values, so another objective is another study)."""
    if _root_.task != "tune":
        return ""
    parts = [f"{key}={str(value).lower() if isinstance(value, bool) else value}"
             for key, value in fixed_knobs(_root_).items()]
    objective, default = _root_.objective, ObjectiveSettings()
    if objective.kind != default.kind:
        parts.append(f"objective={objective.kind}")
    if objective.kind == "time_to_train" and objective.horizon_steps != default.horizon_steps:
        parts.append(f"horizon={objective.horizon_steps}")
    return "".join(f"+{part}" for part in parts)


def knobs_help() -> str:
    """The knob table for ``--help``: key, values (on a CUDA machine, world size 2), doc."""
    env = Env.detect("cuda", 2, True)
    flat = TrialConfig().flat()
    # Values can depend on earlier knobs (ddp.optimize on compiled autograd): list the union.
    variants = [flat, {**flat, "compile.compiled_autograd": True}]
    lines = []
    for key, (spec, default) in KNOBS.items():
        allowed = dict.fromkeys(v for variant in variants for v in spec.allowed(variant, env))
        values = "|".join("null" if v is None else str(v) for v in allowed)
        lines.append(f"  {key:<44} {values}  (default {default})\n      {spec.doc}"
                     + (f" Needs {spec.when.text}." if spec.when else ""))
    return "\n".join(lines)


AUTOTUNE_TIMEOUT_FACTOR = 3.0
"""A cold max-autotune compile benchmarks every matmul's candidate kernels (and coordinate-descent tuning every
kernel's launch parameters), on a slot's share of the cores when slots run together: many times a default
compile. Such trials get this many times ``measure.timeout_s`` rather than timing out as failures."""


def autotunes(config: TrialConfig) -> bool:
    """Whether a configuration compiles with autotuning: a ``max-autotune`` mode or coordinate-descent tuning."""
    c = config.compile
    return compiles(c.scope) and (c.mode.startswith("max-autotune") or bool(c.options.coordinate_descent_tuning))


class ConfigError(ValueError):
    """A configuration the tool cannot run; the message names the fix."""


@dataclass
class Settings:
    """Everything a task needs, validated."""

    task: str
    output_root: Path
    model: ModelSpec
    workload: Workload
    measure: MeasureSettings
    study: StudySettings
    objective: ObjectiveSettings
    tracking: TrackingSettings
    launch: LaunchSettings
    compare: CompareSettings
    fixed_knobs: Knobs
    """Knobs the user gave a value: fixed in a study, the configuration in a measurement."""
    device: str
    threads: int
    script: ScriptSettings = field(default_factory=ScriptSettings)
    """The user's own script, when the job is one (``script.path``); ``model`` then only names it."""

    @property
    def cache_dir(self) -> Path | None:
        """The shared inductor cache of ``measure.cache=warm``; None = a cold cache per trial."""
        return self.output_root / "inductor_cache_warm" if self.measure.cache == "warm" else None

    @property
    def patience_s(self) -> float:
        """How long a trial running elsewhere may take before waiting on it stops: its own timeout and a margin."""
        return self.measure.timeout_s * AUTOTUNE_TIMEOUT_FACTOR + 60

    def timeout_s(self, config: TrialConfig) -> float:
        """``measure.timeout_s``, times :data:`AUTOTUNE_TIMEOUT_FACTOR` for a configuration that autotunes."""
        return self.measure.timeout_s * (AUTOTUNE_TIMEOUT_FACTOR if autotunes(config) else 1.0)

    @property
    def tracking_uri(self) -> str:
        return self.tracking.uri or f"sqlite:///{(self.output_root / 'mlflow.db').resolve()}"

    @cached_property
    def env(self) -> Env:
        """What may be sampled here: device, world size, torch, the model's structure and the job's parts (read
        once per Settings: ``dataclasses.replace`` makes a new one)."""
        if self.script.given:  # the script builds its own job: only what its agent reaches is asked
            return script_env(self.device, self.workload.world_size, calls_prepare(self.script.path))
        return Env.detect(self.device, self.workload.world_size, self.workload.shapes_vary,
                          model_structure(self.model), knob_facts(self.workload, self.device))

    @cached_property
    def lead_knobs(self) -> Knobs:
        """Where the search starts: :func:`autocompile.config.space.lead_knobs` (nvidia-smi read once)."""
        return lead_knobs(self.study.start_precision, self.device, self.fixed_knobs)

    def measured_on(self) -> dict[str, Any]:
        """What every measurement of a study shares: a resumed study (or a second tuner on a shared
        storage) must match it, or results from another workload or machine would stand for this
        one (dedupe reuses them)."""
        skip = ("timeout_s", "peak_tflops", "artifacts", "launcher")  # python or torchrun: the same measurement
        measure = {k: v for k, v in asdict(self.measure).items() if k not in skip}
        machine = {"measure": measure, "device_name": device_name(self.device), "versions": versions()}
        if self.script.given:
            # An unset accelerate config leaves the identity of the studies made before it existed.
            script = {k: v for k, v in asdict(self.script).items() if k != "accelerate_config" or v}
            return {"script": script, "script_code": self.script.source_hash(),
                    "workload": {"nproc_per_node": self.workload.nproc_per_node, "nnodes": self.workload.nnodes,
                                 "device": self.device, "threads": self.threads}, **machine}
        return {"model": asdict(self.model), "model_code": model_code(self.model.target),
                "workload": {**asdict(self.workload), "device": self.device, "threads": self.threads}, **machine}

    def trial_spec(self, config: TrialConfig, threads: int | None = None) -> TrialSpec | ScriptSpec:
        measure = replace(self.measure, timeout_s=self.timeout_s(config))
        if self.script.given:
            return ScriptSpec(knobs=config.flat(), script=self.script, workload=self.workload, measure=measure,
                              device=self.device, threads=threads or self.threads)
        return TrialSpec(knobs=config.flat(), model=self.model, workload=self.workload, measure=measure,
                         device=self.device, threads=threads or self.threads)

    def candidate_configs(self) -> list[TrialConfig]:
        """``task=compare``: each candidate's configuration (its overrides on the command line's knobs)."""
        texts = self.compare.candidates
        if len(texts) < 2:
            raise ConfigError(f"task=compare needs two or more compare.candidates, got {len(texts)}: e.g. "
                              "'compare.candidates=[\"compile.scope=none\",\"compile.scope=module\"]'")
        configs = []
        for text in texts:
            try:
                configs.append(TrialConfig.from_flat({**self.fixed_knobs, **overrides(text)}, self.env))
            except KnobError as exc:
                raise ConfigError(f"compare.candidates {text!r}: {exc}") from exc
        return configs


_READ: dict[str, tuple[Structure, ModelFacts] | None] = {}


def read_model(model: ModelSpec) -> tuple[Structure, ModelFacts] | None:
    """The model's repeated stacks and what the data can learn from it (``infer.model_facts``), built
    once per model (on the meta device: no memory, no init); None when it cannot be built here."""
    key = json.dumps([model.target, model.kwargs], sort_keys=True, default=str)
    if key not in _READ:
        import torch

        from autocompile.workload.infer import model_facts
        from autocompile.workload.models import build

        try:
            with torch.device("meta"):
                built = build(model.target, model.kwargs)
        except Exception as meta_exc:  # noqa: BLE001 (user code) a factory that loads weights: build it for real
            try:
                built = build(model.target, model.kwargs)
            except Exception as exc:  # noqa: BLE001 (user code; the worker will report it per trial)
                log.warning("model %s could not be built to read its structure (%r; on meta: %r): every "
                            "regional and checkpointing value is offered", model.name, exc, meta_exc)
                built = None
        _READ[key] = None if built is None else (Structure.of(built), model_facts(built))
    return _READ[key]


def model_structure(model: ModelSpec) -> Structure | None:
    """The model's repeated stacks; None when it cannot be built here (every structural value is offered)."""
    read = read_model(model)
    return read[0] if read else None


def check_data(model: ModelSpec, workload: Workload) -> None:
    """The data part gets every argument it needs, from its keys, the job or the model, or fails in one line."""
    read = read_model(model)
    if read is None:
        return  # the model cannot be built here; the worker reports what is missing per trial
    facts: DataFacts = {**read[1], **({"vocab_size": model.vocab_size} if model.vocab_size else {}),
             "batch_size": 1, "seq_len": [], "seed": 0, "rank": 0, "world_size": 1, "device": "cpu"}
    problem = data_problem(workload.data, facts)
    if problem:
        raise ConfigError(problem)


def model_code(target: str) -> str:
    """Identity of the model's code: a hash of the factory's source file (a changed model is another study)."""
    try:
        source = inspect.getsourcefile(resolve(target))
        return hashlib.sha256(Path(source).read_bytes()).hexdigest()[:16] if source else ""
    except (ImportError, OSError, TypeError):
        return ""


def versions() -> dict[str, str]:
    import importlib.metadata

    import torch

    found = {"torch": torch.__version__}
    for package in ("transformers", "triton"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[package] = importlib.metadata.version(package)
    return found


def model_spec(node: Any, available: list[str]) -> ModelSpec:
    if node is None:
        raise ConfigError(f"no model given: add +model=NAME with NAME one of {', '.join(available)}, "
                          "or +model=custom model._target_=pkg.module.factory")
    if isinstance(node, DictConfig) and ("_target_" not in node or OmegaConf.is_missing(node, "_target_")):
        raise ConfigError("the model config has no _target_: set model._target_=pkg.module.factory")
    raw = dict(OmegaConf.to_container(node, resolve=True)) if isinstance(node, DictConfig) else dict(node)
    target = raw.pop("_target_", None)
    if target in (None, "", "???"):
        raise ConfigError("the model config has no _target_: set model._target_=pkg.module.factory")
    name = str(raw.pop("name", target.rsplit(".", 1)[-1]))
    vocab = raw.pop("vocab_size", None)
    if vocab is not None:  # None: read from the model's input embedding
        raw["vocab_size"] = vocab
    try:
        factory_kwargs(target, raw)
        return ModelSpec(name=name, target=target, vocab_size=None if vocab is None else int(vocab), kwargs=raw)
    except (ImportError, ValueError) as exc:
        raise ConfigError(str(exc)) from exc


def script_model(script: ScriptSettings, node: Any) -> ModelSpec:
    """The model's name for a script study: the script's (the script builds its model itself)."""
    if node is not None:
        raise ConfigError("both +model and script.path are given: a study tunes autocompile's loop over a model, "
                          "or your script; drop one")
    model = ModelSpec(name=script.name, target="script.main")
    model.target = f"script:{script.path}"  # names the script; nothing to import
    return model


def fixed_knobs(cfg: DictConfig) -> Knobs:
    """Knobs given a value (every knob is in a group, so its parent node exists)."""
    fixed = {}
    for key in KNOBS:
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(cfg, parent)
        if not OmegaConf.is_missing(node, leaf):
            fixed[key] = node[leaf]
    return fixed


def settings_from(cfg: DictConfig, available_models: list[str]) -> Settings:
    """Validate a composed config; every problem surfaces as one ConfigError naming the fix."""
    try:
        if cfg.task not in TASKS:
            raise ConfigError(f"task={cfg.task!r}: choose one of {', '.join(TASKS)}")
        script = OmegaConf.to_object(cfg.script)
        model = script_model(script, cfg.model) if script.given else model_spec(cfg.model, available_models)
        workload = OmegaConf.to_object(cfg.workload)
        measure = OmegaConf.to_object(cfg.measure)
        study = OmegaConf.to_object(cfg.study)
        objective = OmegaConf.to_object(cfg.objective)
        tracking = OmegaConf.to_object(cfg.tracking)
        launch = OmegaConf.to_object(cfg.launch)
        compare = OmegaConf.to_object(cfg.compare)
        device = workload.resolved_device()
        if device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise ConfigError("workload.device=cuda but no CUDA device is visible: use workload.device=cpu")
            if fixed_knobs(cfg).get("compile.backend", "inductor") == "inductor" and (problem := check_triton()):
                raise ConfigError(problem)
        settings = Settings(
            task=cfg.task, output_root=Path(cfg.output_root), model=model, workload=workload, measure=measure,
            study=study, objective=objective, tracking=tracking, launch=launch, compare=compare,
            fixed_knobs=fixed_knobs(cfg),
            device=device, threads=workload.resolved_threads(), script=script,
        )
        # Fixed knobs must be valid on their own; under tune, one that does not apply to every
        # sampled trial is fine, so only measure is strict.
        TrialConfig.from_flat(settings.fixed_knobs, settings.env, strict=settings.task == "measure")
        if settings.task == "compare":
            settings.candidate_configs()
        if not script.given:
            check_data(model, workload)
        return settings
    except (KnobError, ValueError) as exc:
        raise ConfigError(str(exc)) from exc
