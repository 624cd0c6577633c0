#!/usr/bin/env bash
# Build the kai-ray operator image without a container engine (`make image`).
#
# Two layers, each a plain tar packed into an OCI image layout by umoci:
#
#   1. base: a Debian bookworm root filesystem made by mmdebstrap (the
#      `essential` set, python3 and python3-venv, versions pinned by
#      operator/debian.lock where the mirror still serves them), a virtualenv
#      in /opt/kai-ray holding every Python package of operator/requirements.lock
#      (exact versions, sha256-checked, installed offline from downloaded
#      wheels), and the user kai-ray (uid and gid 65532);
#   2. app: the kai-ray wheel built from this checkout, installed into that
#      virtualenv without its dependencies, and operator/entrypoint.sh as
#      /usr/local/bin/kai-ray-operator.
#
# Reproducible: the same checkout, locks and SOURCE_DATE_EPOCH give the same
# image digest. Every timestamp (files, tar headers, image config, history)
# is SOURCE_DATE_EPOCH: by default the commit time of HEAD for the app layer,
# and the last commit time of the locks for the base. Byte code is compiled
# with hashes instead of timestamps (Python does so when SOURCE_DATE_EPOCH is
# set).
#
# Results are cached outside the clone, keyed by what goes into them, so that
# a second build of the same sources takes seconds:
#
#   ${KAI_RAY_IMAGE_CACHE:-$HOME/.cache/kai-ray-image}/
#     wheels/                 downloaded dependency wheels (shared)
#     base-<key>/rootfs.tar   layer 1, with packages.txt (its Debian packages)
#     image-<version>-<key>/  the OCI image layout, tagged <version>
#
# Usage: operator/build-image.sh             build (or reuse); print the layout
#        operator/build-image.sh --print-dir       the layout folder it would use
#        operator/build-image.sh --print-base-dir  the base folder it would use
# Needs: root (mmdebstrap and chroot), mmdebstrap and umoci from Debian's
# packages (installed with apt-get when missing), and the project's .venv.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
CACHE="${KAI_RAY_IMAGE_CACHE:-$HOME/.cache/kai-ray-image}"
PYTHON="${PYTHON:-$REPO/.venv/bin/python}"
SUITE=bookworm
MIRRORS=(
  "deb http://deb.debian.org/debian $SUITE main"
  "deb http://deb.debian.org/debian $SUITE-updates main"
  "deb http://deb.debian.org/debian-security $SUITE-security main"
)
# libstdc++6: numpy, pydantic-core and Ray's native modules link it
PACKAGES=python3,python3-venv,libstdc++6
VENV=/opt/kai-ray
USER_ID=65532
# Bump to rebuild the base when this recipe changes in a way the locks do not show.
BASE_RECIPE=2
# Commands in the image's root run with its own clean environment, not the host's.
IN_ROOT="env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 PIP_DISABLE_PIP_VERSION_CHECK=1"

log() { echo "build-image.sh: $*" >&2; }
die() { log "$*"; exit 1; }

version() { "$PYTHON" -c 'import tomllib,sys; print(tomllib.load(open(sys.argv[1],"rb"))["project"]["version"])' "$REPO/pyproject.toml"; }

commit_time() { # <paths...>: last commit time touching them (HEAD's when none)
  local t
  t="$(git -C "$REPO" log -1 --format=%ct -- "$@" 2>/dev/null || true)"
  [[ -n "$t" ]] || t="$(git -C "$REPO" log -1 --format=%ct 2>/dev/null || echo 1)"
  echo "$t"
}

BASE_EPOCH="${SOURCE_DATE_EPOCH:-$(commit_time operator/debian.lock operator/requirements.lock)}"
APP_EPOCH="${SOURCE_DATE_EPOCH:-$(commit_time)}"

base_key() {
  { echo "$BASE_RECIPE $SUITE $PACKAGES $BASE_EPOCH"; printf '%s\n' "${MIRRORS[@]}"
    cat "$HERE/requirements.lock" "$HERE/debian.lock" 2>/dev/null; } | sha256sum | cut -c1-16
}

# What goes into the wheel and the app layer: the package's files as they are
# in the work tree (committed or not), the project metadata, the entrypoint.
app_key() {
  { base_key; echo "$APP_EPOCH"
    cd "$REPO" && find kai_ray -type f \( -name '*.py' -o -name py.typed \) -print0 | sort -z \
      | xargs -0 sha256sum
    sha256sum pyproject.toml README.md operator/entrypoint.sh operator/build-image.sh; } \
    | sha256sum | cut -c1-16
}

base_dir() { echo "$CACHE/base-$(base_key)"; }
image_dir() { echo "$CACHE/image-$(version)-$(app_key)"; }

