# syntax=docker/dockerfile:1
# Infera command line image (infera).
# Two ways to build it:
# - from source (the last stage; the build context is the repository root; BuildKit,
#   the default builder since Docker 23):
#     docker build -f docker/cli.Dockerfile -t infera:dev .
# - from a binary built already (stage `prebuilt`; the build context is a folder
#   holding infera alone), as scripts/images does with buildah:
#     docker build -f docker/cli.Dockerfile --target prebuilt -t infera:dev DIR

# glibc and libgcc, no shell, no package manager.
FROM gcr.io/distroless/cc-debian12:nonroot AS runtime
LABEL org.opencontainers.image.source="https://github.com/infera/infera" \
      org.opencontainers.image.title="infera" \
      org.opencontainers.image.description="Infera command line: run a deployment on one machine, benchmark it, generate the CRDs" \
      org.opencontainers.image.licenses="Apache-2.0"
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/infera"]

FROM runtime AS prebuilt
COPY infera /usr/local/bin/infera

FROM rust:1.95-bookworm AS builder
WORKDIR /src
COPY . .
# The registry and target folders are BuildKit caches, kept between builds and absent
# from the image, so the binary is copied out in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked -p infera --bin infera \
    && cp target/release/infera /usr/local/bin/infera

FROM runtime
COPY --from=builder /usr/local/bin/infera /usr/local/bin/infera
