"""The webhook's certificate folder is the operator's own, and its key is private."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kai_ray.effects.certificates import ensure_certificate


def test_the_key_is_written_readable_by_its_owner_only(tmp_path: Path) -> None:
    folder = tmp_path / "certs"
    files = ensure_certificate(folder, "127.0.0.1")
    assert files.key_file.stat().st_mode & 0o777 == 0o600
    assert folder.stat().st_mode & 0o777 == 0o700
    assert ensure_certificate(folder, "127.0.0.1") == files  # kept while still good


def test_a_folder_others_may_write_to_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "shared"
    folder.mkdir()
    os.chmod(folder, 0o777)
    with pytest.raises(PermissionError, match="not private"):
        ensure_certificate(folder, "127.0.0.1")
    assert not (folder / "tls.key").exists()


@pytest.mark.skipif(os.getuid() != 0, reason="handing a folder to another user needs root")
def test_a_folder_another_user_owns_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o700)
    os.chown(folder, 65534, 65534)
    with pytest.raises(PermissionError, match="owner uid 65534"):
        ensure_certificate(folder, "127.0.0.1")
