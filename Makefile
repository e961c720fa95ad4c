# Meridian: `make up` runs a local federation, `make test` runs the test suite.
# Everything installs into a venv made here, so a clean clone needs nothing else.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: up test lint bench loadtest drill venv clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

venv: $(STAMP)

up: $(STAMP)
	$(VENV)/bin/meridian up

test: $(STAMP)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} $(PY) -m pytest -q -p no:cacheprovider

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(PY) benchmarks/engine_throughput.py
	$(PY) benchmarks/quota.py
	$(PY) benchmarks/usage_query.py
	$(PY) benchmarks/gateway_overhead.py

# Locust against a running `make up` (another terminal); MERIDIAN_API_KEY selects the tenant.
# The overload drill (issue 14) against a running `make up`: steady mix, 20x spike, back; writes
# .meridian/drill/drill.json and drill.png and fails unless every criterion holds.
drill: $(STAMP)
	$(PY) -m pip install --quiet -e '.[loadtest]'
	$(PY) loadtests/spike_drill.py

loadtest: $(STAMP)
	$(PY) -m pip install --quiet -e '.[loadtest]'
	$(VENV)/bin/locust -f loadtests/locustfile.py --host http://127.0.0.1:8080 --headless -u 16 -r 4 -t 60s

clean:
	rm -rf $(VENV) .meridian
