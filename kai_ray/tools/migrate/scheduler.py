"""KAI's scheduler settings as kai-ray's SchedulerConfig (`config.kai-ray.io/v1alpha1`).

Three KAI sources say how its scheduler runs: the `SchedulingShard` (`kai.scheduler/v1`:
actions, plugins and their arguments, `kValue`, `usageDBConfig`, `placementStrategy`,
`args`), the operator's `Config` (`kai.scheduler/v1`, `global.schedulerName` and
`global.queueLabelKey`), and the scheduler's own configuration file (`actions:` as a
comma-separated string and `tiers:` of plugins, the ConfigMap KAI's operator renders).
Each becomes a `Settings`, and the settings become one SchedulerConfig per shard.

Where kai-ray's defaults differ from KAI's, the KAI value is written out: no usage
decay unless `halfLifePeriod` is set (kai-ray's default half-life is 1h), at most 16
jobs moved by consolidation (kai-ray's default is 8), and time-based fairness only
with a usage database (KAI's `kValue` has no effect without one). Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kai_ray.tools.migrate.findings import Findings
from kai_ray.tools.migrate.objects import mapping, sequence, text, unknown_fields
from kai_ray.tools.migrate.units import (
    duration_text,
    go_duration_seconds,
    number,
    prometheus_duration_seconds,
    whole,
)
from kai_ray.values.config import CONFIG_API_VERSION
from kai_ray.values.errors import InvalidFieldError

KAI_OPERATOR_API = "kai.scheduler/v1"
KAI_SCHEDULER_NAME = "kai-scheduler"
KAI_QUEUE_LABEL = "kai.scheduler/queue"
#: KAI's actions, by their default priority (higher runs first), and kai-ray's names.
KAI_ACTIONS = {
    "allocate": (500, "allocate"),
    "consolidation": (400, "consolidate"),
    "reclaim": (300, "reclaim"),
    "preempt": (200, "preempt"),
    "stalegangeviction": (100, "stale-gang-eviction"),
}
#: Plugins whose arguments kai-ray reads (each handled below); any other argument changes.
_READ_ARGUMENTS = {"proportion": ("kValue",), "nodeplacement": ("gpu", "cpu")}
#: The minruntime plugin's arguments, as the shard's `minRuntime` fields.
_MIN_RUNTIME_ARGUMENTS = {
    "defaultPreemptMinRuntime": "preemptMinRuntime",
    "defaultReclaimMinRuntime": "reclaimMinRuntime",
}
#: Shard `args` (scheduler flags) kai-ray has a setting for.
_ARGS = {
    "schedule-period": "cyclePeriod",
    "default-staleness-grace-period": "staleGangGracePeriod",
    "max-consolidation-preemptees": "consolidationMaxJobs",
}
_USAGE_PARAMS_IGNORED = ("fetchInterval", "stalenessPeriod", "waitTimeout", "extraParams")


@dataclass
class Settings:
    """The scheduler settings found in one KAI object, as kai-ray's spec fields."""

    name: str
    spec: dict[str, Any] = field(default_factory=dict)


def config_settings(doc: dict[str, Any], findings: Findings) -> dict[str, Any]:
    """What the operator's `Config` says that kai-ray reads: scheduler name and queue label."""
    spec = mapping(doc.get("spec"), "spec")
    global_ = mapping(spec.get("global"), "spec.global")
    out: dict[str, Any] = {}
    name = text(global_.get("schedulerName"), "spec.global.schedulerName")
    if name:
        out["kaiSchedulerName"] = name
    label = text(global_.get("queueLabelKey"), "spec.global.queueLabelKey")
    if label and label != KAI_QUEUE_LABEL:
        findings.change(
            "spec.global.queueLabelKey",
            f"kai-ray reads the queue from kai-ray.io/queue or {KAI_QUEUE_LABEL} only; "
            f"relabel workloads that use {label}",
        )
    for key in sorted(spec):
        if key != "global":
            findings.note(
                f"spec.{key}", "how KAI's components are deployed: see the chart's values"
            )
    return out


