#!/usr/bin/env bash
# A real Kubernetes control plane on 127.0.0.1 for the e2e tests, run as plain
# processes from the binaries that e2e/build.sh builds:
#
#   etcd (data on tmpfs) -> kube-apiserver (token auth, RBAC, SA signing keys)
#   -> kube-controller-manager (no node lifecycle) -> kwok (fake nodes, pod
#   lifecycles from kwok's stock stages) -> KubeRay operator (CRDs from the
#   Go module cache); kube-scheduler only when KAI_RAY_E2E_KUBE_SCHEDULER=1.
#
# Usage: e2e/cluster.sh up|down|env|status|restart-apiserver
#   restart-apiserver: stop kube-apiserver and start it again with the same flags
#   (a fault the soak injects; the other components reconnect by themselves)
#
# Environment (all optional):
#   KAI_RAY_E2E_CACHE      binary cache (default ~/.cache/kai-ray-e2e)
#   KAI_RAY_E2E_RUN        run folder: kubeconfigs, pki, logs, pids (default /tmp/kai-ray-e2e)
#   KAI_RAY_E2E_ETCD_DATA  etcd data folder (default /dev/shm/kai-ray-e2e-etcd)
#   KAI_RAY_E2E_PORT_BASE  first of the ports used (default 26400): +0 apiserver,
#                          +1 etcd client, +2 etcd peer, +3 controller-manager,
#                          +4 kube-scheduler, +5 kwok, +6/+7 KubeRay metrics/health
#   KAI_RAY_E2E_KUBE_SCHEDULER=1  also run kube-scheduler (default: off; kai-ray
#                          is the scheduler under test)
#   KAI_RAY_E2E_KUBE_SCHEDULER_QPS=N  kube-scheduler's client QPS and burst (default:
#                          its own, 50/100; benchmarks lift it to run it at its best)
#   KAI_RAY_E2E_KUBERAY=0  do not run the KubeRay operator
#   KAI_RAY_E2E_AUDIT=1    the API server writes an audit log of pods/binding and
#                          pods/eviction creates to $RUN/logs/audit.log (read at
#                          each start of the API server, restart-apiserver included)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${KAI_RAY_E2E_CACHE:-$HOME/.cache/kai-ray-e2e}"
RUN="${KAI_RAY_E2E_RUN:-/tmp/kai-ray-e2e}"
ETCD_DATA="${KAI_RAY_E2E_ETCD_DATA:-/dev/shm/kai-ray-e2e-etcd}"
BASE="${KAI_RAY_E2E_PORT_BASE:-26400}"
API_PORT=$((BASE + 0))
ETCD_PORT=$((BASE + 1))
ETCD_PEER_PORT=$((BASE + 2))
KCM_PORT=$((BASE + 3))
SCHED_PORT=$((BASE + 4))
KWOK_PORT=$((BASE + 5))
RAY_METRICS_PORT=$((BASE + 6))
RAY_HEALTH_PORT=$((BASE + 7))
WITH_SCHEDULER="${KAI_RAY_E2E_KUBE_SCHEDULER:-0}"
WITH_KUBERAY="${KAI_RAY_E2E_KUBERAY:-1}"
WITH_AUDIT="${KAI_RAY_E2E_AUDIT:-0}"

PKI="$RUN/pki"
LOGS="$RUN/logs"
PIDS="$RUN/pids"
KUBECONFIG_ADMIN="$RUN/kubeconfig"
KUBECONFIG_USER="$RUN/user.kubeconfig"
API="https://127.0.0.1:$API_PORT"
# start order; down goes in reverse
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok ray-operator)

log() { echo "cluster.sh: $*" >&2; }
die() { log "$*"; exit 1; }

bindir() { "$HERE/build.sh" --print-dir "$1"; }

gomod_dir() { # <wrapper> <module>: the module's folder in the Go module cache
  (cd "$HERE/controlplane/$1" && go mod download "$2" && go list -m -f '{{.Dir}}' "$2")
}

alive() { # <name>: its recorded process group still has a live leader
  local f="$PIDS/$1.pid"
  [[ -f "$f" ]] && kill -0 "$(cat "$f")" 2>/dev/null
}

