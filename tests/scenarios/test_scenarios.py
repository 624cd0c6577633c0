"""Named YAML scenarios run through the whole cycle by the simulator (docs/scenarios.md).

Each `tests/scenarios/<area>/<name>.yaml` holds one mapping: `name` (the test id),
`rule` (an id from `rules.yaml`), `objects` (the Kubernetes objects the simulator
reads), optional `until`, and `expect`. The objects are written to a temporary
folder, loaded, simulated and reported exactly as `kai-ray simulate` does; the
report is then held against `expect`. A scenario file with an unknown key is an
error, so a typo cannot turn an expectation into a no-op.

`KAI_RAY_SCENARIO_BACKEND=ray` runs every scenario with the Ray placement backend
(`rayBackend.mode: always`, a local Ray cluster); `test_scenarios_ray.py` holds
the Ray backend's reports to the local backend's on every scenario.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from kai_ray.sim.engine import Simulation
from kai_ray.sim.loader import load
from kai_ray.sim.report import build_report
from kai_ray.sim.run import parse_until
from kai_ray.values.config import SchedulerConfig
from kai_ray.values.errors import InvalidObjectError

HERE = Path(__file__).resolve().parent
RULES_FILE = HERE / "rules.yaml"
MIN_SCENARIOS = 80
GPU = "nvidia.com/gpu"
#: Release reasons that are evictions by the scheduler (not completions or failures).
EVICTION_WORDS = ("consolidation", "stale-gang", "reclaim", "preempt")
#: Default slack when a queue amount is compared with an exact number.
QUEUE_TOLERANCE = 1e-6
#: The placement backend the scenarios run with: "local" (numpy, the default) or "ray".
BACKEND = os.environ.get("KAI_RAY_SCENARIO_BACKEND", "local")

SCENARIO_KEYS = {"name", "rule", "objects", "until", "expect"}
EXPECT_KEYS = {
    "jobs",
    "pods",
    "queues",
    "order",
    "shared_device",
    "different_devices",
    "pods_share_domain",
    "rejected",
    "evictions_max",
}
JOB_KEYS = {
    "started",
    "started_s",
    "finished_s",
    "reason_contains",
    "bound_pods",
    "min_member",
    "queue",
    "pods_on_nodes",
    "nodes_among",
    "avoids_nodes",
    "node_count",
    "distinct_nodes",
    "same_domain",
    "in_domain",
    "domain_count",
    "evicted",
    "times_evicted",
    "released_together",
    "running",
    "claim_devices",
    "claim_devices_in",
    "claim_devices_share",
}
POD_KEYS = {"bound", "node", "gpu_devices", "gpu_fraction", "claim_devices"}
QUEUE_KEYS = {"fair_share", "allocated", "requested", "at_s", "tolerance"}
QUEUE_AMOUNT_KEYS = ("fair_share", "allocated", "requested")


class ScenarioFileError(Exception):
    """The scenario file itself is malformed (as opposed to the scheduler being wrong)."""


# ------------------------------------------------------------------ reading files


@dataclass(frozen=True)
class Scenario:
    path: Path
    name: str
    rule: str
    objects: list[dict[str, Any]]
    until: str | None
    expect: dict[str, Any]

    @property
    def label(self) -> str:
        return f"scenario {self.name!r} ({self.path.relative_to(HERE)})"


def scenario_files() -> list[Path]:
    return sorted(p for p in HERE.rglob("*.yaml") if p != RULES_FILE)


def known_rules() -> dict[str, str]:
    rules = yaml.safe_load(RULES_FILE.read_text())
    if not isinstance(rules, dict) or not rules:
        raise ScenarioFileError(f"{RULES_FILE.name}: expected a mapping of rule id to text")
    return {str(k): str(v) for k, v in rules.items()}


def read_scenario(path: Path, rules: Mapping[str, str]) -> Scenario:
    raw = yaml.safe_load(path.read_text())
    where = path.relative_to(HERE)
    if not isinstance(raw, dict):
        raise ScenarioFileError(f"{where}: a scenario is one YAML mapping")
    _no_unknown(raw, SCENARIO_KEYS, str(where))
    for key in ("name", "rule", "objects", "expect"):
        if not raw.get(key):
            raise ScenarioFileError(f"{where}: {key} is missing or empty")
    if raw["rule"] not in rules:
        raise ScenarioFileError(f"{where}: rule {raw['rule']!r} is not listed in rules.yaml")
    objects = raw["objects"]
    if not isinstance(objects, list) or not all(isinstance(o, dict) for o in objects):
        raise ScenarioFileError(f"{where}: objects must be a list of mappings")
    until = raw.get("until")
    if until is not None:
        parse_until(str(until))
    _check_expect(raw["expect"], str(where))
    return Scenario(path, str(raw["name"]), raw["rule"], objects, until, raw["expect"])


def _no_unknown(values: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(values) - allowed)
    if unknown:
        raise ScenarioFileError(f"{where}: unknown key(s) {unknown}; known: {sorted(allowed)}")


def _check_expect(expect: Any, where: str) -> None:
    if not isinstance(expect, dict):
        raise ScenarioFileError(f"{where}: expect must be a mapping")
    _no_unknown(expect, EXPECT_KEYS, f"{where}: expect")
    sections = (("jobs", JOB_KEYS), ("pods", POD_KEYS), ("queues", QUEUE_KEYS))
    for section, keys in sections:
        entries = expect.get(section, {})
        if not isinstance(entries, dict):
            raise ScenarioFileError(f"{where}: expect.{section} must map names to expectations")
        for name, entry in entries.items():
            if not isinstance(entry, dict) or not entry:
                raise ScenarioFileError(f"{where}: expect.{section}.{name} must be a mapping")
            _no_unknown(entry, keys, f"{where}: expect.{section}.{name}")
    for key in ("order", "shared_device", "different_devices", "pods_share_domain"):
        if key in expect and not isinstance(expect[key], list):
            raise ScenarioFileError(f"{where}: expect.{key} must be a list")
    if "rejected" in expect and set(expect) != {"rejected"}:
        raise ScenarioFileError(f"{where}: a rejected scenario expects nothing else")


# ----------------------------------------------------------------- running one


@dataclass
class Outcome:
    """The report of one run, indexed for the checks."""

    report: dict[str, Any]
    node_labels: Mapping[str, Mapping[str, str]]
    #: `driver/pool/device` -> its attributes by qualified name (`<domain>/<name>`).
    device_attributes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    jobs: dict[str, dict[str, Any]] = field(init=False)
    bindings: dict[str, list[dict[str, Any]]] = field(init=False)

    def __post_init__(self) -> None:
        self.jobs = {f"{j['namespace']}/{j['name']}": j for j in self.report["jobs"]}
        self.bindings = {}
        for pod in self.report["pods"]:
            self.bindings.setdefault(f"{pod['namespace']}/{pod['name']}", []).append(pod)

    def job_bindings(self, job: str) -> list[dict[str, Any]]:
        return [p for p in self.report["pods"] if p["job"] == job]

    def last_binding(self, pod: str) -> dict[str, Any] | None:
        records = self.bindings.get(pod)
        return records[-1] if records else None


def with_backend(config: SchedulerConfig, backend: str) -> SchedulerConfig:
    """The scenario's config, with Ray forced (at any size) when `backend` is "ray"."""
    if backend == "local":
        return config
    if backend != "ray":
        raise ValueError(f"KAI_RAY_SCENARIO_BACKEND is local or ray, not {backend!r}")
    ray = config.spec.rayBackend.model_copy(update={"mode": "always"})
    spec = config.spec.model_copy(update={"rayBackend": ray})
    return config.model_copy(update={"spec": spec})


