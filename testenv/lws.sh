#!/usr/bin/env bash
# The real LeaderWorkerSet controller (sigs.k8s.io/lws) on the one-node cluster of
# scripts/cluster, installed as LWS's own release manifests are: its config/default
# kustomization (CRD, RBAC, the manager Deployment in lws-system, the admission webhooks
# and their Service, LWS's internal cert management) with the image set to the release's
# reference, registry.k8s.io/lws/lws:v0.7.0. Nothing is pulled: the manager is built
# from its Go module (testenv/lws, CGO_ENABLED=0, cached in
# ~/.cache/infera-testenv/lws-<version>/), put on the distroless stand-in of
# scripts/images under that reference, and imported into the node's containerd.
#
#   testenv/lws.sh install     build what is missing, load the image, apply the manifests,
#                              wait until the manager is Available and its webhooks answer
#                              (a server-side dry-run create of a LeaderWorkerSet);
#                              safe to run again (an unchanged install changes nothing)
#   testenv/lws.sh uninstall   remove everything install applied (LeaderWorkerSets with
#                              their CRD); the image stays in containerd
#   testenv/lws.sh status      the manager's pods and whether the webhook answers
#   testenv/lws.sh manifests   print the manifests install applies
#   testenv/lws.sh build       build the manager (cached) and print its path
#
# The webhooks' serving certificate comes from LWS itself: its cert-controller
# (internalCertManagement) makes a CA and a certificate for
# lws-webhook-service.lws-system.svc, stores them in the Secret lws-webhook-server-cert
# (mounted into the pod) and writes the CA into both webhook configurations' caBundle.
# The API server reaches the webhook through the Service (kube-proxy on the node). The
# kubelet refreshes the mounted Secret on its next sync of the pod, so the webhook
# answers up to about a minute after the pod is Ready on a first install.
#
# Changes to LWS's manifests, all in a kustomize overlay over the module's config/default:
# the image reference of a release (config/manager names the staging registry's :main),
# one replica instead of two and requests of 50m CPU / 128Mi instead of 1 CPU / 1Gi
# (the node has 2 CPUs).
#
# Environment: INFERA_CLUSTER_KUBECONFIG (default /var/lib/infera-cluster/kubeconfig),
# INFERA_CLUSTER_CONTAINERD (default /run/infera-cluster/containerd.sock),
# INFERA_TESTENV_CACHE (default ~/.cache/infera-testenv), INFERA_TESTENV_LWS (a manager
# binary built already, e.g. by testenv/build.sh), LWS_WAIT_SECONDS (default 240).
set -euo pipefail

LWS_VERSION=v0.7.0   # sigs.k8s.io/lws, as testenv/lws/go.mod and testenv/crds.sh pin it
IMAGE=registry.k8s.io/lws/lws:$LWS_VERSION
# The image config/manager names; the overlay replaces it with the release's.
STAGING_IMAGE=us-central1-docker.pkg.dev/k8s-staging-images/lws/lws
NAMESPACE=lws-system
DEPLOYMENT=lws-controller-manager
CRD=leaderworkersets.leaderworkerset.x-k8s.io
DISTROLESS=gcr.io/distroless/cc-debian12:nonroot

here=$(cd "$(dirname "$0")" && pwd)
cache=${INFERA_TESTENV_CACHE:-$HOME/.cache/infera-testenv}
kubeconfig=${INFERA_CLUSTER_KUBECONFIG:-${INFERA_CLUSTER_DIR:-/var/lib/infera-cluster}/kubeconfig}
containerd_sock=${INFERA_CLUSTER_CONTAINERD:-/run/infera-cluster/containerd.sock}
wait_seconds=${LWS_WAIT_SECONDS:-240}
images=$cache/images
store=(--root "$images/storage" --runroot "$images/run" --storage-driver overlay)

log() { echo "lws: $*" >&2; }
die() { log "$*"; exit 1; }
buildah_() { buildah "${store[@]}" "$@"; }

kubectl_() { "$INFERA_TESTENV_KUBECTL" --kubeconfig "$kubeconfig" "$@"; }

# ---- the manager binary --------------------------------------------------------------

# Builds sigs.k8s.io/lws/cmd (LWS's /manager) from testenv/lws, static, into the cache;
# prints its path. The same command testenv/build.sh runs when it builds `lws`.
manager_binary() {
    if [ -n "${INFERA_TESTENV_LWS:-}" ] && [ -x "$INFERA_TESTENV_LWS" ]; then
        echo "$INFERA_TESTENV_LWS"
        return
    fi
    local out="$cache/lws-$LWS_VERSION/lws"
    if [ -x "$out" ]; then
        echo "$out"
        return
    fi
    command -v go >/dev/null || die "Go is required to build the LWS manager"
    mkdir -p "$(dirname "$out")"
    local started=$SECONDS
    log "building the LWS manager $LWS_VERSION (first time only, a few minutes; cached in $(dirname "$out"))"
    (cd "$here/lws" && CGO_ENABLED=0 go build -trimpath \
        -ldflags "-s -w -X sigs.k8s.io/lws/pkg/version.GitVersion=$LWS_VERSION" \
        -o "$out.tmp" sigs.k8s.io/lws/cmd)
    mv "$out.tmp" "$out"
    log "built the LWS manager in $((SECONDS - started))s"
    echo "$out"
}

