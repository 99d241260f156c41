#!/usr/bin/env bash
# Builds the real binaries the test suite runs from Go modules into a cache folder keyed
# by version (or, for this repository's own Go programs, by a digest of their sources),
# then prints one `NAME=PATH` line per binary. Idempotent: a binary already in the cache
# is not rebuilt, so a second run takes well under a second.
#
# The control plane (always): kube-apiserver, etcd, nats-server, helm, kubectl, and an
# OpenTelemetry Collector with only an OTLP receiver and a file exporter (testenv/otelcol)
# that the gateway's OTLP trace export is tested against, and Prometheus' promtool
# (testenv/promtool), which tests the chart's alerting rules, and GAIE's reference
# endpoint picker lwepp (testenv/lwepp), the control of the picker's Envoy tests. With
# --node, also the one-node cluster of scripts/cluster: kube-controller-manager, kube-scheduler, kubelet and
# kube-proxy (the kube-apiserver's module and version), CoreDNS (testenv/coredns), the
# sandbox's pause process (testenv/pause), a device plugin for fake AMD GPUs and RDMA
# NICs (testenv/device-plugin), and a stand-in for the Hugging Face Hub's file API
# (testenv/hf-hub) that the model download tests run in the cluster; the LeaderWorkerSet
# controller's manager (testenv/lws, installed by testenv/lws.sh); Flux's source-,
# kustomize- and helm-controller (testenv/flux) and the git server the GitOps tests
# serve a repository from (testenv/git-server); metrics-server and KEDA's operator and
# metrics server (testenv/metrics-server, testenv/keda) for the autoscaling tests.
#
#   testenv/build.sh            build what is missing, print NAME=PATH lines
#   testenv/build.sh --env      print `export INFERA_TESTENV_<NAME>=PATH` lines
#   testenv/build.sh --node     the node's binaries too (either form)
#
# INFERA_TESTENV_CACHE overrides the cache folder (default ~/.cache/infera-testenv).
set -euo pipefail

KUBE_VERSION=v1.33.13   # within one minor of the machine's kubectl (1.32); k8s-openapi v1_33
ETCD_VERSION=v3.5.21    # the etcd server version k8s.io/kubernetes v1.33.13 pins in go.mod
NATS_VERSION=v2.11.17
HELM_VERSION=v3.18.6
LWS_VERSION=v0.7.0      # sigs.k8s.io/lws (testenv/lws/go.mod; testenv/lws.sh installs it)
COREDNS_VERSION=v1.14.1  # testenv/coredns/go.mod pins it (client-go 0.34: one minor of skew)
OTELCOL_VERSION=v0.161.0 # testenv/otelcol/go.mod pins it (core v0.161.0, v1.67.0; contrib v0.161.0)
PROMETHEUS_VERSION=v0.316.0 # testenv/promtool/go.mod pins it (promtool, for the chart's alerting rules)
GAIE_VERSION=v1.6.0      # testenv/lwepp/go.mod pins it (GAIE's reference endpoint picker)
# Flux's controllers (testenv/flux/<name>/go.mod pins each; v1.10 needs Go 1.27).
FLUX_SOURCE_VERSION=v1.9.6
FLUX_KUSTOMIZE_VERSION=v1.9.6
FLUX_HELM_VERSION=v1.6.4
METRICS_SERVER_VERSION=v0.8.0 # testenv/metrics-server/go.mod pins it
KEDA_VERSION=v2.21.0          # testenv/keda/go.mod pins it (v2.21.1 declares Go 1.27.4)

here=$(cd "$(dirname "$0")" && pwd)
cache=${INFERA_TESTENV_CACHE:-$HOME/.cache/infera-testenv}
env_lines=0
with_node=0
for arg in "$@"; do
    case "$arg" in
        --env) env_lines=1 ;;
        --node) with_node=1 ;;
        *) echo "usage: testenv/build.sh [--env] [--node]" >&2; exit 2 ;;
    esac
done

log() { echo "testenv: $*" >&2; }

# build NAME VERSION DIR-OR-PACKAGE [ldflags]
build() {
    local name=$1 version=$2 src=$3 ldflags=${4:-}
    local out="$cache/$name-$version/$name"
    if [ -x "$out" ]; then
        echo "$out"
        return
    fi
    mkdir -p "$(dirname "$out")"
    local started=$SECONDS
    log "building $name $version (first time only; cached in $(dirname "$out"))"
    if [ -d "$here/$src" ]; then
        (cd "$here/$src" && go build -trimpath -ldflags "-s -w $ldflags" -o "$out.tmp" "${5:-.}")
    else
        local gobin
        gobin=$(mktemp -d)
        GOBIN=$gobin go install -trimpath -ldflags "-s -w $ldflags" "$src@$version"
        mv "$gobin/$(basename "${src%/v[0-9]*}")" "$out.tmp"
        rmdir "$gobin"
    fi
    mv "$out.tmp" "$out"
    log "built $name in $((SECONDS - started))s"
    echo "$out"
}

command -v go >/dev/null || { log "Go is required to build the test environment"; exit 1; }

# A digest of a local module's sources: a changed program is rebuilt.
src_key() {
    (cd "$here/$1" && find . -name '*.go' -o -name go.mod -o -name go.sum | LC_ALL=C sort |
        xargs cat) | sha256sum | cut -c1-12
}

