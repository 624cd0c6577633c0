"""KubeRay's own KAI samples, read from the KubeRay module the e2e control plane pins.

`e2e/controlplane/kuberay/go.mod` names the KubeRay version; `go mod download`
finds (or fetches, through the Go module proxy) that module, whose
`config/samples/` hold `ray-cluster.kai-scheduler.yaml` and
`ray-cluster.kai-gpu-sharing.yaml`. They are read at test time, never copied
into this repository.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
WRAPPER = ROOT / "e2e" / "controlplane" / "kuberay"
MODULE = "github.com/ray-project/kuberay/ray-operator"
BASIC = "ray-cluster.kai-scheduler.yaml"
GPU_SHARING = "ray-cluster.kai-gpu-sharing.yaml"


def samples_folder() -> Path:
    """The samples folder of the pinned KubeRay module (downloaded if needed)."""
    version = re.search(rf"{re.escape(MODULE)} (v\S+)", (WRAPPER / "go.mod").read_text())
    assert version, f"{WRAPPER / 'go.mod'} does not require {MODULE}"
    found = subprocess.run(
        ["go", "mod", "download", "-json", f"{MODULE}@{version.group(1)}"],
        cwd=WRAPPER,
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(json.loads(found.stdout)["Dir"]) / "config" / "samples"


def sample_path(name: str) -> Path:
    return samples_folder() / name


def sample_documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(sample_path(name).read_text()) if d]