def simulate(scenario: Scenario, folder: Path, backend: str = BACKEND) -> Outcome:
    objects = folder / "objects.yaml"
    objects.write_text(yaml.safe_dump_all(scenario.objects, sort_keys=False))
    sim_input = load([objects])
    sim_input.config = with_backend(sim_input.config, backend)
    labels = {n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in sim_input.nodes}
    sim = Simulation(sim_input, until=parse_until(scenario.until))
    sim.run()
    # Labels the nodes' DRA devices give them (the NVLink domain), as the cycle saw them.
    for node, extra in sim.cache.dra_view().node_labels.items():
        labels[node] = {**labels.get(node, {}), **extra}
    return Outcome(build_report(sim), labels, device_attributes(sim_input.dra.resource_slices))


def device_attributes(slices: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every published device's attributes, by `driver/pool/device`; a bare attribute
    name is in the driver's domain, as in Kubernetes."""
    found: dict[str, dict[str, Any]] = {}
    for obj in slices:
        spec = obj["spec"]
        driver, pool = spec["driver"], spec["pool"]["name"]
        for device in spec.get("devices") or ():
            attributes = {
                (name if "/" in name else f"{driver}/{name}"): next(iter(value.values()))
                for name, value in (device.get("attributes") or {}).items()
            }
            found[f"{driver}/{pool}/{device['name']}"] = attributes
    return found


# ------------------------------------------------------------------- the checks


def matches(actual: float | None, expected: Any, tolerance: float = 1e-6) -> bool:
    """A number means exactly that (within `tolerance`); `[low, high]` an inclusive range."""
    if actual is None:
        return expected is None
    if expected is None:
        return False
    if isinstance(expected, list):
        low, high = expected
        return (low is None or actual >= low - tolerance) and (
            high is None or actual <= high + tolerance
        )
    return math.isclose(actual, float(expected), abs_tol=tolerance)


def reason_matches(reason: str | None, wanted: str | Sequence[str]) -> bool:
    """The reason contains the word, or any of the words when a list is given."""
    words = [wanted] if isinstance(wanted, str) else list(wanted)
    text = (reason or "").lower()
    return any(word.lower() in text for word in words)


def check_job(outcome: Outcome, key: str, want: Mapping[str, Any]) -> Iterator[str]:
    job = outcome.jobs.get(key)
    if job is None:
        yield f"job {key}: not in the report (jobs: {sorted(outcome.jobs)})"
        return
    started = job["started_s"] is not None
    if "started" in want and want["started"] != started:
        yield (
            f"job {key}: expected started={want['started']}, got started_s={job['started_s']} "
            f"(reason: {job['reason']!r})"
        )
    for timing in ("started_s", "finished_s"):
        if timing in want and not matches(job[timing], want[timing]):
            yield f"job {key}: expected {timing} {want[timing]}, got {job[timing]}"
    if "reason_contains" in want and not reason_matches(job["reason"], want["reason_contains"]):
        yield f"job {key}: reason {job['reason']!r} does not mention {want['reason_contains']!r}"
    for attribute in ("min_member", "queue"):
        if attribute in want and job[attribute] != want[attribute]:
            yield f"job {key}: expected {attribute} {want[attribute]!r}, got {job[attribute]!r}"
    yield from check_job_nodes(outcome, key, want)
    yield from check_evictions(outcome, key, want)
    yield from check_claim_devices(outcome, key, want)


def claim_devices(bindings: Sequence[Mapping[str, Any]]) -> set[str]:
    """The devices the claims of these bindings held when they were bound."""
    return {d for b in bindings for claim in b.get("claims") or () for d in claim["devices"]}


def check_claim_devices(outcome: Outcome, key: str, want: Mapping[str, Any]) -> Iterator[str]:
    """`claim_devices`: how many distinct DRA devices its pods' claims held (a claim the
    pods share counts once); `claim_devices_in`: `{attribute: value}` every such device
    carries; `claim_devices_share`: an attribute all of them carry with one value."""
    devices = claim_devices(outcome.job_bindings(key))
    where = f"job {key} (claim devices {sorted(devices)})"
    if "claim_devices" in want and not matches(len(devices), want["claim_devices"], 0):
        yield f"{where}: expected {want['claim_devices']} devices, got {len(devices)}"
    attributes = [outcome.device_attributes.get(d, {}) for d in sorted(devices)]
    for name, value in (want.get("claim_devices_in") or {}).items():
        values = {str(a.get(name)) for a in attributes}
        if not devices or values != {str(value)}:
            yield f"{where}: expected every device with {name}={value}, got {sorted(values)}"
    if "claim_devices_share" in want:
        name = want["claim_devices_share"]
        values = {str(a.get(name)) for a in attributes}
        if len(values) != 1 or values == {"None"}:
            yield f"{where}: expected one value of {name}, got {sorted(values)}"


def is_eviction(binding: Mapping[str, Any]) -> bool:
    reason = (binding.get("release_reason") or "").lower()
    return any(word in reason for word in EVICTION_WORDS)


def eviction_times(outcome: Outcome, job: str) -> list[float]:
    """The distinct times some pod of the job was evicted, in order."""
    return sorted({b["released_s"] for b in outcome.job_bindings(job) if is_eviction(b)})


def check_evictions(outcome: Outcome, key: str, want: Mapping[str, Any]) -> Iterator[str]:
    """`evicted`: a word of an eviction reason (or false: never evicted); `times_evicted`;
    `released_together`: every pod bound at an eviction went at that time;
    `running`: some pod is still bound at the end."""
    bindings = outcome.job_bindings(key)
    reasons = sorted({b["release_reason"] for b in bindings if is_eviction(b)})
    if "evicted" in want:
        wanted = want["evicted"]
        if wanted is False and reasons:
            yield f"job {key}: expected never evicted, got {reasons}"
        elif wanted is not False and not any(reason_matches(r, wanted) for r in reasons):
            yield f"job {key}: expected an eviction for {wanted!r}, got {reasons}"
    times = eviction_times(outcome, key)
    if "times_evicted" in want and not matches(len(times), want["times_evicted"], 0):
        yield f"job {key}: expected {want['times_evicted']} evictions, got them at {times}"
    if want.get("released_together"):
        yield from check_released_together(key, bindings, times)
    if "running" in want:
        running = any(b["released_s"] is None for b in bindings)
        if running != want["running"]:
            yield f"job {key}: expected running={want['running']} at the end, got {running}"


def check_released_together(
    key: str, bindings: Sequence[Mapping[str, Any]], times: Sequence[float]
) -> Iterator[str]:
    if not times:
        yield f"job {key}: expected a whole-gang eviction, but it was never evicted"
    for t in times:
        held = [b for b in bindings if b["bound_s"] < t and (b["released_s"] or math.inf) >= t]
        late = sorted(b["name"] for b in held if b["released_s"] != t)
        if late:
            yield f"job {key}: evicted at {t}s but {late} were not released with it"


def check_eviction_bound(outcome: Outcome, most: int) -> Iterator[str]:
    """No job is evicted more than `most` times (no evict/re-admit loop)."""
    for key in outcome.jobs:
        times = eviction_times(outcome, key)
        if len(times) > most:
            yield f"job {key}: evicted {len(times)} times (at most {most} expected): {times}"


def check_job_nodes(outcome: Outcome, key: str, want: Mapping[str, Any]) -> Iterator[str]:
    bindings = outcome.job_bindings(key)
    nodes = sorted({b["node"] for b in bindings})
    where = f"job {key} (pods on {nodes})"
    if "bound_pods" in want:
        count = len({b["name"] for b in bindings})
        if not matches(count, want["bound_pods"], 0):
            yield f"{where}: expected {want['bound_pods']} pods bound, got {count}"
    if "pods_on_nodes" in want and nodes != sorted(want["pods_on_nodes"]):
        yield f"{where}: expected its pods on exactly {sorted(want['pods_on_nodes'])}"
    if "nodes_among" in want and not set(nodes) <= set(want["nodes_among"]):
        yield f"{where}: expected only nodes among {want['nodes_among']}"
    if "avoids_nodes" in want and set(nodes) & set(want["avoids_nodes"]):
        yield f"{where}: expected none on {want['avoids_nodes']}"
    if "node_count" in want and not matches(len(nodes), want["node_count"], 0):
        yield f"{where}: expected {want['node_count']} distinct nodes, got {len(nodes)}"
    if "distinct_nodes" in want and want["distinct_nodes"] != (len(nodes) == len(bindings)):
        wanted = "one pod per node" if want["distinct_nodes"] else "some pods sharing a node"
        yield f"{where}: expected {wanted}, got {len(bindings)} pods on {len(nodes)} nodes"
    yield from check_domains(outcome, where, nodes, want)


def check_domains(
    outcome: Outcome, where: str, nodes: Sequence[str], want: Mapping[str, Any]
) -> Iterator[str]:
    if not nodes and {"same_domain", "in_domain", "domain_count"} & set(want):
        yield f"{where}: no pod was bound, so no domain can be checked"
        return
    if "same_domain" in want:
        values = domain_values(outcome, nodes, want["same_domain"])
        if len(values) != 1:
            yield f"{where}: expected one {want['same_domain']} domain, got {sorted(values)}"
    for label, value in (want.get("in_domain") or {}).items():
        values = domain_values(outcome, nodes, label)
        if values != {value}:
            yield f"{where}: expected all in {label}={value}, got {sorted(values)}"
    for label, count in (want.get("domain_count") or {}).items():
        values = domain_values(outcome, nodes, label)
        if not matches(len(values), count, 0):
            yield f"{where}: expected {count} {label} domains, got {sorted(values)}"


def domain_values(outcome: Outcome, nodes: Sequence[str], label: str) -> set[str]:
    return {str(outcome.node_labels.get(n, {}).get(label)) for n in nodes}


def check_pod(outcome: Outcome, key: str, want: Mapping[str, Any]) -> Iterator[str]:
    binding = outcome.last_binding(key)
    if "bound" in want and want["bound"] != (binding is not None):
        yield f"pod {key}: expected bound={want['bound']}, got {binding is not None}"
    if binding is None:
        if set(want) - {"bound"}:
            yield f"pod {key}: never bound, so {sorted(set(want) - {'bound'})} cannot hold"
        return
    if "node" in want and binding["node"] != want["node"]:
        yield f"pod {key}: expected node {want['node']}, got {binding['node']}"
    if "gpu_devices" in want and binding["gpu_devices"] != want["gpu_devices"]:
        yield f"pod {key}: expected GPU devices {want['gpu_devices']}, got {binding['gpu_devices']}"
    if "claim_devices" in want:
        count = len(claim_devices([binding]))
        if not matches(count, want["claim_devices"], 0):
            yield f"pod {key}: expected {want['claim_devices']} claim devices, got {count}"
    fraction = binding["requests"].get(GPU, 0.0)
    if "gpu_fraction" in want and not matches(fraction, want["gpu_fraction"]):
        yield f"pod {key}: expected a GPU fraction of {want['gpu_fraction']}, got {fraction}"


def check_device_pairs(outcome: Outcome, groups: list[list[str]], same: bool) -> Iterator[str]:
    """Pods that share one device (same node, same single device), or that must not."""
    for group in groups:
        places = {}
        for key in group:
            binding = outcome.last_binding(key)
            if binding is None:
                yield f"pods {group}: {key} was never bound"
                break
            places[key] = (binding["node"], tuple(binding["gpu_devices"]))
        else:
            distinct = len(set(places.values()))
            if same and distinct != 1:
                yield f"pods {group}: expected one shared device, got {places}"
            if not same and distinct != len(group):
                yield f"pods {group}: expected different devices, got {places}"


def check_shared_domains(outcome: Outcome, entries: list[dict[str, Any]]) -> Iterator[str]:
    for entry in entries:
        label, pods = entry["label"], entry["pods"]
        bound = [outcome.last_binding(p) for p in pods]
        if any(b is None for b in bound):
            yield f"pods {pods}: expected all bound in one {label} domain; some never were"
            continue
        values = domain_values(outcome, [b["node"] for b in bound if b], label)
        if len(values) != 1:
            yield f"pods {pods}: expected one {label} domain, got {sorted(values)}"


def check_order(outcome: Outcome, order: list[str]) -> Iterator[str]:
    """Each listed job started, strictly after the one before it."""
    times = [(key, (outcome.jobs.get(key) or {}).get("started_s")) for key in order]
    if any(t is None for _, t in times):
        yield f"order {order}: every job must start; start times {dict(times)}"
        return
    for (first, t1), (second, t2) in itertools.pairwise(times):
        if not t1 < t2:
            yield f"order: expected {first} (started {t1}) before {second} (started {t2})"


def queue_sample(outcome: Outcome, name: str, at_s: float | None) -> dict[str, Any] | None:
    queue = next((q for q in outcome.report["queues"] if q["name"] == name), None)
    if queue is None:
        return None
    samples = [s for s in queue["samples"] if at_s is None or s["t_s"] <= at_s]
    return samples[-1] if samples else None


def check_queue(outcome: Outcome, name: str, want: Mapping[str, Any]) -> Iterator[str]:
    sample = queue_sample(outcome, name, want.get("at_s"))
    when = "at the end" if want.get("at_s") is None else f"at {want['at_s']}s"
    if sample is None:
        yield f"queue {name}: no sample {when}"
        return
    tolerance = float(want.get("tolerance", QUEUE_TOLERANCE))
    for kind in QUEUE_AMOUNT_KEYS:
        for resource, expected in (want.get(kind) or {}).items():
            resource_name = GPU if resource == "gpu" else resource
            actual = sample[kind].get(resource_name, 0.0)
            if not matches(actual, expected, tolerance):
                yield f"queue {name}: expected {kind} {resource} {expected} {when}, got {actual}"


def check(outcome: Outcome, expect: Mapping[str, Any]) -> list[str]:
    problems: list[str] = []
    for key, want in (expect.get("jobs") or {}).items():
        problems += check_job(outcome, key, want)
    for key, want in (expect.get("pods") or {}).items():
        problems += check_pod(outcome, key, want)
    for name, want in (expect.get("queues") or {}).items():
        problems += check_queue(outcome, name, want)
    problems += check_order(outcome, expect["order"]) if "order" in expect else []
    problems += check_device_pairs(outcome, expect.get("shared_device") or [], same=True)
    problems += check_device_pairs(outcome, expect.get("different_devices") or [], same=False)
    problems += check_shared_domains(outcome, expect.get("pods_share_domain") or [])
    if "evictions_max" in expect:
        problems += check_eviction_bound(outcome, int(expect["evictions_max"]))
    return problems


def job_table(outcome: Outcome) -> str:
    lines = []
    for key, job in outcome.jobs.items():
        nodes = sorted({b["node"] for b in outcome.job_bindings(key)})
        lines.append(
            f"    {key}: started {job['started_s']}, finished {job['finished_s']}, "
            f"nodes {nodes}, reason {job['reason']!r}"
        )
    return "\n".join(lines)


# -------------------------------------------------------------------- the tests


def _params() -> list[Any]:
    rules = known_rules()
    params = []
    for path in scenario_files():
        try:
            scenario = read_scenario(path, rules)
        except (ScenarioFileError, yaml.YAMLError, InvalidObjectError) as err:
            params.append(pytest.param(path, id=f"malformed {path.relative_to(HERE)}: {err}"))
            continue
        params.append(pytest.param(scenario, id=scenario.name))
    return params


@pytest.mark.parametrize("scenario", _params())
def test_scenario(scenario: Scenario | Path, tmp_path: Path) -> None:
    if isinstance(scenario, Path):
        read_scenario(scenario, known_rules())  # raises the readable error
        pytest.fail(f"{scenario}: could not be read")
    rejected = scenario.expect.get("rejected")
    try:
        outcome = simulate(scenario, tmp_path)
    except InvalidObjectError as err:
        if rejected is not None and reason_matches(str(err), rejected):
            return
        pytest.fail(f"{scenario.label}: the simulator refused the input: {err}")
    if rejected is not None:
        pytest.fail(f"{scenario.label}: expected the input to be refused ({rejected!r})")
    problems = check(outcome, scenario.expect)
    if problems:
        listing = "\n  - ".join(problems)
        pytest.fail(
            f"{scenario.label} (rule {scenario.rule}):\n  - {listing}\n  jobs:\n"
            f"{job_table(outcome)}",
            pytrace=False,
        )


def test_there_are_enough_scenarios() -> None:
    assert len(scenario_files()) >= MIN_SCENARIOS


def test_every_scenario_file_is_well_formed_and_named_once() -> None:
    rules = known_rules()
    names: dict[str, Path] = {}
    for path in scenario_files():
        scenario = read_scenario(path, rules)
        assert scenario.name not in names, f"{path} and {names[scenario.name]} share a name"
        names[scenario.name] = path


def test_every_rule_has_a_scenario() -> None:
    rules = known_rules()
    covered = {read_scenario(p, rules).rule for p in scenario_files()}
    assert not set(rules) - covered, f"rules without a scenario: {sorted(set(rules) - covered)}"
