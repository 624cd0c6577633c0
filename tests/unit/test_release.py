"""One version for the package, the chart and the image, and release notes for it
(docs/lts.md); packaging metadata that setuptools reads without a deprecation."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

import kai_ray

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]
CHART = yaml.safe_load((ROOT / "helm" / "kai-ray" / "Chart.yaml").read_text())


def semver(version: str) -> str:
    """The chart's spelling of a PEP 440 version: 0.3.0rc1 -> 0.3.0-rc1."""
    return re.sub(
        r"(\d)(a|b|rc|\.dev)(\d+)$", lambda m: f"{m[1]}-{m[2].lstrip('.')}{m[3]}", version
    )


def test_package_chart_and_image_tag_are_one_version() -> None:
    assert kai_ray.__version__ == VERSION
    assert CHART["appVersion"] == VERSION, "the image tag make image gives"
    assert CHART["version"] == semver(VERSION)
    assert semver("0.3.0rc1") == "0.3.0-rc1" and semver("0.2.0") == "0.2.0"


def test_the_version_has_release_notes() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert re.search(rf"^## \[{re.escape(VERSION)}\] - \d{{4}}-\d{{2}}-\d{{2}}$", changelog, re.M)
    breaking = (ROOT / "BREAKING_CHANGES.md").read_text()
    assert re.search(rf"^## v{re.escape(VERSION)}$", breaking, re.M)


def test_license_is_an_spdx_expression_setuptools_reads_without_warning() -> None:
    # A `license = {text = ...}` table makes setuptools >= 77 warn on every build;
    # an SPDX string needs setuptools >= 77 (PEP 639).
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    (setuptools,) = [r for r in PYPROJECT["build-system"]["requires"] if r.startswith("setuptools")]
    minimum = re.fullmatch(r"setuptools>=(\d+)(?:\.\d+)*", setuptools)
    assert minimum and int(minimum[1]) >= 77
    assert not any(c.startswith("License ::") for c in PYPROJECT["project"].get("classifiers", []))
