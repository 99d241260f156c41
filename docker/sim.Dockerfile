# syntax=docker/dockerfile:1
# Infera sim image (infera-sim).
# Two ways to build it:
# - from source (the last stage; the build context is the repository root; BuildKit,
#   the default builder since Docker 23):
#     docker build -f docker/sim.Dockerfile -t infera-sim:dev .
# - from a binary built already (stage `prebuilt`; the build context is a folder
#   holding infera-sim alone), as scripts/images does with buildah:
#     docker build -f docker/sim.Dockerfile --target prebuilt -t infera-sim:dev DIR

# glibc and libgcc, no shell, no package manager.
FROM gcr.io/distroless/cc-debian12:nonroot AS runtime
LABEL org.opencontainers.image.source="https://github.com/infera/infera" \
      org.opencontainers.image.title="infera-sim" \
      org.opencontainers.image.description="Infera sim: simulated vLLM, SGLang and ATOM engines with latencies calibrated on an H200" \
      org.opencontainers.image.licenses="Apache-2.0"
USER 65532:65532
# The OpenAI API, /health and /metrics (with --workers N, worker i on 8000+i).
EXPOSE 8000
ENTRYPOINT ["/usr/local/bin/infera-sim"]
# The simulator listens on 127.0.0.1 by default; in a container, listen on every address.
CMD ["--host", "0.0.0.0"]

FROM runtime AS prebuilt
COPY infera-sim /usr/local/bin/infera-sim

FROM rust:1.95-bookworm AS builder
WORKDIR /src
COPY . .
# The registry and target folders are BuildKit caches, kept between builds and absent
# from the image, so the binary is copied out in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked -p infera-sim --bin infera-sim \
    && cp target/release/infera-sim /usr/local/bin/infera-sim

FROM runtime
COPY --from=builder /usr/local/bin/infera-sim /usr/local/bin/infera-sim
