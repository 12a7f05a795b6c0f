"""The command lines and config files behind a result: where the shipped configs live, which models
they name, and the Hydra overrides that compose a study's workload and a configuration again, so
every number the tool prints comes with the command that reproduces it."""

from __future__ import annotations

import re
import shlex
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import yaml

from autocompile.config.choices import Knobs
from autocompile.config.knobs import KNOBS
from autocompile.config.settings import LaunchSettings, Settings, _BaseConfig
from autocompile.config.spec import PARTS, MeasureSettings, ModelSpec, Workload
from autocompile.workload import TargetNode


def config_dir() -> Path:
    """Installed wheels carry the configs inside the package; a source checkout has them at the top."""
    here = Path(__file__).resolve().parent.parent  # the autocompile package
    for candidate in (here / "conf", here.parent / "conf"):
        if (candidate / "config.yaml").is_file():
            return candidate
    raise FileNotFoundError(f"autocompile configs not found next to {here}; reinstall the package")


CONF_DIR = config_dir()


def available_models() -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml"))


def measure_command(settings: Settings, config: Knobs, threads: int | None = None) -> str:
    """The ``task=measure`` command that measures ``config`` on the study's workload again.

    ``threads`` is what the trial ran with (its result's environment): a trial slot may have used
    fewer threads than a lone measurement picks, so it is pinned when it differs."""
    return shlex.join(["python", "-m", "autocompile", *measure_overrides(settings, config, threads)])


def measure_overrides(settings: Settings, config: Knobs, threads: int | None = None) -> list[str]:
    """Hydra overrides composing the study's model, workload and measurement plus ``config``: only
    what differs from the defaults, so the command stays readable."""
    if settings.script.given:  # the user's own script: its path and arguments stand for the model
        choice = None
        args = [f"script.path={hydra_value(settings.script.path)}"]
        args += [f"script.args={hydra_value(settings.script.args)}"] if settings.script.args else []
    else:
        choice = model_choice(settings.model)
        args = model_overrides(settings.model, choice)
    args.append("task=measure")
    if settings.output_root != Path(_BaseConfig.output_root):
        # The warm inductor cache (measure.cache=warm) and the study's run directory live there.
        args.append(f"output_root={hydra_value(str(settings.output_root))}")
    w, defaults = settings.workload, workload_defaults(choice)
    for f in fields(Workload):
        value = getattr(w, f.name)
        if f.name == "device":
            value = settings.device  # resolved: "auto" may pick another device elsewhere
        elif f.name == "threads" and not value and threads and threads != settings.threads:
            value = threads
        elif value == defaults[f.name]:
            continue
        elif f.name in PARTS:
            args += dict_overrides(f"workload.{f.name}", defaults[f.name], value)
            continue
        args.append(f"workload.{f.name}={hydra_value(value)}")
    if w.nnodes > 1:
        launch, default_launch = settings.launch, LaunchSettings()
        args += [f"launch.{k}={hydra_value(getattr(launch, k))}" for k in ("rdzv_host", "remote_agent")
                 if getattr(launch, k) != getattr(default_launch, k)]
    default_measure = MeasureSettings()
    args += [f"measure.{f.name}={hydra_value(getattr(settings.measure, f.name))}" for f in fields(MeasureSettings)
             if getattr(settings.measure, f.name) != getattr(default_measure, f.name)]
    args += [f"{k}={hydra_value(v)}" for k, v in config.items() if v != KNOBS[k][1]]
    return args


def dict_overrides(key: str, base: TargetNode, want: TargetNode) -> list[str]:
    """The edits that turn config node ``base`` into ``want``: changed, added (``+``) and removed (``~``) keys."""
    args = [f"~{key}.{k}" for k in base if k not in want]
    args += [f"{key}.{k}={hydra_value(v)}" for k, v in want.items() if k in base and (v != base.get(k) or type(v) is not
                                                                                       type(base.get(k)))]
    return args + [f"+{key}.{k}={hydra_value(v)}" for k, v in want.items() if k not in base]


