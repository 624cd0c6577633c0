"""The repository's layout holds: no Python under operator/, no stdlib-shadowing module names."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def python_files_under(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.py"))


def stdlib_shadows(package: Path) -> list[str]:
    names = sys.stdlib_module_names
    return sorted(
        str(path.relative_to(package))
        for path in package.rglob("*")
        if (path.suffix == ".py" and path.stem in names) or (path.is_dir() and path.name in names)
    )


def test_operator_folder_holds_no_python() -> None:
    assert python_files_under(ROOT / "operator") == []


def test_operator_folder_has_the_image_build_and_an_entrypoint_running_the_operator() -> None:
    # `kai-ray operator` runs kopf on kai_ray.controller (kai_ray/controller.py:main)
    entrypoint = (ROOT / "operator" / "entrypoint.sh").read_text()
    assert "kai-ray operator" in entrypoint
    for name in ("build-image.sh", "lock.sh", "requirements.lock", "debian.lock"):
        assert (ROOT / "operator" / name).is_file(), name


def test_no_module_of_the_package_is_named_after_a_standard_library_module() -> None:
    assert stdlib_shadows(ROOT / "kai_ray") == []


@pytest.mark.parametrize("name", ["queue.py", "types.py", "operator.py", "resource.py", "sched.py"])
def test_the_shadow_check_catches_stdlib_names(tmp_path: Path, name: str) -> None:
    (tmp_path / "fine_name.py").write_text("")
    (tmp_path / name).write_text("")
    assert stdlib_shadows(tmp_path) == [name]


def test_the_python_check_catches_a_python_file(tmp_path: Path) -> None:
    (tmp_path / "helper.py").write_text("")
    assert python_files_under(tmp_path) == [tmp_path / "helper.py"]


@pytest.mark.parametrize(
    "path",
    [
        "pyproject.toml",
        "kai_ray",
        "operator",
        "crds",
        "tests",
        "e2e",
        "helm",
        "docs",
        "CHANGELOG.md",
        "BREAKING_CHANGES.md",
        "README.md",
        ".ci/run",
        "Makefile",
    ],
)
def test_the_top_level_layout_exists(path: str) -> None:
    assert (ROOT / path).exists()


def test_changelog_has_an_unreleased_section() -> None:
    assert "## [Unreleased]" in (ROOT / "CHANGELOG.md").read_text()


def test_breaking_changes_has_the_release_template() -> None:
    text = (ROOT / "BREAKING_CHANGES.md").read_text()
    for heading in ("What changed", "Impact", "Upgrade", "Downgrade"):
        assert heading in text