# ---- the image -----------------------------------------------------------------------

# Makes $IMAGE in buildah's store (the store scripts/images uses) unless it was made from
# the same binary and base; prints its image id.
build_image() {
    local binary=$1 base_id key keyfile
    command -v buildah >/dev/null || die "buildah is required (Debian: apt-get install buildah)"
    base_id=$(buildah_ inspect --type image --format '{{.FromImageID}}' "$DISTROLESS" 2>/dev/null) ||
        die "the runtime base $DISTROLESS is not in $images/storage: scripts/cluster create (scripts/images) makes it"
    key=$( (sha256sum <"$binary"; echo "$base_id") | sha256sum | cut -c1-16)
    keyfile=$cache/lws-$LWS_VERSION/image-key
    if [ -f "$keyfile" ] && [ "$(cat "$keyfile")" = "$key" ] &&
        buildah_ inspect --type image "$IMAGE" >/dev/null 2>&1; then
        buildah_ inspect --type image --format '{{.FromImageID}}' "$IMAGE"
        return
    fi
    log "building $IMAGE (the manager on $DISTROLESS)"
    local ctr
    ctr=$(buildah_ from --pull=never "$DISTROLESS")
    buildah_ copy --chmod 0755 "$ctr" "$binary" /manager >/dev/null
    # As LWS's Dockerfile: /manager as the entry point, user 65532, working dir /.
    buildah_ config --user 65532:65532 --workingdir / --entrypoint '["/manager"]' --cmd '' \
        --label org.opencontainers.image.source=https://github.com/kubernetes-sigs/lws \
        --label "org.opencontainers.image.version=$LWS_VERSION" "$ctr"
    buildah_ commit --quiet --rm "$ctr" "$IMAGE" >/dev/null
    echo "$key" >"$keyfile"
    buildah_ inspect --type image --format '{{.FromImageID}}' "$IMAGE"
}

# Imports $IMAGE into the node's containerd (k8s.io namespace) unless that image id is
# there already; sets `reloaded` when it imported one.
reloaded=0
load_image() {
    local id=$1 marker archive
    [ -S "$containerd_sock" ] || die "no containerd at $containerd_sock: start the node with scripts/cluster create"
    marker=$cache/lws-$LWS_VERSION/loaded-$(echo "$containerd_sock" | sha256sum | cut -c1-12)
    if [ -f "$marker" ] && [ "$(cat "$marker")" = "$id" ] &&
        ctr --address "$containerd_sock" -n k8s.io images ls -q "name==$IMAGE" | grep -q .; then
        return
    fi
    archive=$(mktemp -u --suffix .tar)
    buildah_ push --quiet "$IMAGE" "oci-archive:$archive:$IMAGE" >/dev/null
    ctr --address "$containerd_sock" -n k8s.io images import "$archive" >/dev/null
    rm -f "$archive"
    echo "$id" >"$marker"
    reloaded=1
    log "loaded $IMAGE into $containerd_sock"
}

# ---- the manifests -------------------------------------------------------------------

# The folder of sigs.k8s.io/lws@$LWS_VERSION in the module cache (downloaded when
# missing). Run from / so that no go.mod or go.work around the caller takes part.
module_dir() {
    local json dir
    json=$(cd / && GOWORK=off go mod download -json "sigs.k8s.io/lws@$LWS_VERSION" 2>&1) || true
    dir=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p' <<<"$json")
    [ -n "$dir" ] && [ -d "$dir/config/default" ] ||
        die "go mod download sigs.k8s.io/lws@$LWS_VERSION failed: $json"
    echo "$dir"
}

# Prints LWS's config/default, rendered by kubectl's built-in kustomize with the overlay
# described at the top.
manifests() {
    local src work
    src=$(module_dir)
    work=$(mktemp -d)
    # kustomize reads the module's files; a writable copy keeps the overlay beside them.
    cp -r "$src/config" "$work/config"
    chmod -R u+w "$work"
    mkdir "$work/infera"
    cat >"$work/infera/kustomization.yaml" <<EOF
# testenv/lws.sh: LWS $LWS_VERSION's config/default on a one-node test cluster.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- ../config/default
images:
- name: $STAGING_IMAGE
  newName: ${IMAGE%:*}
  newTag: $LWS_VERSION
patches:
- patch: |-
    apiVersion: apps/v1
    kind: Deployment
    metadata: {name: $DEPLOYMENT, namespace: $NAMESPACE}
    spec:
      replicas: 1
      template:
        spec:
          containers:
          - name: manager
            resources:
              requests: {cpu: 50m, memory: 128Mi}
EOF
    local rc=0
    "$INFERA_TESTENV_KUBECTL" kustomize "$work/infera" || rc=$?
    rm -rf "$work"
    return $rc
}

# ---- waiting -------------------------------------------------------------------------