start() { # <name> <binary> args...: run in its own session (process group)
  local name="$1"; shift
  [[ -x "$1" ]] || die "missing binary $1: run e2e/build.sh"
  setsid "$@" >"$LOGS/$name.log" 2>&1 </dev/null &
  echo $! >"$PIDS/$name.pid"
}

wait_for() { # <what> <seconds> <command...>
  local what="$1" secs="$2"; shift 2
  local end=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if (( SECONDS >= end )); then
      log "timed out after ${secs}s waiting for $what"
      return 1
    fi
    sleep 0.3
  done
}

group_alive() { kill -0 -- "-$1" 2>/dev/null || kill -0 "$1" 2>/dev/null; }

stop_all() { # <name>...: TERM their process groups at once, then KILL what is left
  local name pid pids=() i left
  for name in "$@"; do
    [[ -f "$PIDS/$name.pid" ]] || continue
    pid="$(cat "$PIDS/$name.pid")"
    pids+=("$pid")
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  done
  for i in $(seq 1 100); do # up to 10 s of graceful shutdown
    left=0
    for pid in "${pids[@]}"; do group_alive "$pid" && left=1; done
    (( left )) || break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do
    if group_alive "$pid"; then
      log "process group $pid did not stop on TERM; killing it"
      kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    fi
  done
  for i in $(seq 1 30); do
    left=0
    for pid in "${pids[@]}"; do group_alive "$pid" && left=1; done
    (( left )) || break
    sleep 0.1
  done
  for name in "$@"; do rm -f "$PIDS/$name.pid"; done
}

