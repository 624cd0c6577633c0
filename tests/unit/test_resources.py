"""The resource vector and Kubernetes quantities."""

from __future__ import annotations

import pytest

from kai_ray.values.errors import InvalidFieldError
from kai_ray.values.resources import GPU, Resources, format_amount, parse_amount


@pytest.mark.parametrize(
    ("text", "amount"),
    [
        pytest.param("500m", 0.5, id="millicores"),
        pytest.param("64Gi", 64 * 2**30, id="binary suffix"),
        pytest.param("1G", 1e9, id="decimal suffix"),
        pytest.param(8, 8.0, id="plain integer"),
        pytest.param("0.5", 0.5, id="fraction of a GPU as a string"),
        pytest.param("1e3", 1000.0, id="exponent"),
    ],
)
def test_parse_amount(text: str | int, amount: float) -> None:
    assert parse_amount(text, "f") == amount


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param("-1", "negative", id="negative quantity"),
        pytest.param("lots", "not a Kubernetes quantity", id="not a quantity"),
        pytest.param(True, "expected a quantity", id="boolean"),
        pytest.param(None, "expected a quantity", id="null"),
        pytest.param(float("nan"), "finite", id="not a number"),
    ],
)
def test_parse_amount_refuses_with_the_field_named(value: object, message: str) -> None:
    with pytest.raises(InvalidFieldError) as err:
        parse_amount(value, "spec.resources.gpu.quota")
    assert err.value.field == "spec.resources.gpu.quota"
    assert message in err.value.message


def test_vector_arithmetic_and_aliases() -> None:
    a = Resources.parse({"cpu": "2", "memory": "1Gi", "nvidia.com/gpu": 1}, "requests")
    b = Resources({"gpu": 3, "example.com/fpga": 1})
    total = a + b
    assert total[GPU] == 4 and total["gpu"] == 4 and total["example.com/fpga"] == 1
    assert (total - b) == a
    assert a.fits_in(total) and not total.fits_in(a)
    assert total.insufficient(a) == ["example.com/fpga", GPU]
    assert a.scaled(2)["cpu"] == 4


def test_zero_amounts_are_dropped_so_equal_vectors_compare_equal() -> None:
    assert Resources({"cpu": 0, GPU: 1}) == Resources({GPU: 1})
    assert hash(Resources({"cpu": 0})) == hash(Resources())


def test_report_form_always_has_the_core_three() -> None:
    assert Resources({GPU: 0.5}).to_report() == {"cpu": 0.0, "memory": 0.0, GPU: 0.5}


def test_parse_names_the_resource_in_the_field() -> None:
    with pytest.raises(InvalidFieldError) as err:
        Resources.parse({"cpu": "x"}, "status.capacity")
    assert err.value.field == "status.capacity.cpu"


@pytest.mark.parametrize(
    ("name", "amount", "text"),
    [("memory", 64 * 2**30, "64Gi"), ("cpu", 0.25, "250m"), ("cpu", 4, "4"), (GPU, 0.5, "0.5")],
)
def test_format_amount(name: str, amount: float, text: str) -> None:
    assert format_amount(name, amount) == text


def test_a_vector_sent_to_another_process_hashes_as_that_process_does() -> None:
    """The hash is worked out once and kept; a string's hash differs from process to
    process, so a pickled vector (Ray ships them) must not carry it along."""
    import pickle
    import subprocess
    import sys

    vector = Resources({"cpu": 1, "nvidia.com/gpu": 2})
    hash(vector)  # kept now
    script = (
        "import pickle, sys\n"
        "from kai_ray.values.resources import Resources\n"
        "got = pickle.loads(sys.stdin.buffer.read())\n"
        "fresh = Resources({'cpu': 1, 'nvidia.com/gpu': 2})\n"
        "print({fresh: 'found'}.get(got, 'missing'))\n"
    )
    for seed in ("1", "2"):
        done = subprocess.run(
            [sys.executable, "-c", script],
            input=pickle.dumps(vector),
            capture_output=True,
            env={"PYTHONHASHSEED": seed, "PATH": ""},
            check=True,
        )
        assert done.stdout.decode().strip() == "found"
