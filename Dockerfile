# syntax=docker/dockerfile:1
# One image for the five GPUYARD services; the first argument picks one:
#   docker run gpuyard:dev submit      → python -m gpuyard.services.submit
# (scheduler, executor, serving, monitor likewise; any other command runs as given).

# The executor's start helper (services/executor/replica_start.c), built where there is a C compiler: the
# image below has none (without the helper its reaper forks each replica: docs/executor.md).
FROM python:3.11 AS start-helper
COPY services/executor/replica_start.c services/executor/start_helper.py /build/
RUN python /build/start_helper.py /build/bin

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN groupadd --system --gid 10001 gpuyard \
 && useradd --system --uid 10001 --gid gpuyard --home-dir /var/lib/gpuyard --create-home \
        --shell /usr/sbin/nologin gpuyard

WORKDIR /opt/gpuyard
# The extras installed: `platform` (what the services run on) and `serving` (ONNX Runtime on the CPU); GPU
# nodes build with --build-arg EXTRAS=platform,gpu (the CUDA build instead, never both).
ARG EXTRAS=platform,serving
# Dependencies first (cached while only the code changes), then the code.
COPY pyproject.toml setup.py README.md ./
RUN mkdir -p gpuyard shared services && touch gpuyard/__init__.py shared/__init__.py services/__init__.py \
 && pip install ".[${EXTRAS}]" && pip uninstall --yes gpuyard && rm -rf gpuyard shared services build
COPY gpuyard ./gpuyard
COPY shared ./shared
COPY services ./services
RUN pip install --no-deps . && rm -rf build
COPY --from=start-helper /build/bin/ /usr/local/lib/python3.11/site-packages/gpuyard/services/executor/bin/
COPY --chmod=755 deploy/docker/entrypoint.sh /usr/local/bin/gpuyard-entrypoint

USER 10001:10001
ENV GPUYARD_DATA_DIR=/var/lib/gpuyard \
    GPUYARD_HEALTH_HOST=0.0.0.0 \
    GPUYARD_HEALTH_PORT=8090
WORKDIR /var/lib/gpuyard
# submit API, serving API, health of every service, monitor's Prometheus metrics
EXPOSE 8080 8000 8090 9400 9410
ENTRYPOINT ["gpuyard-entrypoint"]
