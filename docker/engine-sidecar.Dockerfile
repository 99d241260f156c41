# syntax=docker/dockerfile:1
# Infera engine sidecar image (infera-engine-sidecar).
# This image runs the sidecar in attach mode, as its own container; for launch mode,
# copy /usr/local/bin/infera-engine-sidecar from it into the engine's image.
# Two ways to build it:
# - from source (the last stage; the build context is the repository root; BuildKit,
#   the default builder since Docker 23):
#     docker build -f docker/engine-sidecar.Dockerfile -t infera-engine-sidecar:dev .
# - from a binary built already (stage `prebuilt`; the build context is a folder
#   holding infera-engine-sidecar alone), as scripts/images does with buildah:
#     docker build -f docker/engine-sidecar.Dockerfile --target prebuilt -t infera-engine-sidecar:dev DIR

# glibc and libgcc, no shell, no package manager.
FROM gcr.io/distroless/cc-debian12:nonroot AS runtime
LABEL org.opencontainers.image.source="https://github.com/infera/infera" \
      org.opencontainers.image.title="infera-engine-sidecar" \
      org.opencontainers.image.description="Infera engine sidecar: registers an inference engine in etcd, relays its KV events, drains it on shutdown" \
      org.opencontainers.image.licenses="Apache-2.0"
USER 65532:65532
# No EXPOSE: the status port (/health, /metrics, /drain) is off unless --status-port sets it.
ENTRYPOINT ["/usr/local/bin/infera-engine-sidecar"]

FROM runtime AS prebuilt
COPY infera-engine-sidecar /usr/local/bin/infera-engine-sidecar

FROM rust:1.95-bookworm AS builder
WORKDIR /src
COPY . .
# The registry and target folders are BuildKit caches, kept between builds and absent
# from the image, so the binary is copied out in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked -p infera-engine-sidecar --bin infera-engine-sidecar \
    && cp target/release/infera-engine-sidecar /usr/local/bin/infera-engine-sidecar

FROM runtime
COPY --from=builder /usr/local/bin/infera-engine-sidecar /usr/local/bin/infera-engine-sidecar