need_tools() {
  local missing=() tool
  for tool in mmdebstrap umoci; do command -v "$tool" >/dev/null || missing+=("$tool"); done
  (( ${#missing[@]} )) || return 0
  [[ $EUID == 0 ]] || die "needs ${missing[*]} (apt-get install ${missing[*]})"
  log "installing ${missing[*]} from Debian's packages"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null \
    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null; }
}

pins() { # operator/debian.lock as apt preferences: each package at its locked version
  [[ -f "$HERE/debian.lock" ]] || return 0
  awk '!/^#/ && NF == 2 {printf "Package: %s\nPin: version %s\nPin-Priority: 1001\n\n", $1, $2}' \
    "$HERE/debian.lock"
}

# A tar of a folder that depends only on its contents: sorted names, numeric
# owners, every time SOURCE_DATE_EPOCH, no atime/ctime headers.
det_tar() { # <folder> <epoch> <output> [paths...]
  local dir="$1" epoch="$2" out="$3"; shift 3
  (( $# )) || set -- .
  tar -C "$dir" --sort=name --numeric-owner --mtime="@$epoch" --clamp-mtime \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    --format=posix -cf "$out" "$@"
}

build_base() {
  local dir="$1" tmp="$1.tmp.$$" wheels="$CACHE/wheels"
  log "base layer: downloading wheels (operator/requirements.lock)"
  mkdir -p "$wheels"
  "$PYTHON" -m pip download --quiet --disable-pip-version-check --only-binary=:all: \
    --require-hashes -r "$HERE/requirements.lock" -d "$wheels"
  rm -rf "$tmp"; mkdir -p "$tmp"
  pins >"$tmp/pins"
  log "base layer: mmdebstrap $SUITE ($PACKAGES), SOURCE_DATE_EPOCH=$BASE_EPOCH"
  local hooks=(
    --setup-hook="cp '$tmp/pins' \"\$1/etc/apt/preferences.d/kai-ray-lock\""
    --customize-hook="mkdir -p \"\$1/tmp/wheels\" && cp '$wheels'/*.whl '$HERE/requirements.lock' \"\$1/tmp/wheels/\""
    --customize-hook="chroot \"\$1\" $IN_ROOT SOURCE_DATE_EPOCH=$BASE_EPOCH python3 -m venv $VENV"
    --customize-hook="chroot \"\$1\" $IN_ROOT SOURCE_DATE_EPOCH=$BASE_EPOCH $VENV/bin/pip install --quiet --no-index --find-links /tmp/wheels --require-hashes --only-binary=:all: -r /tmp/wheels/requirements.lock"
    # every native module of the virtualenv finds its shared libraries
    --customize-hook="! chroot \"\$1\" sh -c 'find $VENV -name \"*.so*\" -type f -exec ldd {} + 2>&1 | grep \"not found\"' >&2"
    --customize-hook="rm -rf \"\$1/tmp/wheels\" \"\$1/root/.cache\" \"\$1/etc/apt/preferences.d/kai-ray-lock\""
    # (no passwd package in the essential set: the account is written directly)
    --customize-hook="echo 'kai-ray:x:$USER_ID:' >>\"\$1/etc/group\""
    --customize-hook="echo 'kai-ray:x:$USER_ID:$USER_ID:kai-ray operator:/nonexistent:/usr/sbin/nologin' >>\"\$1/etc/passwd\""
    --customize-hook="chroot \"\$1\" dpkg-query -W -f '\${Package} \${Version}\n' | sort >'$tmp/packages.txt'"
    # the host's resolver and name, and logs with times, are not the image's
    --customize-hook="rm -f \"\$1/etc/resolv.conf\" \"\$1/etc/hostname\" \"\$1\"/var/log/*.log \"\$1\"/var/cache/ldconfig/aux-cache"
    --customize-hook="echo kai-ray >\"\$1/etc/hostname\""
  )
  SOURCE_DATE_EPOCH="$BASE_EPOCH" mmdebstrap --quiet --mode=root --variant=essential \
    --include="$PACKAGES" --aptopt='APT::Install-Recommends "false"' \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
    "${hooks[@]}" "$SUITE" "$tmp/rootfs" "${MIRRORS[@]}" >"$tmp/mmdebstrap.log" 2>&1 \
    || { tail -30 "$tmp/mmdebstrap.log" >&2; die "mmdebstrap failed (log: $tmp/mmdebstrap.log)"; }
  # device nodes are the runtime's business, not the image's
  find "$tmp/rootfs/dev" -mindepth 1 -delete
  det_tar "$tmp/rootfs" "$BASE_EPOCH" "$tmp/rootfs.tar"
  rm -rf "$tmp/rootfs"
  if [[ -f "$HERE/debian.lock" ]] && ! diff -q <(grep -v '^#' "$HERE/debian.lock") "$tmp/packages.txt" >/dev/null; then
    log "WARNING: the mirror no longer serves every version of operator/debian.lock;"
    log "         packages differ (run 'make image-lock' to record the new ones):"
    diff <(grep -v '^#' "$HERE/debian.lock") "$tmp/packages.txt" | grep '^[<>]' | head -20 >&2 || true
  fi
  rm -rf "$dir"; mv "$tmp" "$dir"
}

build_app_layer() { # <base dir> <work dir>: the wheel installed as a layer tar
  local base="$1" work="$2" root="$2/rootfs"
  log "app layer: building the kai-ray wheel"
  SOURCE_DATE_EPOCH="$APP_EPOCH" "$PYTHON" -m pip wheel --quiet --no-deps \
    --disable-pip-version-check -w "$work/wheel" "$REPO" >"$work/wheel.log" 2>&1 \
    || { tail -20 "$work/wheel.log" >&2; die "building the wheel failed"; }
  mkdir -p "$root"
  tar -C "$root" -xf "$base/rootfs.tar"
  mkdir -p "$root/tmp/app"
  local wheel
  wheel="$(cd "$work/wheel" && echo kai_ray-*.whl)"
  cp "$work/wheel/$wheel" "$root/tmp/app/"
  # --root: the files land under /tmp/app/stage, with the virtualenv's paths
  # and shebangs, and nothing of the base is touched
  # shellcheck disable=SC2086
  chroot "$root" $IN_ROOT SOURCE_DATE_EPOCH="$APP_EPOCH" \
    $VENV/bin/pip install --quiet --no-deps --no-index --no-warn-script-location --root /tmp/app/stage "/tmp/app/$wheel"
  local stage="$root/tmp/app/stage"
  install -D -m 0755 "$HERE/entrypoint.sh" "$stage/usr/local/bin/kai-ray-operator"
  # the parent folders as the base has them (mode and owner), so the layer changes only files
  find "$stage" -type d -exec chmod 0755 {} +
  det_tar "$stage" "$APP_EPOCH" "$work/app.tar" opt usr
}

iso() { date -u -d "@$1" +%Y-%m-%dT%H:%M:%SZ; }

pack() { # <base dir> <work dir> <layout>
  local base="$1" work="$2" layout="$3" tag ref
  tag="$(version)"; ref="$layout:$tag"
  umoci init --layout "$layout"
  umoci new --image "$ref"
  umoci raw add-layer --image "$ref" --history.created "$(iso "$BASE_EPOCH")" \
    --history.created_by "mmdebstrap $SUITE ($PACKAGES); $VENV from operator/requirements.lock" \
    "$base/rootfs.tar"
  umoci raw add-layer --image "$ref" --history.created "$(iso "$APP_EPOCH")" \
    --history.created_by "kai-ray $tag wheel; operator/entrypoint.sh" "$work/app.tar"
  local ports=() port
  for port in 8080 8081 9443; do ports+=(--config.exposedports "$port/tcp"); done
  umoci config --image "$ref" --created "$(iso "$APP_EPOCH")" \
    --history.created "$(iso "$APP_EPOCH")" --history.created_by "operator/build-image.sh" \
    --author "kai-ray" --os linux --architecture amd64 \
    --config.user "$USER_ID:$USER_ID" --config.workingdir / \
    --config.entrypoint /usr/local/bin/kai-ray-operator \
    --config.env "PATH=$VENV/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    --config.env PYTHONUNBUFFERED=1 --config.env PYTHONDONTWRITEBYTECODE=1 \
    "${ports[@]}" \
    --config.label "org.opencontainers.image.title=kai-ray" \
    --config.label "org.opencontainers.image.version=$tag" \
    --manifest.annotation "org.opencontainers.image.version=$tag"
  umoci gc --layout "$layout"
}

prune() { # keep the newest two bases and three images (each some hundred MB)
  local old
  # shellcheck disable=SC2012
  for old in $(ls -td "$CACHE"/base-* 2>/dev/null | tail -n +3) \
             $(ls -td "$CACHE"/image-* 2>/dev/null | tail -n +4); do
    rm -rf "$old"
  done
}

main() {
  case "${1:-}" in
    --print-dir) image_dir; exit 0 ;;
    --print-base-dir) base_dir; exit 0 ;;
    "") ;;
    *) echo "usage: $0 [--print-dir|--print-base-dir]" >&2; exit 2 ;;
  esac
  [[ $EUID == 0 ]] || die "must run as root (mmdebstrap --mode=root and chroot)"
  need_tools
  mkdir -p "$CACHE"
  exec 9>"$CACHE/.build.lock"
  flock 9
  local start=$SECONDS base image
  base="$(base_dir)"; image="$(image_dir)"
  if [[ -f "$image/oci/index.json" ]]; then
    log "cached: $image/oci"
    echo "$image/oci"
    return 0
  fi
  if [[ -f "$base/rootfs.tar" ]]; then
    log "base layer cached in $base"
  else
    build_base "$base"
    log "base layer built in $((SECONDS - start))s"
  fi
  local work="$image.tmp.$$"
  rm -rf "$work"; mkdir -p "$work"
  build_app_layer "$base" "$work"
  pack "$base" "$work" "$work/oci"
  mkdir -p "$image"; rm -rf "$image/oci"; mv "$work/oci" "$image/oci"
  rm -rf "$work"
  prune
  log "image $(version) built in $((SECONDS - start))s: $image/oci"
  echo "$image/oci"
}

main "$@"
