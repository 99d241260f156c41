#!/usr/bin/env bash
# The metrics APIs a cluster's own autoscalers read, on the one-node cluster of
# scripts/cluster, installed from their projects' own manifests: metrics-server v0.8.0
# (the resource metrics API, metrics.k8s.io: CPU and memory of pods, from the kubelet's
# /metrics/resource) and KEDA v2.21.0 (its operator and its external metrics API server,
# external.metrics.k8s.io, with its CRDs). Both are aggregated APIServices: the node's
# kube-apiserver runs with the aggregation layer's flags (scripts/cluster).
#
#   testenv/autoscalers.sh install     apply the manifests, wait until both APIServices
#                                      are Available and answer; safe to run again
#   testenv/autoscalers.sh uninstall   remove them, the APIServices first (a registered
#                                      APIService with no server behind it stops every
#                                      namespace deletion of the cluster)
#   testenv/autoscalers.sh status      their pods and APIServices
#   testenv/autoscalers.sh manifests   print what install applies
#
# Nothing is pulled: the binaries are built from their Go modules by testenv/build.sh
# (testenv/metrics-server, testenv/keda) and put on the distroless stand-in under the
# references the release manifests name (scripts/images, loaded by scripts/cluster).
#
# Changes to upstream's manifests, all in kustomize overlays over the modules' own
# folders: metrics-server's manifests/overlays/release with requests of 20m CPU / 48Mi
# (was 100m / 200Mi) and a metric resolution of 10 s (was 15 s; the least it takes, with the
# kubelet request timeout cut to 5 s to stay under it), so
# an HPA sees a load within about 20 s; KEDA's config/minimal (no admission webhooks,
# so --enable-webhook-patching=false) with the release's image tags, IfNotPresent, and
# requests of 20m / 64Mi (was 100m / 100Mi). The node has 2 CPUs.
#
# Environment: INFERA_CLUSTER_KUBECONFIG (default /var/lib/infera-cluster/kubeconfig),
# INFERA_TESTENV_KUBECTL (else testenv/build.sh is asked), AUTOSCALERS_WAIT_SECONDS
# (default 240).
set -euo pipefail

METRICS_SERVER_VERSION=v0.8.0 # as testenv/metrics-server/go.mod pins it
KEDA_VERSION=v2.21.0          # as testenv/keda/go.mod pins it

here=$(cd "$(dirname "$0")" && pwd)
kubeconfig=${INFERA_CLUSTER_KUBECONFIG:-${INFERA_CLUSTER_DIR:-/var/lib/infera-cluster}/kubeconfig}
wait_seconds=${AUTOSCALERS_WAIT_SECONDS:-240}

log() { echo "autoscalers: $*" >&2; }
die() { log "$*"; exit 1; }

if [ -z "${INFERA_TESTENV_KUBECTL:-}" ]; then
    eval "$("$here/build.sh" --env)"
fi
kubectl_() { "$INFERA_TESTENV_KUBECTL" --kubeconfig "$kubeconfig" "$@"; }

# module_dir MODULE@VERSION: its folder in the module cache (downloaded when missing).
# Run from / so that no go.mod or go.work around the caller takes part.
module_dir() {
    local json dir
    json=$(cd / && GOWORK=off go mod download -json "$1" 2>&1) || true
    dir=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p' <<<"$json")
    [ -n "$dir" ] && [ -d "$dir" ] || die "go mod download $1 failed: $json"
    echo "$dir"
}

# render NAME FOLDER RESOURCE < KUSTOMIZATION-BODY: the module folder FOLDER copied
# (kustomize wants the overlay beside it, and module files are read-only), the overlay
# over FOLDER's RESOURCE, rendered by kubectl's kustomize.
render() {
    local name=$1 folder=$2 resource=$3 work rc=0
    work=$(mktemp -d)
    cp -r "$folder" "$work/upstream"
    chmod -R u+w "$work"
    mkdir "$work/infera"
    {
        echo "# testenv/autoscalers.sh: $name on a one-node test cluster."
        echo "apiVersion: kustomize.config.k8s.io/v1beta1"
        echo "kind: Kustomization"
        echo "resources:"
        echo "- ../upstream/$resource"
        cat
    } >"$work/infera/kustomization.yaml"
    # kustomize warns on stderr about upstream's deprecated commonLabels.
    kubectl_ kustomize "$work/infera" 2>/dev/null || rc=$?
    rm -rf "$work"
    return $rc
}