def shard_settings(doc: dict[str, Any], findings: Findings) -> Settings:
    meta = mapping(doc.get("metadata"), "metadata")
    spec = mapping(doc.get("spec"), "spec")
    settings = Settings(str(meta.get("name") or "default"))
    out = settings.spec
    plugins = mapping(spec.get("plugins"), "spec.plugins")
    placed_by = _node_placement(plugins, "spec.plugins")
    if placed_by is None:  # the plugin's arguments, when given, replace these
        placed_by = (
            mapping(spec.get("placementStrategy"), "spec.placementStrategy"),
            "spec.placementStrategy",
        )
    out["placementStrategy"] = _placement(*placed_by, findings)
    out["actions"] = _shard_actions(spec.get("actions"), out["placementStrategy"], findings)
    k_value = _k_value(spec.get("kValue"), plugins, findings)
    out["timeBasedFairness"] = _fairness(spec.get("usageDBConfig"), k_value, "spec", findings)
    _plugins(plugins, "spec.plugins", findings)
    _min_runtime(spec.get("minRuntime"), findings)
    out.update(_args(mapping(spec.get("args"), "spec.args"), findings))
    if spec.get("partitionLabelValue"):
        findings.change(
            "spec.partitionLabelValue",
            "kai-ray has no scheduling shards: it schedules every node",
        )
    if spec.get("queueDepthPerAction"):
        findings.change(
            "spec.queueDepthPerAction", "kai-ray tries every waiting job of a queue in each action"
        )
    for key in ("scenarioSearchBudgets", "goMemLimit", "goMemLimitRatio"):
        if spec.get(key) is not None:
            findings.note(f"spec.{key}", "a limit of KAI's Go scheduler; dropped")
    return settings


def file_settings(doc: dict[str, Any], findings: Findings) -> Settings:
    """KAI's scheduler configuration file: `actions: "allocate, reclaim"`, `tiers`."""
    unknown_fields(
        doc,
        ("actions", "tiers", "queueDepthPerAction", "usageDBConfig", "scenarioSearchBudgets"),
        "",
        findings,
    )
    settings = Settings("default")
    actions = text(doc.get("actions"), "actions") or ""
    names = [a.strip() for a in actions.split(",") if a.strip()]
    settings.spec["actions"] = [_action_name(a, "actions", findings) for a in names]
    settings.spec["actions"] = [a for a in settings.spec["actions"] if a]
    plugins: dict[str, Any] = {}
    for t, tier in enumerate(sequence(doc.get("tiers"), "tiers")):
        listed = mapping(tier, f"tiers[{t}]").get("plugins")
        for p, plugin in enumerate(sequence(listed, f"tiers[{t}].plugins")):
            block = mapping(plugin, f"tiers[{t}].plugins[{p}]")
            name = text(block.get("name"), f"tiers[{t}].plugins[{p}].name") or ""
            plugins[name] = {"arguments": block.get("arguments") or {}}
    placed_by = _node_placement(plugins, "tiers[].plugins")
    if placed_by is not None:
        settings.spec["placementStrategy"] = _placement(*placed_by, findings)
    k_value = _k_value(None, plugins, findings)
    settings.spec["timeBasedFairness"] = _fairness(doc.get("usageDBConfig"), k_value, "", findings)
    _plugins(plugins, "tiers[].plugins", findings)
    if doc.get("queueDepthPerAction"):
        findings.change(
            "queueDepthPerAction", "kai-ray tries every waiting job of a queue in each action"
        )
    return settings


def scheduler_config(settings: Settings, scheduler_name: str) -> dict[str, Any]:
    """The SchedulerConfig document: KAI's defaults where kai-ray's differ, then the settings."""
    spec: dict[str, Any] = {
        "schedulerName": scheduler_name,
        "cyclePeriod": "1s",
        "placementStrategy": "binpack",
        "staleGangGracePeriod": "60s",
        "consolidationMaxJobs": 16,
        "consolidationMinRuntime": "0s",
        "timeBasedFairness": {"k": 0, "halfLife": "0s", "window": "168h", "windowType": "sliding"},
    }
    spec.update(settings.spec)
    if "actions" not in spec:
        spec["actions"] = _default_actions(spec["placementStrategy"])
    return {
        "apiVersion": CONFIG_API_VERSION,
        "kind": "SchedulerConfig",
        "metadata": {"name": settings.name},
        "spec": spec,
    }


