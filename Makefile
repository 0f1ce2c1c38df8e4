# Two commands do all the set-up on a fresh machine:
#   make demo   the app on http://127.0.0.1:7860 with the embedded tiny-shapes model (CPU is enough)
#   make test   ruff (check + format), the docs site built with --strict, and the whole test suite
#   make docs   the docs site into site/ (mkdocs-material, offline); make results: regenerate the results
#               tables of docs/results.md and reports/README.md from reports/ (after adding a race)
# GPU users: make demo TORCH="torch" (or any CUDA build) instead of the CPU wheel.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
# pytest-xdist workers, each taking whole test files (docs/development.md); `make test TEST_WORKERS=0`: one
# process
TEST_WORKERS ?= 2
BIN := $(VENV)/bin

.PHONY: demo probe test lint docs results browser bench-ui clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $@

demo: $(VENV)/.installed
	$(BIN)/python launch.py

probe: $(VENV)/.installed
	$(BIN)/jagg probe --backbone tiny-flux --window 4 --steps 12

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

results: $(VENV)/.installed
	$(BIN)/python scripts/results.py

# The browser test drives Debian's chromium through selenium; nothing is downloaded at test time.
browser:
	@if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then \
	  if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; \
	  else echo "note: install chromium and chromium-driver for the browser test"; fi; \
	fi

test: $(VENV)/.installed browser lint docs
	HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 GRADIO_ANALYTICS_ENABLED=False $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile

# The page's timing figures (ms from a control's input to the redrawn plot, from a link to its view), in headless
# Chromium: a benchmark, not a test (a busy machine slows every figure); its output is reports/app/bench-ui.json.
bench-ui: $(VENV)/.installed browser
	HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 GRADIO_ANALYTICS_ENABLED=False $(BIN)/python scripts/bench_ui.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache site
