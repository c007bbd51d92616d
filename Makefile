# Two commands matter: `make run` (offline demo) and `make test` (the whole suite).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-loaded lint types check bench backtest clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/marketwake demo

# compileall: bytecode even where PYTHONDONTWRITEBYTECODE is set; the suite starts the
# CLI and sandbox workers as subprocesses, each of which would compile every module.
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m compileall -q daemon feeds hooks_runtime >/dev/null
	$(BIN)/python -m pytest -q

# The suite beside four busy processes: timing assumptions a loaded CI runner breaks.
test-loaded: $(STAMP)
	$(BIN)/python bench/loaded_tests.py

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

types: $(STAMP)
	$(BIN)/mypy

# Benchmarks print figures and a same-run baseline; they are not tests.
bench: $(STAMP)
	$(BIN)/python bench/bus_bench.py
	$(BIN)/python bench/hooks_bench.py
	$(BIN)/python bench/pipeline_bench.py
	$(BIN)/python bench/rag_bench.py
	$(BIN)/python bench/audit_bench.py
	$(BIN)/python bench/trading_bench.py

# The example agent over a year of real BTCUSDT 5m candles when ../shared is beside
# the checkout, else over 30 days of generated (synthetic) 5m candles.
REAL_5M := ../shared/data/normalized/binance_spot_BTCUSDT_5m.csv.gz
backtest: $(STAMP)
	@if [ -f $(REAL_5M) ]; then data=$(REAL_5M)=BTCUSDT:5m; else \
	  data=build/synthetic-5m.csv; mkdir -p build; \
	  $(BIN)/python -m feeds.synthetic $$data --timeframe 5m --n 8640; fi; \
	$(BIN)/marketwake backtest --agent agents/example --data $$data --timeframe 5m --out backtest-out

clean:
	rm -rf $(VENV) build *.egg-info
