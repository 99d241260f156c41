#!/usr/bin/env bash
# Fetches the third-party CRDs that the GitOps examples and their tests need (Argo CD,
# Flux, LeaderWorkerSet, GAIE's InferencePool, Gateway API's standard channel) from the
# Go module proxy: `go mod download` of the project's module at a pinned version, then
# the CRD files are copied out of the module's source.
# One folder per NAME, keyed by version; prints one `NAME=DIR` line per folder.
# Idempotent: a folder already in the cache is not fetched again (the second run runs
# no `go` command and takes well under a second).
#
#   testenv/crds.sh            fetch what is missing, print NAME=DIR lines
#   testenv/crds.sh --env      print `export INFERA_TESTENV_CRDS_<NAME>=DIR` lines
#
# INFERA_TESTENV_CACHE overrides the cache folder (default ~/.cache/infera-testenv).
#
# The folders and files, stable for a given set of versions below (the upstream file
# names are kept; `kubectl apply -f DIR` applies them all, and ignores SOURCES, which
# names the module and path each file came from):
#
#   LWS     $cache/crds/lws-v0.7.0/
#             leaderworkerset.x-k8s.io_leaderworkersets.yaml
#   ARGOCD  $cache/crds/argocd-v3.5.7/
#             application-crd.yaml  appproject-crd.yaml
#   FLUX    $cache/crds/flux-helm-v1.6.4-source-v1.9.6-kustomize-v1.9.6-all/
#             helm.toolkit.fluxcd.io_helmreleases.yaml
#             source.toolkit.fluxcd.io_buckets.yaml
#             source.toolkit.fluxcd.io_externalartifacts.yaml
#             source.toolkit.fluxcd.io_gitrepositories.yaml
#             source.toolkit.fluxcd.io_helmrepositories.yaml
#             source.toolkit.fluxcd.io_ocirepositories.yaml
#             source.toolkit.fluxcd.io_helmcharts.yaml
#             kustomize.toolkit.fluxcd.io_kustomizations.yaml
#   GAIE    $cache/crds/gaie-v1.6.0/
#             inference.networking.k8s.io_inferencepools.yaml
#   GATEWAY_API  $cache/crds/gateway_api-v1.6.3/  (the standard channel)
#             gateway.networking.k8s.io_<plural>.yaml for gatewayclasses, gateways,
#             httproutes, grpcroutes, referencegrants, backendtlspolicies,
#             listenersets, tcproutes, tlsroutes, udproutes
#             (not its vap_safeupgrades.yaml: an admission policy, not a CRD, that
#             only guards the upgrades of a long-lived cluster)
#
# A module the proxy does not serve (or that needs a newer Go than this machine's) is
# skipped with a message on stderr and no line for its NAME; the script still exits 0,
# so tests must treat a missing NAME as "skip", not "fail".
set -euo pipefail

LWS_VERSION=v0.7.0          # sigs.k8s.io/lws; the proxy lists no versions, v0.7.0 is served
ARGOCD_VERSION=v3.5.7       # github.com/argoproj/argo-cd/v3; v3.6.x needs Go 1.27
HELM_CONTROLLER_VERSION=v1.6.4     # HelmRelease helm.toolkit.fluxcd.io/v2; v1.6.5, v1.7.x refused
SOURCE_CONTROLLER_VERSION=v1.9.6   # helm-controller v1.6.4 pins source-controller/api v1.9.x
KUSTOMIZE_CONTROLLER_VERSION=v1.9.6
GAIE_VERSION=v1.6.0         # sigs.k8s.io/gateway-api-inference-extension: InferencePool v1
GATEWAY_API_VERSION=v1.6.3  # sigs.k8s.io/gateway-api; the newest v1.6 patch the proxy serves

cache=${INFERA_TESTENV_CACHE:-$HOME/.cache/infera-testenv}
mode=${1:-}

log() { echo "testenv: $*" >&2; }

# module_dir MODULE@VERSION: download the module (a no-op when it is in the module
# cache) and print the folder holding its source. Run from / so that no go.mod or
# go.work around the caller takes part.
module_dir() {
    local json dir err
    if ! command -v go >/dev/null; then
        log "Go is not on PATH: cannot reach the Go module proxy for $1"
        return 1
    fi
    json=$(cd / && GOWORK=off go mod download -json "$1" 2>&1) || true
    dir=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p' <<<"$json")
    if [ -z "$dir" ] || [ ! -d "$dir" ]; then
        err=$(sed -n 's/^[[:space:]]*"Error": "\(.*\)",*$/\1/p' <<<"$json")
        log "go mod download $1 failed: ${err:-$json}"
        return 1
    fi
    echo "$dir"
}

