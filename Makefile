# critbatch: the verbs a user types. `make help` lists them.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ARGS ?=
SCALE ?= auto
JOBS ?= auto
OPT ?= adamw,muon
# torch 2.13.0: TORCH=cpu is `pip install torch==2.13.0` from pip's own index (the CPU build on
# this project's machines), TORCH=cuda the CUDA build from TORCH_CUDA_INDEX, TORCH_INDEX=<wheel
# index url> any other build; left unset, the build .venv holds stays. TORCH_FILE records the
# pip arguments torch was installed with, so a change of TORCH reinstalls it.
TORCH ?=
TORCH_CUDA_INDEX ?= https://download.pytorch.org/whl/cu126
TORCH_INDEX ?= $(if $(filter cuda,$(TORCH)),$(TORCH_CUDA_INDEX))
TORCH_FILE := $(VENV)/.torch
TORCH_HAVE := $(shell cat $(TORCH_FILE) 2>/dev/null || { test -x $(PY) && echo torch==2.13.0; })
TORCH_ASKED := torch==2.13.0$(if $(TORCH_INDEX), --index-url $(TORCH_INDEX))
TORCH_PIP := $(if $(TORCH)$(TORCH_INDEX),$(TORCH_ASKED),$(or $(TORCH_HAVE),torch==2.13.0))
$(if $(filter-out cpu cuda,$(TORCH)),$(error TORCH=$(TORCH) is not cpu or cuda (or give TORCH_INDEX=<wheel index url>)))

# Python's bytecode is compiled as each module is first imported, and kept (in .venv/ and in
# the __pycache__ folders git ignores) even where the environment sets PYTHONDONTWRITEBYTECODE:
# the install compiles nothing ahead (compiling every installed module took 22 s of its 43
# here), and of the hundreds of processes a sweep or the tests start, the first to import a
# module compiles it for the rest
unexport PYTHONDONTWRITEBYTECODE

.DEFAULT_GOAL := help
.PHONY: help install slurm test test-fast test-studies test-all lint format train sweep-batch sweep-widths sweep-branches sweep-stability \
        sweep-schedules sweep-local-cbs report recommend recommend-coverage coverage peers docs-results \
        wandb-sync clean data

help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-16s %s\n", $$1, $$2}'

install: $(STAMP) ## create .venv/ with torch (CPU build; TORCH=cuda: the CUDA build) and critbatch[dev,hub]; fast when done

ifneq ($(TORCH_PIP),$(TORCH_HAVE))
$(STAMP): FORCE
endif
$(STAMP): pyproject.toml
	@echo "critbatch: installing into $(VENV)/ (once; about a minute on a fast mirror): PyTorch 2.13 ($(TORCH_PIP)), then critbatch and its dependencies; $(VENV)/ ends near 1.7 GB"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
ifneq ($(TORCH_HAVE),)
ifneq ($(TORCH_PIP),$(TORCH_HAVE))
	@echo "torch: replacing the build of '$(TORCH_HAVE)' with '$(TORCH_PIP)'"
	$(PY) -m pip uninstall --quiet --yes torch
endif
endif
	$(PY) -m pip install --quiet --disable-pip-version-check --no-compile $(TORCH_PIP)
	@echo "critbatch: PyTorch installed; now critbatch, numpy, scipy, hydra, wandb, matplotlib, pytest ..."
	@# by uv where it installs (the same packages in ~20 s where pip took ~70 s), else by pip
	$(PY) -m pip install --quiet --disable-pip-version-check uv \
	  && $(PY) -m uv pip install --quiet --python $(PY) -e '.[dev,hub]' \
	  || $(PY) -m pip install --quiet --disable-pip-version-check --no-compile -e '.[dev,hub]'
	@echo '$(TORCH_PIP)' > $(TORCH_FILE)
	@touch $(STAMP)
	@echo "critbatch: installed; $(VENV)/ holds $$(du -sh $(VENV) 2>/dev/null | cut -f1)"

.PHONY: FORCE
FORCE:

TEST_JOBS ?= auto  # pytest workers (pytest-xdist): one per core; TEST_JOBS=0 runs them in one process
# worksteal: a worker that runs out of tests takes half of another's queue, so the suite does not
# end on one worker running out a queue of minute-long sweeps