def model_yaml(choice: str) -> dict[str, Any]:
    """The model config of ``+model=choice`` (under ``model:`` in a config that also sets the workload)."""
    node = yaml.safe_load((config_dir() / "model" / f"{choice}.yaml").read_text()) or {}
    return node["model"] if "_target_" not in node and isinstance(node.get("model"), dict) else node


def model_choice(spec: ModelSpec) -> str:
    """The ``+model=`` option that composed ``spec``: Hydra's own record inside a Hydra job, else the
    named config with the same name and factory, else ``custom`` (which composes any model)."""
    from hydra.core.hydra_config import HydraConfig

    available = set(available_models())
    if HydraConfig.initialized():
        choice = HydraConfig.get().runtime.choices.get("model")
        if choice in available:
            return str(choice)
    for name in sorted(available - {"custom"}):
        node = model_yaml(name)
        if node.get("name", name) == spec.name and node.get("_target_") == spec.target:
            return name
    return "custom"


def model_overrides(spec: ModelSpec, choice: str) -> list[str]:
    """``+model=choice`` and the edits that turn that config into ``spec``: changed keys, added keys
    (``+``), removed keys (``~``). Any choice composes the same model; the right one in few edits."""
    want = {"name": spec.name, "_target_": spec.target, **spec.kwargs}
    base = model_yaml(choice)
    if "ac_basename" in str(base.get("name", "")):
        # custom.yaml names the model after its factory: only another name needs saying.
        base["name"] = spec.target.rsplit(".", 1)[-1]
    args = [f"+model={choice}"]
    for key, value in base.items():
        if key not in want:
            args.append(f"~model.{key}")
        elif value == "???" or value != want[key] or type(value) is not type(want[key]):
            args.append(f"model.{key}={hydra_value(want[key])}")
    args += [f"+model.{key}={hydra_value(value)}" for key, value in want.items() if key not in base]
    return args


def workload_defaults(model: str | None = None) -> dict[str, Any]:
    """What ``workload`` composes to without overrides: the schema under conf/workload/default.yaml,
    under the workload the model's config picks (``override /workload: gpt2``: its training shape),
    under what the model's config sets itself (``workload.data``: bert-tiny's masked tokens, custom's)."""
    found = {**asdict(Workload())}
    for name in ("default", *([preset] if model and (preset := workload_preset(model)) else [])):
        path = config_dir() / "workload" / f"{name}.yaml"
        found |= {k: v for k, v in (yaml.safe_load(path.read_text()) or {}).items() if k != "defaults"}
    node = (yaml.safe_load((config_dir() / "model" / f"{model}.yaml").read_text()) or {}) if model else {}
    own = node.get("workload") if "_target_" not in node else None
    for key, value in (own if isinstance(own, dict) else {}).items():
        found[key] = {**found[key], **value} if isinstance(value, dict) and isinstance(found.get(key), dict) else value
    return found


def workload_preset(choice: str) -> str | None:
    """The workload config that ``+model=choice`` selects in its defaults list, if any."""
    node = yaml.safe_load((config_dir() / "model" / f"{choice}.yaml").read_text()) or {}
    for entry in node.get("defaults") or []:
        if isinstance(entry, dict) and "override /workload" in entry:
            return str(entry["override /workload"])
    return None


UNQUOTED = re.compile(r"[A-Za-z0-9_./:@%+-]+")


def hydra_value(value: Any) -> str:
    """``value`` in Hydra's override grammar, read back as the same value and type."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    if UNQUOTED.fullmatch(text) and text.lower() not in ("true", "false", "null") and not _is_number(text):
        return text
    # Quoted (double quotes read best inside the shell's single ones): backslashes before a quote or
    # the closing one doubled, that quote escaped, and ${ escaped so OmegaConf keeps it as text.
    q = "'" if '"' in text else '"'
    body = re.sub(rf"(\\+)(?={q}|$)", lambda m: m.group(1) * 2, text).replace(q, "\\" + q)
    return q + body.replace("${", "\\${") + q


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
