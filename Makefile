# Two commands:  make lab   (start the course)   make test   (run every check)
# Override the torch build for other machines, with PyTorch's index for it, e.g.
#   PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cu126 make lab TORCH="torch==2.13.0+cu126"
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
LAB_PORT ?= 8888
# Chapter 07 runs torchtitan's expert-parallel MoE beside the course's. Installed without its dependencies
# (datasets, wandb, ...: ~60 packages): its MoE needs only torch and spmd_types (14 MB in all; spmd_types at the version torchtitan 0.3.0 declares).
TORCHTITAN ?= torchtitan==0.3.0 spmd_types==0.2.3
PYTEST_ARGS ?=
# Three test workers on two cores: much of a test is waiting (a kernel starting, ranks
# meeting, a browser drawing). Each file stays on one worker (loadfile): module fixtures
# are built once, and the browser suite shares one JupyterLab. (So the papermill runs are three files, one per folder:
# in one file they queued on one worker.) Serially:  make test XDIST=
XDIST ?= -n 3 --dist loadfile --durations=25

.PHONY: lab test lint install install-test browser-deps notebooks bench clean determinism exit-race gpu-check grade

$(PY):
	$(PYTHON) -m venv $(VENV)

# The torch pin is installed first and passed again as a constraint, so the
# package's own range (torch>=2.4,<3) can never pull a different (CUDA) build.
$(VENV)/.installed: pyproject.toml | $(PY)
	$(PIP) install --quiet "$(TORCH)"
	echo "$(TORCH)" > $(VENV)/torch-pin.txt
	$(PIP) install --quiet -c $(VENV)/torch-pin.txt -e .
	$(PIP) install --quiet --no-deps $(TORCHTITAN)
	touch $@

# The test extra in the same pip run as the package (one resolution, one editable build): what a fresh
# clone's make test installs. It satisfies `install` too. (Not --no-compile: it saves 18 s of torch's install, but
# where PYTHONDONTWRITEBYTECODE is set, as on the course's CI machines, nothing is ever compiled after it, and every
# rank, kernel and torchrun of the suite then compiled torch again: make test took 837 s instead of ~600.)
$(VENV)/.installed-test: pyproject.toml | $(PY)
	$(PIP) install --quiet "$(TORCH)"
	echo "$(TORCH)" > $(VENV)/torch-pin.txt
	$(PIP) install --quiet -c $(VENV)/torch-pin.txt -e ".[test]"
	$(PIP) install --quiet --no-deps $(TORCHTITAN)
	touch $(VENV)/.installed $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

lab: install
	$(VENV)/bin/jupyter lab --ServerApp.ip=127.0.0.1 --ServerApp.port=$(LAB_PORT) \
		--ServerApp.root_dir="$(CURDIR)" $(if $(filter 0,$(shell id -u)),--allow-root,) \
		$(LAB_ARGS) notebooks/00_welcome.ipynb

# Grade an exercise from a terminal: make grade NB=exercises/01_ring_allreduce.ipynb (it runs a copy; the file is
# never changed). The same as .venv/bin/coursekit grade NB: install puts the command in .venv/bin, which is on the
# PATH only in a shell that ran `source .venv/bin/activate`. GRADE_ARGS go to it too (--timeout 120).
grade: install
	@test -n "$(NB)" || { echo "say which notebook: make grade NB=exercises/01_ring_allreduce.ipynb"; exit 2; }
	$(VENV)/bin/coursekit grade "$(NB)" $(GRADE_ARGS)

# Chromium for the browser tests (Debian package; Playwright's own download is not used).
browser-deps:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
		echo "Installing Chromium for the browser tests (apt-get)..."; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null; }

# The code's shape: pyflakes' checks (pyproject.toml [tool.ruff]); the architecture (no import cycles, no private
# names across modules, the layering) is tests/test_architecture.py, part of the pytest run.
lint: install-test
	$(VENV)/bin/ruff check --no-cache coursekit tests tools/*.py

# One pytest run: the library's tests, papermill, the browser suite. The papermill run of a notebook also
# compares its cells tagged nbval-check-output with the committed outputs, as nbval does (tests/notebook_support.py):
# a second run of every chapter by nbval cost ~150 s of the two cores for outputs this run prints anyway.
test: install-test browser-deps lint
	$(PY) -m pytest $(XDIST) $(PYTEST_ARGS) tests

# On a machine with >= 2 GPUs: the collectives and every chapter's core (through the capstone) under NCCL
# (tools/gpu_check.py, about 2 minutes); without GPUs it prints "skipped: no GPU" and exits 0.
gpu-check: install
	$(PY) tools/gpu_check.py

# Every committed attempt graded 20 times beside two CPU hogs: one score and one feedback each (long: not in make test).
determinism: install-test
	$(PY) -m pytest -m determinism -q tests/test_grading_determinism.py

# Spawned ranks that train, destroy the group and exit at once, checked for SIGABRT (tests/test_parallel_data_exit.py:
# PyTorch's gloo work can need the GIL on gloo's thread while the interpreter shuts down; DDP aborts there too).
exit-race: install-test
	$(PY) -m pytest -m exit_race -q tests/test_parallel_data_exit.py

# Re-execute every notebook in place with its default parameters (what gets committed).
notebooks: install-test
	$(PY) tools/execute_notebooks.py

bench: install
	$(PY) -m coursekit.bench launch

clean:
	rm -rf $(VENV) test-artifacts