metrics_server_manifests() {
    render "metrics-server $METRICS_SERVER_VERSION" \
        "$(module_dir "sigs.k8s.io/metrics-server@$METRICS_SERVER_VERSION")/manifests" \
        overlays/release <<'EOF'
patches:
- target: {group: apps, version: v1, kind: Deployment, name: metrics-server}
  patch: |-
    - {op: replace, path: /spec/template/spec/containers/0/resources/requests, value: {cpu: 20m, memory: 48Mi}}
    - op: replace
      path: /spec/template/spec/containers/0/args
      value: [--cert-dir=/tmp, --secure-port=10250, --kubelet-preferred-address-types=InternalIP,ExternalIP,Hostname, --kubelet-use-node-status-port, --kubelet-request-timeout=5s, --metric-resolution=10s]
EOF
}

keda_manifests() {
    local tag=${KEDA_VERSION#v}
    render "KEDA $KEDA_VERSION" "$(module_dir "github.com/kedacore/keda/v2@$KEDA_VERSION")/config" \
        minimal <<EOF
images:
- {name: ghcr.io/kedacore/keda, newName: ghcr.io/kedacore/keda, newTag: "$tag"}
- {name: ghcr.io/kedacore/keda-metrics-apiserver, newName: ghcr.io/kedacore/keda-metrics-apiserver, newTag: "$tag"}
patches:
- target: {group: apps, version: v1, kind: Deployment, name: keda-operator}
  patch: |-
    - {op: add, path: /spec/template/spec/containers/0/args/-, value: --enable-webhook-patching=false}
    - {op: replace, path: /spec/template/spec/containers/0/imagePullPolicy, value: IfNotPresent}
    - {op: replace, path: /spec/template/spec/containers/0/resources/requests, value: {cpu: 20m, memory: 64Mi}}
- target: {group: apps, version: v1, kind: Deployment, name: keda-metrics-apiserver}
  patch: |-
    - {op: replace, path: /spec/template/spec/containers/0/imagePullPolicy, value: IfNotPresent}
    - {op: replace, path: /spec/template/spec/containers/0/resources/requests, value: {cpu: 20m, memory: 64Mi}}
EOF
}

manifests() {
    metrics_server_manifests
    echo "---"
    keda_manifests
}

# wait_apiservice NAME PATH: until the APIService says Available and PATH answers.
wait_apiservice() {
    local name=$1 path=$2 deadline=$((SECONDS + wait_seconds)) status
    while true; do
        status=$(kubectl_ get apiservice "$name" \
            -o jsonpath='{.status.conditions[?(@.type=="Available")].status}' 2>/dev/null || true)
        if [ "$status" = True ] && kubectl_ get --raw "$path" >/dev/null 2>&1; then
            return 0
        fi
        if [ $SECONDS -ge $deadline ]; then
            kubectl_ get apiservice "$name" -o yaml >&2 || true
            die "APIService $name not available within ${wait_seconds}s"
        fi
        sleep 2
    done
}

install() {
    local started=$SECONDS
    # Server-side: KEDA's ScaledJob CRD is past client-side apply's annotation limit.
    manifests | kubectl_ apply --server-side --force-conflicts -f - >/dev/null
    kubectl_ -n kube-system rollout status deploy/metrics-server --timeout="${wait_seconds}s" >&2
    # KEDA's operator makes its certificates, stores them in keda/kedaorg-certs, exits
    # once to load them (by design), then patches its APIService's caBundle.
    kubectl_ -n keda rollout status deploy/keda-operator --timeout="${wait_seconds}s" >&2
    kubectl_ -n keda rollout status deploy/keda-metrics-apiserver --timeout="${wait_seconds}s" >&2
    wait_apiservice v1beta1.metrics.k8s.io /apis/metrics.k8s.io/v1beta1/nodes
    wait_apiservice v1beta1.external.metrics.k8s.io /apis/external.metrics.k8s.io/v1beta1
    log "metrics-server $METRICS_SERVER_VERSION and KEDA $KEDA_VERSION serving in $((SECONDS - started))s"
}

uninstall() {
    kubectl_ delete apiservice v1beta1.external.metrics.k8s.io v1beta1.metrics.k8s.io \
        --ignore-not-found >&2
    kubectl_ delete scaledobjects.keda.sh --all -A --ignore-not-found >&2 || true
    manifests | kubectl_ delete --ignore-not-found -f - >&2
}

status() {
    kubectl_ get pods -n kube-system -l k8s-app=metrics-server -o wide
    kubectl_ get pods -n keda -o wide
    kubectl_ get apiservice v1beta1.metrics.k8s.io v1beta1.external.metrics.k8s.io
}

case "${1:-}" in
    install) install ;;
    uninstall) uninstall ;;
    status) status ;;
    manifests) manifests ;;
    *) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2; exit 2 ;;
esac