kv=k8s.io/component-base/version
minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
apiserver=$(build kube-apiserver "$KUBE_VERSION" kube-apiserver \
    "-X $kv.gitVersion=$KUBE_VERSION -X $kv.gitMajor=1 -X $kv.gitMinor=$minor" \
    k8s.io/kubernetes/cmd/kube-apiserver)
etcd=$(build etcd "$ETCD_VERSION" etcd)
nats=$(build nats-server "$NATS_VERSION" github.com/nats-io/nats-server/v2)
helm=$(build helm "$HELM_VERSION" helm.sh/helm/v3/cmd/helm)
kubectl=$(build kubectl "$KUBE_VERSION" kubectl \
    "-X $kv.gitVersion=$KUBE_VERSION -X $kv.gitMajor=1 -X $kv.gitMinor=$minor")
# Static, as the collector's own releases are.
otelcol=$(CGO_ENABLED=0 build otelcol "$OTELCOL_VERSION-$(src_key otelcol)" otelcol)
promtool=$(CGO_ENABLED=0 build promtool "$PROMETHEUS_VERSION-$(src_key promtool)" promtool "" \
    github.com/prometheus/prometheus/cmd/promtool)
lwepp=$(CGO_ENABLED=0 build lwepp "$GAIE_VERSION-$(src_key lwepp)" lwepp "" \
    sigs.k8s.io/gateway-api-inference-extension/cmd/lwepp)
pairs=("KUBE_APISERVER=$apiserver" "ETCD=$etcd" "NATS_SERVER=$nats" "HELM=$helm" "KUBECTL=$kubectl"
    "OTELCOL=$otelcol" "PROMTOOL=$promtool" "LWEPP=$lwepp")
if [ "$with_node" = 1 ]; then
    # The node and its controllers, from the kube-apiserver's module (same dependency graph).
    for name in kube-controller-manager kube-scheduler kubelet kube-proxy; do
        path=$(build "$name" "$KUBE_VERSION" kube-apiserver \
            "-X $kv.gitVersion=$KUBE_VERSION -X $kv.gitMajor=1 -X $kv.gitMinor=$minor" \
            "k8s.io/kubernetes/cmd/$name")
        upper=$(echo "$name" | tr 'a-z-' 'A-Z_')
        pairs+=("$upper=$path")
    done
    # Static: pause runs alone in a FROM-scratch image; CoreDNS, as the real releases are.
    pairs+=("COREDNS=$(CGO_ENABLED=0 build coredns "$COREDNS_VERSION-$(src_key coredns)" coredns)")
    pairs+=("PAUSE=$(CGO_ENABLED=0 build pause "3.10-$(src_key pause)" pause "-X main.version=3.10")")
    pairs+=("DEVICE_PLUGIN=$(build device-plugin "$(src_key device-plugin)" device-plugin)")
    pairs+=("HF_HUB=$(CGO_ENABLED=0 build hf-hub "$(src_key hf-hub)" hf-hub)")
    pairs+=("LWS=$(CGO_ENABLED=0 build lws "$LWS_VERSION" lws \
        "-X sigs.k8s.io/lws/pkg/version.GitVersion=$LWS_VERSION" sigs.k8s.io/lws/cmd)")
    # Flux's source-, kustomize- and helm-controller, static as their releases are, for
    # the GitOps tests (testenv/flux/flux.yaml runs them as pods).
    for spec in "source-controller $FLUX_SOURCE_VERSION" \
        "kustomize-controller $FLUX_KUSTOMIZE_VERSION" "helm-controller $FLUX_HELM_VERSION"; do
        set -- $spec
        upper=FLUX_$(echo "${1%-controller}" | tr 'a-z' 'A-Z')
        pairs+=("$upper=$(CGO_ENABLED=0 build "$1" "$2-$(src_key "flux/$1")" "flux/$1" "" \
            "github.com/fluxcd/$1")")
    done
    pairs+=("GIT_SERVER=$(CGO_ENABLED=0 build git-server "$(src_key git-server)" git-server)")
    # The autoscaling tests' metrics APIs (testenv/autoscalers.sh installs them):
    # metrics-server (metrics.k8s.io) and KEDA's operator and external metrics server.
    pairs+=("METRICS_SERVER=$(CGO_ENABLED=0 build metrics-server \
        "$METRICS_SERVER_VERSION-$(src_key metrics-server)" metrics-server \
        "-X k8s.io/client-go/pkg/version.gitVersion=$METRICS_SERVER_VERSION" \
        sigs.k8s.io/metrics-server/cmd/metrics-server)")
    for part in operator adapter; do
        upper=KEDA_$(tr 'a-z' 'A-Z' <<<"$part")
        pairs+=("$upper=$(CGO_ENABLED=0 build "keda-$part" "$KEDA_VERSION-$(src_key keda)" keda \
            "-X github.com/kedacore/keda/v2/version.Version=${KEDA_VERSION#v}" \
            "github.com/kedacore/keda/v2/cmd/$part")")
    done
fi

for pair in "${pairs[@]}"; do
    if [ "$env_lines" = 1 ]; then
        echo "export INFERA_TESTENV_$pair"
    else
        echo "$pair"
    fi
done
