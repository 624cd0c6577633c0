"""The CSV trace reader: every row becomes a Job the loader takes, or a refusal naming
the line and the column."""

from __future__ import annotations

from pathlib import Path

import pytest

from kai_ray.sim.job_trace import trace_documents
from kai_ray.sim.loader import Document, Workload, load_documents
from kai_ray.state.pod_states import PodState, read_pod
from kai_ray.values.errors import InvalidObjectError, Problem
from kai_ray.values.resources import GPU, GPU_PRODUCT_LABEL
from tests.builders import make_queue

HEADER = "submit,duration,queue,pods,gpus_per_pod,gpu_fraction"


def loaded(tmp_path: Path, header: str, row: str) -> Workload:
    """The one workload of a one-row trace, through the simulator's loader."""
    trace = tmp_path / "jobs.csv"
    trace.write_text(f"{header}\n{row}\n")
    queue = Document(make_queue("team-a").build(), "queues.yaml")
    sim = load_documents([queue, *trace_documents(trace)])
    (workload,) = sim.workloads
    return workload


def first_pod(workload: Workload) -> PodState:
    problems: list[Problem] = []
    pod = read_pod(workload.pods[0][0], problems)
    assert pod is not None, problems
    return pod


def refusal(tmp_path: Path, header: str, row: str) -> str:
    with pytest.raises(InvalidObjectError) as err:
        loaded(tmp_path, header, row)
    return str(err.value)


@pytest.mark.parametrize(
    ("submit", "duration", "seconds"),
    [
        pytest.param("1000000", "2500000", (1e6, 2.5e6), id="a million seconds and more"),
        pytest.param("1e+06", "3.5e7", (1e6, 3.5e7), id="in exponent form"),
        pytest.param("12345678.25", "0.5", (12345678.25, 0.5), id="with fractions of a second"),
        pytest.param("300h", "1h30m", (1_080_000.0, 5400.0), id="as durations"),
    ],
)
def test_times_of_any_size_are_read(
    tmp_path: Path, submit: str, duration: str, seconds: tuple[float, float]
) -> None:
    workload = loaded(tmp_path, HEADER, f"{submit},{duration},team-a,1,1,")
    assert (workload.submit_at, workload.duration) == pytest.approx(seconds)


def test_a_bad_time_names_the_csv_column_not_an_annotation(tmp_path: Path) -> None:
    message = refusal(tmp_path, HEADER, "0,1e999,team-a,1,1,")
    assert "line 2, column duration" in message
    assert "annotations" not in message


def test_one_gpu_with_a_fraction_is_a_share_of_one_gpu(tmp_path: Path) -> None:
    pod = first_pod(loaded(tmp_path, HEADER, "0,1h,team-a,1,1,0.25"))
    assert pod.gpu_share is not None and pod.gpu_share.fraction == 0.25
    assert pod.requests[GPU] == 0


def test_several_gpus_with_a_fraction_are_refused_naming_the_column(tmp_path: Path) -> None:
    message = refusal(tmp_path, HEADER, "0,1h,team-a,1,4,0.5")
    assert "line 2, column gpu_fraction" in message
    assert "gpus_per_pod 4" in message


def test_a_fraction_of_one_fills_a_device(tmp_path: Path) -> None:
    pod = first_pod(loaded(tmp_path, HEADER, "0,1h,team-a,1,0,1"))
    assert pod.gpu_share is not None and pod.gpu_share.fraction == 1.0


@pytest.mark.parametrize("fraction", ["0", "1.01", "-0.5", "half"])
def test_a_fraction_outside_zero_to_one_is_refused(tmp_path: Path, fraction: str) -> None:
    assert "column gpu_fraction" in refusal(tmp_path, HEADER, f"0,1h,team-a,1,0,{fraction}")


PLACEMENT_HEADER = HEADER + ",node_selector,gpu_model,priority"


def test_node_selector_gpu_model_and_priority_reach_the_pods(tmp_path: Path) -> None:
    row = "0,1h,team-a,2,1,,pool=a;zone=z1,V100M32|V100M16,250"
    pod = first_pod(loaded(tmp_path, PLACEMENT_HEADER, row))
    assert pod.node_selector == (("pool", "a"), ("zone", "z1"))
    (term,) = pod.node_affinity
    (requirement,) = term
    assert requirement.key == GPU_PRODUCT_LABEL and requirement.operator == "In"
    assert tuple(requirement.values) == ("V100M16", "V100M32")
    assert pod.priority == 250


def test_a_priority_class_name_goes_to_the_group(tmp_path: Path) -> None:
    workload = loaded(tmp_path, PLACEMENT_HEADER, "0,1h,team-a,1,1,,,,inference")
    (group,) = workload.groups
    assert group.pod_group.spec.priorityClassName == "inference"


def test_empty_placement_columns_constrain_nothing(tmp_path: Path) -> None:
    pod = first_pod(loaded(tmp_path, PLACEMENT_HEADER, "0,1h,team-a,1,1,,,,"))
    assert (pod.node_selector, pod.node_affinity, pod.priority) == ((), (), 0)


@pytest.mark.parametrize(
    ("cells", "column"),
    [
        pytest.param("pool,,", "node_selector", id="a selector without ="),
        pytest.param(",T4||A10,", "gpu_model", id="an empty GPU model"),
        pytest.param(",,High Priority", "priority", id="a priority that is no name"),
    ],
)
def test_bad_placement_cells_are_refused_naming_the_column(
    tmp_path: Path, cells: str, column: str
) -> None:
    message = refusal(tmp_path, PLACEMENT_HEADER, f"0,1h,team-a,1,1,,{cells}")
    assert f"line 2, column {column}" in message