def _node_placement(plugins: dict[str, Any], prefix: str) -> tuple[dict[str, Any], str] | None:
    """The nodeplacement plugin's arguments (`gpu`, `cpu`) and their path, when given."""
    path = f"{prefix}.nodeplacement.arguments"
    block = mapping(plugins.get("nodeplacement"), f"{prefix}.nodeplacement")
    arguments = mapping(block.get("arguments"), path)
    return (arguments, path) if arguments else None


def _placement(block: dict[str, Any], path: str, findings: Findings) -> str:
    """binpack or spread: KAI's GPU and CPU strategies, which kai-ray has as one."""
    gpu = text(block.get("gpu"), f"{path}.gpu") or "binpack"
    cpu = text(block.get("cpu"), f"{path}.cpu") or "binpack"
    for key, strategy in (("gpu", gpu), ("cpu", cpu)):
        if strategy not in ("binpack", "spread"):
            raise InvalidFieldError(f"{path}.{key}", f"binpack or spread, got {strategy!r}")
    if gpu != cpu:
        findings.change(
            path,
            f"kai-ray has one strategy for every pod: {gpu} (the GPU one) is written; "
            f"CPU-only pods were placed by {cpu}",
        )
    return gpu


def _default_actions(strategy: str) -> list[str]:
    order = sorted(KAI_ACTIONS.items(), key=lambda item: -item[1][0])
    return [
        ours for kai, (_, ours) in order if not (kai == "consolidation" and strategy == "spread")
    ]


def _shard_actions(value: Any, strategy: str, findings: Findings) -> list[str]:
    overrides = mapping(value, "spec.actions")
    chosen: list[tuple[int, str]] = []
    for kai, (priority, ours) in KAI_ACTIONS.items():
        block = mapping(overrides.get(kai), f"spec.actions.{kai}")
        enabled = block.get("enabled", not (kai == "consolidation" and strategy == "spread"))
        if enabled:
            chosen.append(
                (whole(block.get("priority", priority), f"spec.actions.{kai}.priority"), ours)
            )
    for kai in overrides:
        if kai not in KAI_ACTIONS:
            findings.change(f"spec.actions.{kai}", "kai-ray has no such action; dropped")
    return [ours for _, ours in sorted(chosen, key=lambda item: -item[0])]


def _action_name(kai: str, path: str, findings: Findings) -> str | None:
    if kai in KAI_ACTIONS:
        return KAI_ACTIONS[kai][1]
    findings.change(path, f"kai-ray has no action {kai!r}; dropped")
    return None


def _k_value(shard_k: Any, plugins: dict[str, Any], findings: Findings) -> float:
    """The proportion plugin's kValue: its arguments replace the shard's (as in KAI)."""
    arguments = mapping(
        mapping(plugins.get("proportion"), "spec.plugins.proportion").get("arguments"),
        "spec.plugins.proportion.arguments",
    )
    if arguments:
        raw = arguments.get("kValue", "1")
        try:
            return float(raw)
        except (TypeError, ValueError):
            raise InvalidFieldError(
                "spec.plugins.proportion.arguments.kValue", f"expected a number, got {raw!r}"
            ) from None
    return 1.0 if shard_k is None else number(shard_k, "spec.kValue")


