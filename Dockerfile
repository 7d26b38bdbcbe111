# voicepipe for a GPU host. Build:  docker build -t voicepipe .
# Run:    docker run --gpus all -p 8000:8000 voicepipe
# Read-only root filesystem:  docker run --gpus all --read-only --tmpfs /tmp -v voicepipe-data:/app/data \
#           -v voicepipe-recordings:/app/recordings -p 8000:8000 voicepipe
# The default models are fetched at build time into /app/models; to reuse models fetched elsewhere,
# mount them instead:  docker run --gpus all -v $PWD/models:/app/models -p 8000:8000 voicepipe
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04

ENV DEBIAN_FRONTEND=noninteractive PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev make espeak-ng libspeexdsp1 \
    ca-certificates \
 && rm -rf /var/lib/apt/lists/*

RUN useradd --create-home --uid 1000 voicepipe
WORKDIR /app
COPY --chown=voicepipe:voicepipe . /app
USER voicepipe

# CUDA build of torch; everything else as pinned in pyproject.toml.
RUN make install models TORCH_INDEX=https://download.pytorch.org/whl/cu128
# What the server writes (paths.data_dir, paths.recordings_dir), owned by the user, so that volumes mounted there
# are too: the root filesystem can then be read-only (README, Security).
RUN mkdir -p /app/data /app/recordings

ENV VOICEPIPE_SERVER__HOST=0.0.0.0 VOICEPIPE_DEVICE__DEVICE=cuda
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s CMD python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health')"
CMD [".venv/bin/voicepipe", "serve"]