# fetch NAME VERSION MODULE@VERSION:PATH...: copy each PATH out of its module into
# $cache/crds/<name>-<version>/ and print that folder. The folder is filled under a
# temporary name and renamed at the end, so an interrupted run leaves nothing that a
# later run would take for complete.
fetch() {
    local name=$1 version=$2
    shift 2
    local dir
    dir="$cache/crds/$(tr '[:upper:]' '[:lower:]' <<<"$name")-$version"
    if [ -d "$dir" ]; then
        echo "$dir"
        return 0
    fi
    local started=$SECONDS tmp="$dir.tmp" spec src
    rm -rf "$tmp"
    mkdir -p "$tmp"
    log "fetching $name CRDs (first time only; cached in $dir)"
    for spec in "$@"; do
        if ! src=$(module_dir "${spec%%:*}"); then
            log "skipping $name: ${spec%%:*} cannot be had from the Go module proxy"
            rm -rf "$tmp"
            return 1
        fi
        if [ ! -f "$src/${spec#*:}" ]; then
            log "skipping $name: ${spec%%:*} has no ${spec#*:}"
            rm -rf "$tmp"
            return 1
        fi
        # Files in the module cache are read-only; give the copy ordinary modes.
        install -m 0644 "$src/${spec#*:}" "$tmp/"
        echo "${spec%%:*} ${spec#*:}" >>"$tmp/SOURCES"
    done
    mv "$tmp" "$dir"
    log "fetched $name in $((SECONDS - started))s"
    echo "$dir"
}

lws_mod=sigs.k8s.io/lws@$LWS_VERSION
argocd_mod=github.com/argoproj/argo-cd/v3@$ARGOCD_VERSION
helm_mod=github.com/fluxcd/helm-controller@$HELM_CONTROLLER_VERSION
source_mod=github.com/fluxcd/source-controller@$SOURCE_CONTROLLER_VERSION
kustomize_mod=github.com/fluxcd/kustomize-controller@$KUSTOMIZE_CONTROLLER_VERSION
gaie_mod=sigs.k8s.io/gateway-api-inference-extension@$GAIE_VERSION
gateway_api_mod=sigs.k8s.io/gateway-api@$GATEWAY_API_VERSION

pairs=()
# add NAME VERSION SPEC...: fetch, and remember NAME=DIR unless it was skipped.
add() {
    local dir
    if dir=$(fetch "$@"); then
        pairs+=("$1=$dir")
    fi
}

add LWS "$LWS_VERSION" \
    "$lws_mod:config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml"
add ARGOCD "$ARGOCD_VERSION" \
    "$argocd_mod:manifests/crds/application-crd.yaml" \
    "$argocd_mod:manifests/crds/appproject-crd.yaml"
# Every CRD the three controllers watch (source-controller will not start without
# Bucket and ExternalArtifact), so the GitOps tests run them on the node.
add FLUX "helm-$HELM_CONTROLLER_VERSION-source-$SOURCE_CONTROLLER_VERSION-kustomize-$KUSTOMIZE_CONTROLLER_VERSION-all" \
    "$helm_mod:config/crd/bases/helm.toolkit.fluxcd.io_helmreleases.yaml" \
    "$source_mod:config/crd/bases/source.toolkit.fluxcd.io_buckets.yaml" \
    "$source_mod:config/crd/bases/source.toolkit.fluxcd.io_externalartifacts.yaml" \
    "$source_mod:config/crd/bases/source.toolkit.fluxcd.io_gitrepositories.yaml" \
    "$source_mod:config/crd/bases/source.toolkit.fluxcd.io_helmrepositories.yaml" \
    "$source_mod:config/crd/bases/source.toolkit.fluxcd.io_ocirepositories.yaml" \
    "$source_mod:config/crd/bases/source.toolkit.fluxcd.io_helmcharts.yaml" \
    "$kustomize_mod:config/crd/bases/kustomize.toolkit.fluxcd.io_kustomizations.yaml"
add GAIE "$GAIE_VERSION" \
    "$gaie_mod:config/crd/bases/inference.networking.k8s.io_inferencepools.yaml"
add GATEWAY_API "$GATEWAY_API_VERSION" \
    "$gateway_api_mod:config/crd/standard/gateway.networking.k8s.io_gatewayclasses.yaml" \
    "$gateway_api_mod:config/crd/standard/gateway.networking.k8s.io_gateways.yaml" \
    "$gateway_api_mod:config/crd/standard/gateway.networking.k8s.io_httproutes.yaml" \
    "$gateway_api_mod:config/crd/standard/gateway.networking.k8s.io_grpcroutes.yaml" \
    "$gateway_api_mod:config/crd/standard/gateway.networking.k8s.io_referencegrants.yaml" \
    "$gateway_api_mod:config/crd/standard/gateway.networking.k8s.io_backendtlspolicies.yaml" \
    "$gateway_api_mod:config/crd/standard/gateway.networking.k8s.io_listenersets.yaml" \
    "$gateway_api_mod:config/crd/standard/gateway.networking.k8s.io_tcproutes.yaml" \
    "$gateway_api_mod:config/crd/standard/gateway.networking.k8s.io_tlsroutes.yaml" \
    "$gateway_api_mod:config/crd/standard/gateway.networking.k8s.io_udproutes.yaml"

for pair in ${pairs[@]+"${pairs[@]}"}; do
    if [ "$mode" = "--env" ]; then
        echo "export INFERA_TESTENV_CRDS_$pair"
    else
        echo "$pair"
    fi
done
