# syntax=docker/dockerfile:1
# Infera gateway image (infera-gateway).
# Two ways to build it:
# - from source (the last stage; the build context is the repository root; BuildKit,
#   the default builder since Docker 23):
#     docker build -f docker/gateway.Dockerfile -t infera-gateway:dev .
# - from a binary built already (stage `prebuilt`; the build context is a folder
#   holding infera-gateway alone), as scripts/images does with buildah:
#     docker build -f docker/gateway.Dockerfile --target prebuilt -t infera-gateway:dev DIR

# glibc and libgcc, no shell, no package manager.
FROM gcr.io/distroless/cc-debian12:nonroot AS runtime
LABEL org.opencontainers.image.source="https://github.com/infera/infera" \
      org.opencontainers.image.title="infera-gateway" \
      org.opencontainers.image.description="Infera gateway: the OpenAI and Anthropic APIs over discovered engine workers" \
      org.opencontainers.image.licenses="Apache-2.0"
USER 65532:65532
# The APIs, /health and /metrics, on --port (INFERA_PORT).
EXPOSE 8000
ENTRYPOINT ["/usr/local/bin/infera-gateway"]

FROM runtime AS prebuilt
COPY infera-gateway /usr/local/bin/infera-gateway

FROM rust:1.95-bookworm AS builder
WORKDIR /src
COPY . .
# The registry and target folders are BuildKit caches, kept between builds and absent
# from the image, so the binary is copied out in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked -p infera-gateway --bin infera-gateway \
    && cp target/release/infera-gateway /usr/local/bin/infera-gateway

FROM runtime
COPY --from=builder /usr/local/bin/infera-gateway /usr/local/bin/infera-gateway
