"""CEL device selectors: what a device matches, errors as values, one compile each."""

from __future__ import annotations

import pytest

from kai_ray.values.device_cel import (
    DeviceView,
    SelectorError,
    compile_selector,
    selector_problems,
)
from kai_ray.values.dra import ResourceClaimTemplate
from tests.unit.dra_builders import cel, device_class

H100 = DeviceView(
    driver="gpu.example.com",
    attributes={
        "gpu.example.com/productName": ("string", "H100"),
        "gpu.example.com/index": ("int", 3),
        "gpu.example.com/driverVersion": ("version", "550.54.15"),
        "gpu.example.com/mig": ("bool", False),
        "topology.example.com/numa": ("int", 1),
    },
    capacity={"gpu.example.com/memory": 80.0 * 2**30},
    domains=frozenset({"gpu.example.com", "topology.example.com", "nic.example.com"}),
)


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        pytest.param(
            'device.attributes["gpu.example.com"].productName == "H100"', True, id="product"
        ),
        pytest.param(
            'device.attributes["gpu.example.com"].productName == "A100"', False, id="other product"
        ),
        pytest.param('device.driver == "gpu.example.com"', True, id="driver"),
        pytest.param(
            'device.capacity["gpu.example.com"].memory.compareTo(quantity("40Gi")) >= 0',
            True,
            id="memory at least 40Gi",
        ),
        pytest.param(
            'device.capacity["gpu.example.com"].memory.isGreaterThan(quantity("80Gi"))',
            False,
            id="memory not above its own size",
        ),
        pytest.param(
            'device.capacity["gpu.example.com"].memory == quantity("81920Mi")',
            True,
            id="equal quantities in other units",
        ),
        pytest.param(
            'device.attributes["gpu.example.com"].driverVersion.isGreaterThan(semver("550.9.0"))',
            True,
            id="versions compare as versions, not text",
        ),
        pytest.param(
            'device.attributes["gpu.example.com"].driverVersion.major() == 550',
            True,
            id="a version's major",
        ),
        pytest.param(
            'device.attributes["gpu.example.com"].index in [1, 3]', True, id="int in list"
        ),
        pytest.param(
            'device.attributes["topology.example.com"].numa == 1', True, id="other domain"
        ),
        pytest.param('!device.attributes["gpu.example.com"].mig', True, id="bool"),
        pytest.param(
            '"model" in device.attributes["nic.example.com"]',
            False,
            id="a known domain the device lacks is an empty map",
        ),
        pytest.param(
            'device.driver == "nic.example.com"'
            ' && device.attributes["nic.example.com"].model == "x"',
            False,
            id="a guard keeps a missing attribute from being read",
        ),
    ],
)
def test_selector_matches(expression: str, expected: bool) -> None:
    assert H100.matches(compile_selector(expression)) is expected


@pytest.mark.parametrize(
    ("expression", "words"),
    [
        pytest.param('device.attributes["gpu.example.com"', "Syntax error", id="unclosed bracket"),
        pytest.param(
            'device.attributes["gpu.example.com"].missing == 1', "missing", id="missing attribute"
        ),
        pytest.param(
            'device.attributes["gpu.example.com"].index', "not true or false", id="not a boolean"
        ),
        pytest.param(
            'quantity("lots").isGreaterThan(quantity("1"))',
            "not a Kubernetes quantity",
            id="bad quantity",
        ),
        pytest.param(
            'device.attributes["gpu.example.com"].index.isLessThan(semver("1.0.0"))',
            "expected a quantity",
            id="int against version",
        ),
    ],
)
def test_selector_errors_are_values_naming_the_cause(expression: str, words: str) -> None:
    with pytest.raises(SelectorError) as caught:
        H100.matches(compile_selector(expression))
    assert words in caught.value.message


def test_each_expression_is_compiled_once_broken_ones_too() -> None:
    expression = 'device.attributes["gpu.example.com"].index == 41'
    broken = "device.attributes[ == 41"
    first, bad = compile_selector(expression), compile_selector(broken)
    before = compile_selector.cache_info().hits
    assert compile_selector(expression) is first and compile_selector(broken) is bad
    assert compile_selector.cache_info().hits == before + 2
    assert first.program is not None and bad.program is None and bad.error


def test_malformed_selectors_are_problems_naming_object_and_field() -> None:
    template = ResourceClaimTemplate.model_validate(
        {
            "metadata": {"name": "t", "namespace": "team-a"},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "gpu",
                                "firstAvailable": [
                                    {
                                        "name": "ok",
                                        "deviceClassName": "c",
                                        "selectors": cel("true"),
                                    },
                                    {
                                        "name": "bad",
                                        "deviceClassName": "c",
                                        "selectors": cel("true", "device.driver =="),
                                    },
                                ],
                            }
                        ]
                    }
                }
            },
        }
    )
    (problem,) = selector_problems(template)
    assert str(problem).startswith(
        "ResourceClaimTemplate team-a/t: "
        "spec.spec.devices.requests[0].firstAvailable[1].selectors[1].cel.expression: "
    )
    assert selector_problems(device_class("c", "device.driver == 'x'")) == []
    (bad_class,) = selector_problems(device_class("c", "device.driver == 'x'", "(("))
    assert bad_class.field == "spec.selectors[1].cel.expression"