gen_pki() {
  mkdir -p "$PKI"
  [[ -f "$PKI/ca.crt" && -f "$PKI/apiserver.crt" && -f "$PKI/sa.key" && -f "$PKI/tokens.csv" ]] && return 0
  log "generating certificates, service-account keys and tokens in $PKI"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=kai-ray-e2e-ca" \
    -keyout "$PKI/ca.key" -out "$PKI/ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" \
    -keyout "$PKI/apiserver.key" -out "$PKI/apiserver.csr" 2>/dev/null
  printf '%s\n' \
    "subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local" \
    "extendedKeyUsage=serverAuth" "keyUsage=digitalSignature,keyEncipherment" >"$PKI/apiserver.ext"
  openssl x509 -req -in "$PKI/apiserver.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" \
    -CAcreateserial -days 3650 -extfile "$PKI/apiserver.ext" -out "$PKI/apiserver.crt" 2>/dev/null
  openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$PKI/sa.key" 2>/dev/null
  openssl pkey -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
  # token,user,uid,"groups": admin and the components are system:masters;
  # "e2e-user" is authenticated but has no RBAC rights at all
  {
    echo "$(openssl rand -hex 16),e2e-admin,e2e-admin,\"system:masters\""
    echo "$(openssl rand -hex 16),e2e-user,e2e-user"
    echo "$(openssl rand -hex 16),kube-controller-manager,kube-controller-manager,\"system:masters\""
    echo "$(openssl rand -hex 16),kube-scheduler,kube-scheduler,\"system:masters\""
    echo "$(openssl rand -hex 16),kwok-controller,kwok-controller,\"system:masters\""
    echo "$(openssl rand -hex 16),kuberay-operator,kuberay-operator,\"system:masters\""
  } >"$PKI/tokens.csv"
  chmod 600 "$PKI"/*.key "$PKI/tokens.csv"
}

token_of() { awk -F, -v u="$1" '$2 == u {print $1}' "$PKI/tokens.csv"; }

write_kubeconfig() { # <file> <user>
  local f="$1" user="$2"
  cat >"$f" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: kai-ray-e2e
  cluster:
    server: $API
    certificate-authority: $PKI/ca.crt
users:
- name: $user
  user:
    token: $(token_of "$user")
contexts:
- name: $user@kai-ray-e2e
  context:
    cluster: kai-ray-e2e
    user: $user
    namespace: default
current-context: $user@kai-ray-e2e
EOF
  chmod 600 "$f"
}

# kubectl built with the control plane (same release); the machine's as a fallback
kubectl_bin() {
  local k
  k="$(bindir kubernetes)/kubectl"
  if [[ -x "$k" ]]; then echo "$k"; else command -v kubectl; fi
}

kube() { "$KUBECTL" --kubeconfig "$KUBECONFIG_ADMIN" "$@"; }

api_ready() {
  curl -sf --max-time 2 --cacert "$PKI/ca.crt" -H "Authorization: Bearer $(token_of e2e-admin)" \
    "$API/readyz" | grep -qx ok
}

audit_flags() { # the audit log of binds and evictions, when KAI_RAY_E2E_AUDIT=1
  [[ "$WITH_AUDIT" == 1 ]] || return 0
  printf '%s\n' "apiVersion: audit.k8s.io/v1" "kind: Policy" "omitStages: [RequestReceived]" \
    "rules:" \
    "- level: Request" "  verbs: [create]" "  resources:" \
    "  - group: \"\"" "    resources: [pods/binding, pods/eviction]" \
    "- level: None" >"$RUN/audit-policy.yaml"
  echo "--audit-policy-file=$RUN/audit-policy.yaml --audit-log-path=$LOGS/audit.log"
  echo "--audit-log-maxsize=1024 --audit-log-mode=blocking"
}

start_apiserver() { # <kubernetes bin dir>
  local k8s="$1"
  # shellcheck disable=SC2046 # one flag per word
  start kube-apiserver "$k8s/kube-apiserver" \
    --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$API_PORT" \
    --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
    --client-ca-file="$PKI/ca.crt" --token-auth-file="$PKI/tokens.csv" \
    --authorization-mode=RBAC --anonymous-auth=false \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
    --service-cluster-ip-range=10.96.0.0/16 --allow-privileged=true \
    --endpoint-reconciler-type=none \
    --disable-admission-plugins=TaintNodesByCondition \
    --profiling=false --v=1 \
    $(audit_flags)
}

restart_apiserver() {
  alive etcd || die "etcd is not running: run $0 up first"
  KUBECTL="$(kubectl_bin)"
  mkdir -p "$LOGS" "$PIDS"
  local t0=$SECONDS
  stop_all kube-apiserver
  [[ -f "$LOGS/kube-apiserver.log" ]] && mv "$LOGS/kube-apiserver.log" "$LOGS/kube-apiserver.log.1"
  start_apiserver "$(bindir kubernetes)"
  wait_for kube-apiserver 90 api_ready || { tail -30 "$LOGS/kube-apiserver.log" >&2; exit 1; }
  log "kube-apiserver restarted and ready in $((SECONDS - t0))s"
}

all_up() {
  local c
  for c in etcd kube-apiserver kube-controller-manager kwok; do alive "$c" || return 1; done
  if [[ "$WITH_SCHEDULER" == 1 ]]; then alive kube-scheduler || return 1; fi
  if [[ "$WITH_KUBERAY" != 0 ]]; then alive ray-operator || return 1; fi
  api_ready
}

kuberay_ready() { # its RayCluster controller has started its workers
  curl -s -o /dev/null "http://127.0.0.1:$RAY_HEALTH_PORT/healthz" &&
    grep 'Starting workers' "$LOGS/ray-operator.log" | grep -qi 'raycluster'
}

kwok_stages() { # writes kwok's stock node and pod stages from the module cache
  local dir out="$RUN/kwok-stages.yaml" f
  dir="$(gomod_dir kwok sigs.k8s.io/kwok)/kustomize/stage"
  : >"$out"
  for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
           pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    [[ -f "$dir/$f" ]] || die "kwok stage $f not found in $dir"
    { echo "---"; cat "$dir/$f"; echo; } >>"$out"
  done
  echo "$out"
}

up() {
  if all_up; then
    log "already up at $API"
    return 0
  fi
  # anything half-started is torn down first, so up always ends in one state
  down_quiet
  local t0=$SECONDS k8s etcd_bin kwok_bin ray_bin
  KUBECTL="$(kubectl_bin)"
  k8s="$(bindir kubernetes)"; etcd_bin="$(bindir etcd)/etcd"
  kwok_bin="$(bindir kwok)/kwok"; ray_bin="$(bindir kuberay)/ray-operator"
  mkdir -p "$RUN" "$LOGS" "$PIDS"
  gen_pki
  write_kubeconfig "$KUBECONFIG_ADMIN" e2e-admin
  write_kubeconfig "$KUBECONFIG_USER" e2e-user
  local comp
  for comp in kube-controller-manager kube-scheduler kwok-controller kuberay-operator; do
    write_kubeconfig "$RUN/$comp.kubeconfig" "$comp"
  done

  rm -rf "$ETCD_DATA"; mkdir -p "$ETCD_DATA"; chmod 700 "$ETCD_DATA"
  start etcd "$etcd_bin" --name=kai-ray-e2e --data-dir="$ETCD_DATA" \
    --listen-client-urls="http://127.0.0.1:$ETCD_PORT" --advertise-client-urls="http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster="kai-ray-e2e=http://127.0.0.1:$ETCD_PEER_PORT" \
    --unsafe-no-fsync=true --max-request-bytes=10485760 --quota-backend-bytes=2147483648 \
    --log-level=warn
  wait_for etcd 30 curl -sf "http://127.0.0.1:$ETCD_PORT/health" || { tail -20 "$LOGS/etcd.log" >&2; down_quiet; exit 1; }
  log "etcd ready (+$((SECONDS - t0))s)"

  start_apiserver "$k8s"
  wait_for kube-apiserver 90 api_ready || { tail -30 "$LOGS/kube-apiserver.log" >&2; down_quiet; exit 1; }
  log "kube-apiserver ready (+$((SECONDS - t0))s)"

  start kube-controller-manager "$k8s/kube-controller-manager" \
    --kubeconfig="$RUN/kube-controller-manager.kubeconfig" \
    --authentication-kubeconfig="$RUN/kube-controller-manager.kubeconfig" \
    --authorization-kubeconfig="$RUN/kube-controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$KCM_PORT" --leader-elect=false \
    --controllers=serviceaccount-controller,serviceaccount-token-controller,namespace-controller,garbage-collector-controller,job-controller,replicaset-controller,deployment-controller,pod-garbage-collector-controller,root-ca-certificate-publisher-controller,resourceclaim-controller \
    --root-ca-file="$PKI/ca.crt" --service-account-private-key-file="$PKI/sa.key" \
    --kube-api-qps=200 --kube-api-burst=400 --concurrent-gc-syncs=5 --v=1

  if [[ "$WITH_SCHEDULER" == 1 ]]; then
    local sched_config=()
    if [[ -n "${KAI_RAY_E2E_KUBE_SCHEDULER_QPS:-}" ]]; then
      printf '%s\n' "apiVersion: kubescheduler.config.k8s.io/v1" \
        "kind: KubeSchedulerConfiguration" \
        "clientConnection:" \
        "  kubeconfig: $RUN/kube-scheduler.kubeconfig" \
        "  qps: $KAI_RAY_E2E_KUBE_SCHEDULER_QPS" \
        "  burst: $KAI_RAY_E2E_KUBE_SCHEDULER_QPS" \
        "leaderElection:" \
        "  leaderElect: false" >"$RUN/kube-scheduler-config.yaml"
      sched_config=(--config="$RUN/kube-scheduler-config.yaml")
    fi
    start kube-scheduler "$k8s/kube-scheduler" "${sched_config[@]}" \
      --kubeconfig="$RUN/kube-scheduler.kubeconfig" \
      --authentication-kubeconfig="$RUN/kube-scheduler.kubeconfig" \
      --authorization-kubeconfig="$RUN/kube-scheduler.kubeconfig" \
      --bind-address=127.0.0.1 --secure-port="$SCHED_PORT" --leader-elect=false --v=1
  fi

  start kwok "$kwok_bin" --kubeconfig="$RUN/kwok-controller.kubeconfig" \
    --config="$(kwok_stages)" \
    --manage-all-nodes=false --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
    --manage-nodes-with-label-selector= --manage-single-node= \
    --cidr=10.244.0.0/16 --node-ip=10.0.0.1 --node-lease-duration-seconds=40 \
    --server-address="127.0.0.1:$KWOK_PORT"

  # the default ServiceAccount exists once the controller-manager works
  wait_for "the default ServiceAccount" 60 kube get serviceaccount default -n default \
    || { tail -30 "$LOGS/kube-controller-manager.log" >&2; down_quiet; exit 1; }
  log "kube-controller-manager and kwok running (+$((SECONDS - t0))s)"

  if [[ "$WITH_KUBERAY" != 0 ]]; then
    local crds f
    crds="$(gomod_dir kuberay github.com/ray-project/kuberay/ray-operator)/config/crd/bases"
    # too large for client-side apply's last-applied annotation: apply server-side
    kube apply --server-side --force-conflicts -f "$crds/ray.io_rayclusters.yaml" \
      -f "$crds/ray.io_rayjobs.yaml" -f "$crds/ray.io_rayservices.yaml" >/dev/null
    # retried: `kubectl wait` fails at once ("accessor error") on a CRD the API
    # server has not given a status yet, instead of waiting for it
    wait_for "the Ray CRDs" 60 kube wait --for=condition=Established --timeout=5s \
      crd/rayclusters.ray.io crd/rayjobs.ray.io crd/rayservices.ray.io \
      || { down_quiet; exit 1; }
    KUBECONFIG="$RUN/kuberay-operator.kubeconfig" start ray-operator "$ray_bin" \
      --enable-leader-election=false \
      --metrics-addr="127.0.0.1:$RAY_METRICS_PORT" \
      --health-probe-bind-address="127.0.0.1:$RAY_HEALTH_PORT"
    wait_for "the KubeRay operator" 60 kuberay_ready \
      || { tail -30 "$LOGS/ray-operator.log" >&2; down_quiet; exit 1; }
    log "KubeRay operator ready (+$((SECONDS - t0))s)"
  fi

  local c
  for c in "${COMPONENTS[@]}"; do
    if [[ -f "$PIDS/$c.pid" ]] && ! alive "$c"; then
      tail -30 "$LOGS/$c.log" >&2; down_quiet; die "$c exited during start-up (log: $LOGS/$c.log)"
    fi
  done
  log "up at $API in $((SECONDS - t0))s; kubeconfig: $KUBECONFIG_ADMIN"
}

down_quiet() {
  # clients first, then the apiserver, then etcd
  stop_all ray-operator kwok kube-scheduler kube-controller-manager
  stop_all kube-apiserver
  stop_all etcd
  rm -rf "$ETCD_DATA"
}

down() {
  down_quiet
  log "down"
}

status() {
  local c rc=0
  for c in "${COMPONENTS[@]}"; do
    if alive "$c"; then
      echo "$c: running (pid $(cat "$PIDS/$c.pid"))"
    elif [[ -f "$PIDS/$c.pid" ]]; then
      echo "$c: DEAD (log: $LOGS/$c.log)"; rc=1
    else
      echo "$c: stopped"
    fi
  done
  if [[ -f "$PKI/tokens.csv" ]] && api_ready; then
    echo "kube-apiserver: ready at $API, version $(curl -sf --cacert "$PKI/ca.crt" \
      -H "Authorization: Bearer $(token_of e2e-admin)" "$API/version" | awk -F'"' '/gitVersion/ {print $4}')"
  else
    echo "kube-apiserver: not ready"; rc=1
  fi
  return $rc
}

env_() {
  echo "export KUBECONFIG=$KUBECONFIG_ADMIN"
  echo "export KAI_RAY_E2E_USER_KUBECONFIG=$KUBECONFIG_USER"
  echo "export KAI_RAY_E2E_KUBECTL=$(kubectl_bin)"
  echo "export KAI_RAY_E2E_HELM=$(bindir helm)/helm"
  echo "export PATH=$(bindir kubernetes):$(bindir helm):\$PATH"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  env) env_ ;;
  status) status ;;
  restart-apiserver) restart_apiserver ;;
  *) echo "usage: $0 up|down|env|status|restart-apiserver" >&2; exit 2 ;;
esac