test: install slurm ## every test but the Monte Carlo studies (end-to-end runs and a real SLURM included), one worker per core
	$(PY) -m pytest -q --durations=15 -m "not study" -n $(TEST_JOBS) --dist worksteal

# the Monte Carlo studies: each measures an interval's coverage or a verdict's error rate over
# tens of planted worlds (docs/science.md states their rates); CI runs them after `make test`
test-studies: install ## the Monte Carlo studies of coverage and error rates on planted worlds
	$(PY) -m pytest -q --durations=10 -m study -n $(TEST_JOBS) --dist worksteal

test-all: test test-studies ## every test: `make test`, then the Monte Carlo studies

SLURM_PKGS := slurm-wlm munge
# the real-SLURM tests (tests/test_slurm_real.py) start their own munged, slurmctld and slurmd
slurm: ## install Debian's SLURM for the real-SLURM tests where it is missing (root, apt-get)
	@if PATH="$$PATH:/usr/sbin:/sbin" command -v slurmctld >/dev/null && command -v sbatch >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "critbatch: installing SLURM for its tests ($(SLURM_PKGS), about 10 s)"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -q --no-install-recommends $(SLURM_PKGS) >/dev/null 2>&1 \
	  || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends $(SLURM_PKGS) >/dev/null; } \
	  || echo "critbatch: warning: SLURM did not install; the real-SLURM tests will skip"; \
	else echo "critbatch: no SLURM here and no apt-get as root: the real-SLURM tests will skip"; fi

test-fast: install ## the tests not marked slow (none over a few seconds), one worker per core
	$(PY) -m pytest -q -m "not slow" -n $(TEST_JOBS) --dist worksteal

lint: install ## ruff check
	$(VENV)/bin/ruff check src tests analysis sweeps

format: install ## ruff format and fix imports
	$(VENV)/bin/ruff check --fix src tests analysis
	$(VENV)/bin/ruff format src tests analysis

train: install ## one training run; Hydra overrides via ARGS="scale=smoke optim=muon"
	$(PY) -m critbatch.train $(ARGS)

data: install ## token cache of DATA=fineweb_edu (tinystories, hub), built once online; then training runs offline [ARGS=]
	@test -n "$(DATA)" || { echo "make data needs DATA=<name>, e.g. make data DATA=fineweb_edu" >&2; exit 2; }
	$(PY) -m critbatch.data prepare $(DATA) $(ARGS)

.PHONY: noise bench gpu-check
noise: install ## B_noise at a run's checkpoint: RUN=<run dir> [ARGS="-K 128 -b 4 --seed 0"]
	@test -n "$(RUN)" || { echo "make noise needs RUN=<run directory>, e.g. make noise RUN=runs/single/<time>" >&2; exit 2; }
	$(PY) -m critbatch.noise $(RUN) $(ARGS)

bench: install ## throughput, MFU, trainer overhead: table + bench.json (<5 min on CPU) [ARGS="--only gns"]
	$(PY) -m critbatch.bench $(ARGS)

gpu-check: install ## on a GPU: every width compiled, MFU, memory, packing, a smoke sweep, PASS/FAIL (<5 min; one line without CUDA)
	$(PY) -m critbatch.bench.gpu_check $(ARGS)

sweep-batch: install ## the critical-batch experiment: baseline + batch sweeps, B_noise, report [SCALE= JOBS= OPT= DRY=1]
	$(PY) -m critbatch.sweep batch --scale $(SCALE) --jobs $(JOBS) --opt $(OPT) $(if $(DRY),--dry-run) $(ARGS)

sweep-widths: install ## Kaplan's B_crit(L) law: every width's baseline + batch grid, report [SCALE= JOBS= OPT= DRY=1]
	$(PY) -m critbatch.sweep widths --scale $(SCALE) --jobs $(JOBS) --opt $(OPT) $(if $(DRY),--dry-run) $(ARGS)

sweep-branches: install ## is a cooldown branch as good as a separate (wsd, cosine) run? after sweep-batch [SCALE= JOBS= OPT= DRY=1]
	$(PY) -m critbatch.sweep branches --scale $(SCALE) --jobs $(JOBS) --opt $(OPT) $(if $(DRY),--dry-run) $(ARGS)

