#!/usr/bin/env bash
# Regenerate the operator image's locks (`make image-lock`):
#
#   operator/requirements.lock  every Python package the kai-ray wheel needs,
#                               exact version and sha256, as pip resolves them
#                               for CPython 3.11 on linux x86_64 (the image's);
#   operator/debian.lock        every Debian package of the image's root
#                               filesystem with its exact version, read from
#                               the newest base layer built (run
#                               operator/build-image.sh first).
#
# Usage: operator/lock.sh python|debian|all
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
PIP="${PIP:-$REPO/.venv/bin/pip}"

lock_python() {
  local report
  report="$(mktemp)"
  # --ignore-installed: resolve as a fresh environment would, not as the venv is.
  # Resolved for this machine (CPython 3.11, glibc 2.36, x86_64), which is what
  # the image has: Debian bookworm's python3.
  "$PIP" install --quiet --dry-run --ignore-installed --only-binary=:all: \
    --report "$report" "$REPO" >/dev/null 2>&1
  python3 - "$report" >"$HERE/requirements.lock" <<'EOF'
import json, sys
report = json.load(open(sys.argv[1]))
print("# The operator image's Python packages: `make image-lock` rewrites this file.")
for item in sorted(report["install"], key=lambda i: i["metadata"]["name"].lower()):
    name, version = item["metadata"]["name"], item["metadata"]["version"]
    if name == "kai-ray":
        continue
    digest = item["download_info"]["archive_info"]["hashes"]["sha256"]
    print(f"{name}=={version} --hash=sha256:{digest}")
EOF
  rm -f "$report"
  echo "wrote $HERE/requirements.lock"
}

lock_debian() {
  local manifest cache="${KAI_RAY_IMAGE_CACHE:-$HOME/.cache/kai-ray-image}"
  # the newest base layer built: its list of packages as installed
  manifest="$(ls -t "$cache"/base-*/packages.txt 2>/dev/null | head -1)"
  [[ -n "$manifest" ]] || { echo "lock.sh: no base layer in $cache: run operator/build-image.sh first" >&2; exit 1; }
  { echo "# The operator image's Debian packages: \`make image-lock\` rewrites this file."
    cat "$manifest"; } >"$HERE/debian.lock"
  echo "wrote $HERE/debian.lock"
}

case "${1:-all}" in
  python) lock_python ;;
  debian) lock_debian ;;
  all) lock_python; lock_debian ;;
  *) echo "usage: $0 python|debian|all" >&2; exit 2 ;;
esac
