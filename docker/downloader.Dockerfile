# syntax=docker/dockerfile:1
# Infera model downloader image (infera-downloader): Python with huggingface_hub baked in,
# for the model download Jobs of simulated engines (vendor engine images download with
# their own). Pods in a cluster without PyPI access install nothing at run time.
# Two ways to build it:
# - from source (the last stage: pip installs the pinned packages; the build context is
#   the repository root; BuildKit):
#     docker build -f docker/downloader.Dockerfile -t infera-downloader:dev .
# - from packages installed already (stage `prebuilt`; the build context is a folder
#   holding `site-packages`, installed for the base's Python version with
#   `pip install --target`), as scripts/images does with buildah:
#     docker build -f docker/downloader.Dockerfile --target prebuilt -t infera-downloader:dev DIR

FROM python:3.12-slim AS runtime
LABEL org.opencontainers.image.source="https://github.com/infera/infera" \
      org.opencontainers.image.title="infera-downloader" \
      org.opencontainers.image.description="Infera model downloader: huggingface_hub for the model download Jobs" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONPATH=/opt/infera-downloader/site-packages \
    PYTHONDONTWRITEBYTECODE=1 \
    HF_HUB_DISABLE_TELEMETRY=1
# distroless's nonroot: the Job's fsGroup makes the model volume its group's.
USER 65532:65532
ENTRYPOINT ["python3"]

FROM runtime AS prebuilt
COPY site-packages /opt/infera-downloader/site-packages

FROM python:3.12-slim AS builder
# The version scripts/images installs for the prebuilt stage too.
ARG HF_HUB_VERSION=2.4.0
RUN pip install --no-cache-dir --target /opt/infera-downloader/site-packages "huggingface_hub==${HF_HUB_VERSION}"

FROM runtime
COPY --from=builder /opt/infera-downloader/site-packages /opt/infera-downloader/site-packages