sweep-stability: install ## small batches: 1-256 at the lr tuned at 64, accumulation check, report [SCALE= JOBS= OPT= DRY=1]
	$(PY) -m critbatch.sweep stability --scale $(SCALE) --jobs $(JOBS) --opt $(OPT) $(if $(DRY),--dry-run) $(ARGS)

sweep-schedules: install ## batch schedules at equal tokens: constant small/large, ramp, adaptive, measured (after sweep-local-cbs, run first if missing) [SCALE= JOBS= OPT= DRY=1]
	$(PY) -m critbatch.sweep schedules --scale $(SCALE) --jobs $(JOBS) --opt $(OPT) $(if $(DRY),--dry-run) $(ARGS)

sweep-local-cbs: install ## local critical batch by branched training: a base run per optimizer and lr rule, branches at 1-16x its batch, again at replicate seeds [SCALE= JOBS= OPT= DRY=1]
	$(PY) -m critbatch.sweep local_cbs --scale $(SCALE) --jobs $(JOBS) --opt $(OPT) $(if $(DRY),--dry-run) $(ARGS)

report: install ## re-run the analyses of every sweep under runs/ (no training)
	$(PY) -m critbatch.sweep report

comma := ,
recommend: install ## batch and lr for a bigger run from your sweep, or PEERS=steplaw from a public grid [RUNS= WIDTH=|PARAMS= TOKENS= OPT= OVERHEAD=|TOLERANCE= TARGET_LOSS= JSON= OUT= VALIDATE=1 PEERS= PEERS_DIR=]
	CRITBATCH_VIA_MAKE=recommend $(PY) analysis/recommend.py $(RUNS) $(if $(WIDTH),--width $(WIDTH)) \
	  $(if $(PARAMS),--params $(PARAMS)) $(if $(TOKENS),--tokens $(TOKENS)) \
	  $(if $(findstring $(comma),$(OPT)),,--optimizer $(OPT)) $(if $(OVERHEAD),--overhead $(OVERHEAD)) \
	  $(if $(TOLERANCE),--tolerance $(TOLERANCE)) $(if $(TARGET_LOSS),--target-loss $(TARGET_LOSS)) \
	  $(if $(JSON),--json $(JSON)) $(if $(OUT),--out $(OUT)) $(if $(VALIDATE),--validate) \
	  $(if $(PEERS),--peers $(PEERS)) $(if $(PEERS_DIR),--peers-dir $(PEERS_DIR)) $(ARGS)

coverage: install ## do the joint model's 95% intervals and verdict keep their level? WORLDS= planted sweeps of each kind (KINDS=) fitted as fit_bcrit does (default 20 a kind; 200 a kind took 27 min on 2 cores) [OUT= ARGS=]
	$(PY) -m critbatch.bench.coverage $(if $(WORLDS),--worlds $(WORLDS)) $(if $(KINDS),--kinds "$(KINDS)") $(if $(OUT),--out $(OUT)) $(ARGS)

recommend-coverage: install ## how often the answer's 95% intervals hold the planted answer, over WORLDS= planted sweeps (default 50; 3.5 min on 2 cores) [OUT= ARGS=]
	$(PY) -m critbatch.analysis.recommend.coverage --worlds $(or $(WORLDS),50) $(if $(OUT),--out $(OUT)) $(ARGS)

peers: install ## public sweeps (Step Law, Zhang et al.) from their own files: report, JSON and figures in OUT= (default runs/peers) [PEERS_DIR= OUT= ARGS=]
	$(PY) -m critbatch.peers.cli $(if $(PEERS_DIR),--peers-dir $(PEERS_DIR)) $(if $(OUT),--out $(OUT)) $(ARGS)

docs-results: install ## rewrite the tracked results page docs/results/peers.md (and runs/peers) from the public sweeps' files [PEERS_DIR=]
	$(PY) -m critbatch.peers.cli $(if $(PEERS_DIR),--peers-dir $(PEERS_DIR)) --docs docs/results/peers.md

wandb-sync: install ## upload the offline W&B runs not uploaded yet, under ., runs/ and DIRS="<report folders elsewhere>" (after `wandb login`)
	@$(PY) -m critbatch.wandb_sync $(DIRS)

clean: ## remove the venv and caches (keeps runs/)
	rm -rf $(VENV) .pytest_cache .ruff_cache src/*.egg-info
