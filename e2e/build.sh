#!/usr/bin/env bash
# Build the binaries of the e2e control plane from Go modules.
#
# Each component has a small wrapper module under e2e/controlplane/<component>/
# (go.mod + go.sum, no third-party source). Binaries go into a cache folder
# outside the repository, keyed by component and version, so that every clone
# on this machine shares them:
#
#   ${KAI_RAY_E2E_CACHE:-$HOME/.cache/kai-ray-e2e}/<component>-<version>/
#
# A component whose folder already holds a build stamp matching its wrapper's
# go.mod, go.sum and build flags is skipped, so a warm run takes seconds.
# The Go build cache and module cache stay at their default locations.
#
# Usage: e2e/build.sh [component...]   (default: all)
#        e2e/build.sh --print-dir <component>   prints the binary folder
# Components: kubernetes etcd kwok helm kuberay
# Exit status: 0 when every requested component is present, 1 otherwise
# (a failing component does not stop the others; see the log it names).
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
WRAPPERS="$HERE/controlplane"
CACHE="${KAI_RAY_E2E_CACHE:-$HOME/.cache/kai-ray-e2e}"
LOGS="$CACHE/logs"
ALL=(kubernetes etcd kwok helm kuberay)

# module path of the program each wrapper builds, and the binaries it yields
declare -A MODULE=(
  [kubernetes]=k8s.io/kubernetes
  [etcd]=go.etcd.io/etcd/server/v3
  [kwok]=sigs.k8s.io/kwok
  [helm]=helm.sh/helm/v4
  [kuberay]=github.com/ray-project/kuberay/ray-operator
)
declare -A PACKAGES=(
  [kubernetes]="k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl"
  [etcd]="go.etcd.io/etcd/server/v3"
  [kwok]="sigs.k8s.io/kwok/cmd/kwok"
  [helm]="helm.sh/helm/v4/cmd/helm"
  [kuberay]="github.com/ray-project/kuberay/ray-operator"
)
declare -A BINARIES=(
  [kubernetes]="kube-apiserver kube-controller-manager kube-scheduler kubectl"
  [etcd]="etcd"
  [kwok]="kwok"
  [helm]="helm"
  [kuberay]="ray-operator"
)

# version of a component = the version its wrapper's go.mod requires
version_of() {
  local c="$1"
  awk -v m="${MODULE[$c]}" '$1 == m {print $2; exit} $1 == "require" && $2 == m {print $3; exit}' \
    "$WRAPPERS/$c/go.mod"
}

ldflags_of() {
  local c="$1" v="$2"
  case "$c" in
    kubernetes)
      # Stamp the real release into /version; unstamped builds report
      # v0.0.0-master with empty major/minor, which helm and clients misread.
      local minor major b
      major="${v#v}"; major="${major%%.*}"
      minor="${v#v*.}"; minor="${minor%%.*}"
      local out="-s -w"
      for b in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        out+=" -X $b.gitVersion=$v -X $b.gitMajor=$major -X $b.gitMinor=$minor"
        out+=" -X $b.gitTreeState=clean -X $b.buildDate=1970-01-01T00:00:00Z"
      done
      echo "$out" ;;
    kwok) echo "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${v#v}" ;;
    helm) echo "-s -w -X helm.sh/helm/v4/internal/version.version=$v -X helm.sh/helm/v4/internal/version.gitTreeState=clean" ;;
    *) echo "-s -w" ;;
  esac
}

dir_of() { echo "$CACHE/$1-$(version_of "$1")"; }

stamp_of() {
  local c="$1" v="$2"
  { cat "$WRAPPERS/$c/go.mod" "$WRAPPERS/$c/go.sum"; ldflags_of "$c" "$v"; go env GOVERSION; } \
    | sha256sum | cut -d' ' -f1
}

build_one() {
  local c="$1" v dir stamp log tmp start
  v="$(version_of "$c")"
  if [[ -z "$v" ]]; then echo "build.sh: cannot read the version of $c" >&2; return 1; fi
  dir="$CACHE/$c-$v"
  stamp="$(stamp_of "$c" "$v")"
  if [[ -f "$dir/.stamp" && "$(cat "$dir/.stamp")" == "$stamp" ]]; then
    local ok=1 b
    for b in ${BINARIES[$c]}; do [[ -x "$dir/$b" ]] || ok=0; done
    if (( ok )); then echo "$c $v: cached in $dir"; return 0; fi
  fi
  log="$LOGS/$c-$v.log"
  tmp="$dir.tmp.$$"
  rm -rf "$tmp"; mkdir -p "$tmp"
  echo "$c $v: building into $dir (log: $log)"
  start=$SECONDS
  # shellcheck disable=SC2086
  if (cd "$WRAPPERS/$c" && nice -n 10 go build -trimpath -buildvcs=false \
        -ldflags "$(ldflags_of "$c" "$v")" -o "$tmp/" ${PACKAGES[$c]}) >"$log" 2>&1; then
    # etcd's main package is its module root (.../server/v3): go names the
    # binary "server"; call it etcd
    if [[ "$c" == etcd && -x "$tmp/server" ]]; then mv "$tmp/server" "$tmp/etcd"; fi
    local b
    for b in ${BINARIES[$c]}; do
      if [[ ! -x "$tmp/$b" ]]; then
        echo "$c $v: build produced no $b" | tee -a "$log" >&2; rm -rf "$tmp"; return 1
      fi
    done
    echo "$stamp" >"$tmp/.stamp"
    rm -rf "$dir"; mv "$tmp" "$dir"
    echo "$c $v: built in $((SECONDS - start))s"
  else
    rm -rf "$tmp"
    echo "$c $v: BUILD FAILED after $((SECONDS - start))s; last lines of $log:" >&2
    tail -n 20 "$log" >&2
    return 1
  fi
}

main() {
  if ! command -v go >/dev/null; then echo "build.sh: the Go toolchain is required" >&2; exit 1; fi
  if [[ "${1:-}" == "--print-dir" ]]; then dir_of "$2"; exit 0; fi
  local comps=("$@"); (( ${#comps[@]} )) || comps=("${ALL[@]}")
  mkdir -p "$CACHE" "$LOGS"
  # one build at a time per cache (CI, a test fixture and a person may race)
  exec 9>"$CACHE/.build.lock"
  flock 9
  local failed=() c
  for c in "${comps[@]}"; do
    [[ -n "${MODULE[$c]:-}" ]] || { echo "build.sh: unknown component $c" >&2; failed+=("$c"); continue; }
    build_one "$c" || failed+=("$c")
  done
  if (( ${#failed[@]} )); then
    echo "build.sh: failed: ${failed[*]}" >&2
    exit 1
  fi
}

main "$@"
