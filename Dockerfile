# vllm-sizer image: the daemon only (runtime dependencies, no test or plot extras), as a non-root user.
# Build: docker build -t vllm-sizer:0.1.0 .    Run: docker run -v ./config:/etc/vllm-sizer vllm-sizer:0.1.0 --config /etc/vllm-sizer/example.yaml

# Build stage: a virtual environment with the package and its runtime dependencies only.
FROM python:3.11-slim-bookworm AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY model ./model
COPY exporter ./exporter
# The model's compiled kernel is built here, into the venv (-P: from the installed package, not
# /src), for a generic x86-64 CPU: numba keys cached code to the CPU it was compiled for, and
# "generic" names none, so the cache serves any node (the runtime stage sets the same
# NUMBA_CPU_NAME; model/queueing/kernel/jit.py).
ENV NUMBA_CPU_NAME=generic \
    NUMBA_CACHE_DIR=/opt/vllm-sizer/kernel-cache
RUN python -m venv /opt/vllm-sizer \
    && /opt/vllm-sizer/bin/pip install --no-cache-dir . \
    && PYTHONDONTWRITEBYTECODE=1 /opt/vllm-sizer/bin/python -P -m model.calibration.warmup \
    && find /opt/vllm-sizer -name '__pycache__' -prune -exec rm -rf {} +

# Runtime stage: the same Python, the venv copied over; no compiler, no pip cache, no sources.
FROM python:3.11-slim-bookworm
# The model's compiled kernel comes built with the venv, for a generic CPU: read there (the
# user cannot write it, nor need to), so a new container's first cycle does not wait for the
# compiler on any x86-64 node.
ENV PATH=/opt/vllm-sizer/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PROMETHEUS_DISABLE_CREATED_SERIES=True \
    NUMBA_CPU_NAME=generic \
    NUMBA_CACHE_DIR=/opt/vllm-sizer/kernel-cache
COPY --from=build /opt/vllm-sizer /opt/vllm-sizer
# Numeric non-root user (distroless "nonroot" id) so Kubernetes runAsNonRoot can verify it; it owns
# only the state directory.
RUN groupadd --system --gid 65532 vllm-sizer \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin vllm-sizer \
    && mkdir -p /var/lib/vllm-sizer /etc/vllm-sizer \
    && chown 65532:65532 /var/lib/vllm-sizer
USER 65532:65532
WORKDIR /var/lib/vllm-sizer
# /metrics, /healthz, /readyz and /api/v1/predict.
EXPOSE 9464
# For `docker run` only (Kubernetes ignores HEALTHCHECK and uses the probes); python, as slim has no curl.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:9464/healthz', timeout=4).status == 200 else 1)"]
ENTRYPOINT ["vllm-sizer", "run"]
CMD ["--config", "/etc/vllm-sizer/config.yaml"]
