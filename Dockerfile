# The config sidecar: API only, no CUDA. Build: docker build -t verify-tuner .
FROM python:3.12-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
# The data directory exists in the image, owned by the runtime user: a fresh named volume mounted
# there takes that ownership, so the non-root user can create the SQLite file on first start.
RUN useradd --create-home --uid 10001 tuner && mkdir -p /data && chown 10001:10001 /data
WORKDIR /app
COPY pyproject.toml README.md ./
COPY tuner ./tuner
COPY kernels ./kernels
COPY api ./api
COPY migrations ./migrations
RUN pip install --no-compile '.[server,postgres]' && rm -rf /root/.cache
USER 10001:10001
ENV TUNER_DATABASE_URL=sqlite:////data/configs.db TUNER_HOST=0.0.0.0 TUNER_PORT=8177
VOLUME ["/data"]
EXPOSE 8177
HEALTHCHECK --interval=10s --timeout=3s --retries=3 \
  CMD ["python", "-c", "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8177/readyz').status != 200)"]
CMD ["tuner", "serve"]