# A LeaderWorkerSet that is only ever dry-run: the API server sends it through LWS's
# mutating and validating webhooks and stores nothing.
PROBE='apiVersion: leaderworkerset.x-k8s.io/v1
kind: LeaderWorkerSet
metadata: {name: lws-install-probe, namespace: default}
spec:
  replicas: 1
  leaderWorkerTemplate:
    size: 2
    workerTemplate:
      spec:
        containers: [{name: probe, image: registry.k8s.io/pause:3.10}]'

webhook_answers() {
    kubectl_ create --dry-run=server -o name -f - <<<"$PROBE" 2>&1
}

wait_ready() {
    local deadline=$((SECONDS + wait_seconds)) out
    # (`kubectl wait` fails rather than waits while a new object has no conditions yet.)
    local jsonpath='{.status.conditions[?(@.type=="Established")].status}'
    until [ "$(kubectl_ get "crd/$CRD" -o "jsonpath=$jsonpath" 2>/dev/null)" = True ]; do
        [ $SECONDS -lt $deadline ] || die "the CRD $CRD is not Established within ${wait_seconds}s"
        sleep 1
    done
    if ! kubectl_ -n "$NAMESPACE" rollout status "deployment/$DEPLOYMENT" --timeout="${wait_seconds}s" >&2 ||
        ! kubectl_ -n "$NAMESPACE" wait --for=condition=Available "deployment/$DEPLOYMENT" --timeout=30s >/dev/null; then
        kubectl_ -n "$NAMESPACE" get pods -o wide >&2 || true
        kubectl_ -n "$NAMESPACE" logs "deployment/$DEPLOYMENT" --tail=30 >&2 || true
        die "the LWS manager did not become Available within ${wait_seconds}s (kubectl --kubeconfig $kubeconfig -n $NAMESPACE describe pods)"
    fi
    log "the manager is Available; waiting for its webhooks (certificate from its cert-controller)"
    while ! out=$(webhook_answers); do
        if [ $SECONDS -ge $deadline ]; then
            kubectl_ -n "$NAMESPACE" logs "deployment/$DEPLOYMENT" --tail=30 >&2 || true
            die "the LWS webhooks did not answer within ${wait_seconds}s; last answer: $out"
        fi
        sleep 2
    done
    log "webhooks answer: $out (dry run)"
}

# ---- commands ------------------------------------------------------------------------

setup_kubectl() {
    if [ -z "${INFERA_TESTENV_KUBECTL:-}" ]; then
        eval "$("$here/build.sh" --env)"
    fi
}

need_cluster() {
    [ -f "$kubeconfig" ] || die "no cluster kubeconfig at $kubeconfig: scripts/cluster create"
    kubectl_ get --raw /readyz >/dev/null 2>&1 || die "the API server behind $kubeconfig does not answer: scripts/cluster create"
}

install() {
    local started=$SECONDS binary id rendered
    setup_kubectl
    need_cluster
    binary=$(manager_binary)
    id=$(build_image "$binary")
    load_image "$id"
    rendered=$(manifests)
    # Server-side: the CRD is too large for client-side apply's annotation. The Secret's
    # data and the webhooks' caBundle belong to LWS's cert-controller and are left alone.
    local running=0
    kubectl_ -n "$NAMESPACE" get "deployment/$DEPLOYMENT" >/dev/null 2>&1 && running=1
    kubectl_ apply --server-side --force-conflicts -f - <<<"$rendered" >/dev/null
    if [ $running = 1 ] && [ $reloaded = 1 ]; then
        # Same reference, new content (a rebuilt base): the running pod has the old one.
        log "the image changed: restarting the manager"
        kubectl_ -n "$NAMESPACE" rollout restart "deployment/$DEPLOYMENT" >/dev/null
    fi
    wait_ready
    log "LWS $LWS_VERSION installed in $((SECONDS - started))s (image $IMAGE, namespace $NAMESPACE)"
}

uninstall() {
    local rendered
    setup_kubectl
    need_cluster
    rendered=$(manifests)
    # Webhooks first: with the manager gone a pod update the webhook matches would fail.
    kubectl_ delete --ignore-not-found mutatingwebhookconfiguration/lws-mutating-webhook-configuration \
        validatingwebhookconfiguration/lws-validating-webhook-configuration >/dev/null
    kubectl_ delete --ignore-not-found --wait=true --timeout="${wait_seconds}s" -f - <<<"$rendered" >/dev/null
    log "LWS uninstalled"
}

status() {
    setup_kubectl
    need_cluster
    kubectl_ -n "$NAMESPACE" get deployment,pods -o wide 2>&1 || true
    local out
    if out=$(webhook_answers); then
        echo "webhook: answers ($out, dry run)"
    else
        echo "webhook: $out"
        return 1
    fi
}

case "${1:-}" in
    install) install ;;
    uninstall) uninstall ;;
    status) status ;;
    manifests) setup_kubectl; manifests ;;
    build) manager_binary ;;
    -h | --help | help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' ;;
    *) die "usage: testenv/lws.sh install | uninstall | status | manifests | build (--help)" ;;
esac