def _fairness(value: Any, k_value: float, path: str, findings: Findings) -> dict[str, Any]:
    prefix = f"{path}.usageDBConfig" if path else "usageDBConfig"
    config = mapping(value, prefix)
    out: dict[str, Any] = {"k": 0, "halfLife": "0s", "window": "168h", "windowType": "sliding"}
    if not config:
        if k_value != 1.0:
            findings.note(
                f"{path}.kValue" if path else "kValue",
                "KAI uses kValue only with a usageDBConfig; time-based fairness stays off",
            )
        return out
    if k_value < 0:
        raise InvalidFieldError(f"{path}.kValue", f"must not be negative, got {k_value:g}")
    out["k"] = int(k_value) if k_value.is_integer() else k_value
    findings.note(prefix, "kai-ray records usage itself (no Prometheus); the connection is dropped")
    params = mapping(config.get("usageParams"), f"{prefix}.usageParams")
    where = f"{prefix}.usageParams"
    if params.get("halfLifePeriod") is not None:
        seconds = go_duration_seconds(params["halfLifePeriod"], f"{where}.halfLifePeriod")
        out["halfLife"] = duration_text(max(seconds, 0.0))
    if params.get("windowSize") is not None:
        out["window"] = duration_text(
            prometheus_duration_seconds(params["windowSize"], f"{where}.windowSize")
        )
    window_type = text(params.get("windowType"), f"{where}.windowType") or "sliding"
    out["windowType"] = window_type
    if params.get("tumblingWindowStartTime") is not None:
        out["tumblingWindowStartTime"] = params["tumblingWindowStartTime"]
    if params.get("cronString"):
        out["cronString"] = text(params["cronString"], f"{where}.cronString")
    for key in _USAGE_PARAMS_IGNORED:
        if params.get(key) is not None:
            findings.note(f"{where}.{key}", "how KAI queries Prometheus; dropped")
    return out


def _plugins(plugins: dict[str, Any], prefix: str, findings: Findings) -> None:
    """Plugins kai-ray cannot follow: one turned off, reordered, or given arguments."""
    for name, value in sorted(plugins.items()):
        path = f"{prefix}.{name}"
        block = mapping(value, path)
        if block.get("enabled") is False:
            findings.change(f"{path}.enabled", "kai-ray cannot turn off a part of its cycle")
        if block.get("priority") is not None:
            findings.change(f"{path}.priority", "kai-ray's order of scoring is fixed")
        arguments = mapping(block.get("arguments"), f"{path}.arguments")
        read = _READ_ARGUMENTS.get(name, ())
        for key in sorted(arguments):
            if key in read or (name == "minruntime" and key in _MIN_RUNTIME_ARGUMENTS):
                continue
            findings.change(f"{path}.arguments.{key}", "kai-ray has no such setting; dropped")
        if name == "minruntime":
            named = {
                _MIN_RUNTIME_ARGUMENTS[k]: v
                for k, v in arguments.items()
                if k in _MIN_RUNTIME_ARGUMENTS
            }
            _min_runtime(named, findings)


def _min_runtime(value: Any, findings: Findings) -> None:
    block = mapping(value, "spec.minRuntime")
    for key in ("preemptMinRuntime", "reclaimMinRuntime"):
        if block.get(key) is not None:
            findings.change(
                f"spec.minRuntime.{key}",
                f"kai-ray has no scheduler-wide {key}: set it on the root Queues "
                "(their children inherit it)",
            )


def _args(args: dict[str, Any], findings: Findings) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for flag, value in sorted(args.items()):
        path = f"spec.args.{flag}"
        if flag not in _ARGS:
            findings.change(path, "kai-ray has no such setting; dropped")
            continue
        if flag == "max-consolidation-preemptees":
            out[_ARGS[flag]] = _whole_text(value, path)
            continue
        seconds = go_duration_seconds(value, path)
        if seconds < 0:
            findings.change(path, "negative (never) has no kai-ray equivalent; KAI's 60s is kept")
            continue
        out[_ARGS[flag]] = duration_text(seconds)
    return out


def _whole_text(value: Any, path: str) -> int:
    try:
        count = int(str(value))
    except ValueError:
        raise InvalidFieldError(path, f"expected a whole number, got {value!r}") from None
    if count < 0:
        raise InvalidFieldError(path, f"must not be negative, got {count}")
    return count
