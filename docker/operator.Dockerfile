# syntax=docker/dockerfile:1
# Infera operator image (infera-operator).
# Two ways to build it:
# - from source (the last stage; the build context is the repository root; BuildKit,
#   the default builder since Docker 23):
#     docker build -f docker/operator.Dockerfile -t infera-operator:dev .
# - from a binary built already (stage `prebuilt`; the build context is a folder
#   holding infera-operator alone), as scripts/images does with buildah:
#     docker build -f docker/operator.Dockerfile --target prebuilt -t infera-operator:dev DIR

# glibc and libgcc, no shell, no package manager.
FROM gcr.io/distroless/cc-debian12:nonroot AS runtime
LABEL org.opencontainers.image.source="https://github.com/infera/infera" \
      org.opencontainers.image.title="infera-operator" \
      org.opencontainers.image.description="Infera operator: reconciles InferaDeployment and PDTopology resources into engine workers and gateways" \
      org.opencontainers.image.licenses="Apache-2.0"
USER 65532:65532
# Health and metrics.
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/infera-operator"]

FROM runtime AS prebuilt
COPY infera-operator /usr/local/bin/infera-operator

FROM rust:1.95-bookworm AS builder
WORKDIR /src
COPY . .
# The registry and target folders are BuildKit caches, kept between builds and absent
# from the image, so the binary is copied out in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked -p infera-operator --bin infera-operator \
    && cp target/release/infera-operator /usr/local/bin/infera-operator

FROM runtime
COPY --from=builder /usr/local/bin/infera-operator /usr/local/bin/infera-operator
