# rigkit: one command per job. Every target runs inside the pinned virtualenv made by `setup`.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
export PATH := $(BIN):$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
# A task a rig skips prints nothing (the recap counts it); ANSIBLE_DISPLAY_SKIPPED_HOSTS=true shows them again.
export ANSIBLE_DISPLAY_SKIPPED_HOSTS ?= false

host ?= sandbox
# Vault password for secrets (API keys, HF token): a file .vault_pass, never committed.
VAULT_ARGS := $(if $(wildcard .vault_pass),--vault-password-file .vault_pass,)
ARGS ?=
PYTEST_ARGS ?=
# make test's workers (pytest-xdist): the container tests wait on servers and rigs about half the time, so three
# keep 2 cores busy; tests/conftest.py keeps the tests that share a rig in one worker.
TEST_WORKERS ?= 3

.PHONY: help setup discover provision check verify logs remove rebuild image test lint harness hosts pin status bench bench-report tune clean gpu-bundle proofs plan observe fleet-graph

help: ## list the targets
	@grep -E '^[a-z%-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

setup: $(VENV)/.installed $(VENV)/.rigkit-path ## create the pinned virtualenv (idempotent)

$(VENV)/.installed: requirements.txt
	@$(PYTHON) -c 'import sys; v = sys.version_info[:2]; sys.exit(0 if v == (3, 11) else "rigkit needs Python 3.11 (found %d.%d): set PYTHON=python3.11" % v)'
	$(PYTHON) -m venv $(VENV)
	@echo "installing the pinned toolchain (requirements.txt) into $(VENV): a minute or two on a fresh machine"
	$(BIN)/pip install --disable-pip-version-check --progress-bar off -r requirements.txt
	touch $@

# The controller package (rigkit/) is importable from the virtualenv: bin/rigkit, the filter plugins, the tests.
$(VENV)/.rigkit-path: $(VENV)/.installed
	echo '$(CURDIR)' > "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/rigkit-repo.pth"
	touch $@

hosts: setup ## list the rigs of the inventory
	@$(BIN)/python bin/rigkit hosts

discover: setup ## write a rig's host profile from the machine: make discover host=NAME address=HOST|docker:CONTAINER [user=USER] [force=1]
	@$(if $(and $(filter command line,$(origin host)),$(address)),true,echo 'usage: make discover host=NAME address=HOST [user=USER] [force=1] [vram=MIB] [max_ctx=N] (address=docker:CONTAINER for a sandbox rig)' >&2; exit 2)
	@$(BIN)/python bin/rigkit discover '$(host)' '$(address)' $(if $(user),--user '$(user)',) $(if $(filter 1 yes true,$(force)),--force,) $(if $(vram),--vram '$(vram)',) $(if $(max_ctx),--max-ctx '$(max_ctx)',) $(if $(port),--port '$(port)',) $(ARGS)

provision: setup ## converge one rig: make provision host=NAME (default: the sandbox)
	@$(BIN)/python bin/rigkit check-host '$(host)'
	@$(BIN)/python bin/rigkit pin --first-use --host '$(host)'
	$(BIN)/ansible-playbook playbooks/provision.yml --limit '$(host)' $(VAULT_ARGS) $(ARGS)

check: setup ## drift check: check + diff, exit 2 and summarise when the rig differs from the repo: make check host=NAME
	@$(BIN)/python bin/rigkit check-host '$(host)'
	@$(BIN)/python bin/rigkit drift --limit '$(host)' -- $(VAULT_ARGS) $(ARGS)

verify: setup ## prove a provisioned rig with the rig suite (testinfra: the pinned models, the drafter loaded, acceptance): make verify host=NAME
	@$(BIN)/python bin/rigkit check-host '$(host)'
	$(if $(wildcard .vault_pass),ANSIBLE_VAULT_PASSWORD_FILE='$(CURDIR)/.vault_pass',) $(BIN)/pytest -q -p no:cacheprovider tests/rig --hosts='ansible://$(host)' --ansible-inventory=inventory/hosts.yml $(PYTEST_ARGS)

logs: setup ## the last lines of a rig's llama-server journal: make logs host=NAME [lines=N]
	@$(BIN)/python bin/rigkit check-host '$(host)'
	@$(BIN)/python bin/rigkit logs --limit '$(host)' $(if $(lines),--lines '$(lines)',) -- $(VAULT_ARGS) $(ARGS)

remove: setup ## take the kit's server off a rig (server, image, models; a sandbox rig whole): make remove host=NAME
	@$(BIN)/python bin/rigkit check-host '$(host)'
	$(BIN)/ansible-playbook playbooks/remove.yml --limit '$(host)' $(VAULT_ARGS) $(ARGS)

rebuild: setup ## wipe the rig's server, image and models, provision from scratch, compare with the lock: make rebuild host=NAME
	@$(BIN)/python bin/rigkit check-host '$(host)'
	$(BIN)/ansible-playbook playbooks/rebuild.yml --limit '$(host)' $(VAULT_ARGS) $(ARGS)

pin: setup ## pin from Hugging Face: make pin model=NAME [revision=REF] [force=1], or every unpinned model of a rig: make pin host=NAME
	@$(BIN)/python bin/rigkit pin $(if $(model),'$(model)',) $(if $(revision),--revision '$(revision)',) \
		$(if $(filter command line,$(origin host)),--host '$(host)',) $(if $(filter 1 yes true,$(force)),--force,) $(ARGS)

plan: setup ## a GPU rig's compatibility plan (image CUDA, driver, GPU, module flavour, known-good kernels, pins still in the archive, next kernel): make plan host=NAME
	@$(BIN)/python bin/rigkit check-host '$(host)'
	$(BIN)/python bin/rigkit plan --host '$(host)'

status: setup ## one table for the fleet (or host=NAME): state, model, URL, drafting [wide=1: GPU, driver, image... json=1]
	@$(BIN)/python bin/rigkit status --limit '$(if $(filter command line,$(origin host)),$(host),rigs)' $(if $(filter 1 yes true,$(json)),--json,) $(if $(filter 1 yes true,$(wide)),--wide,) $(if $(ARGS),-- $(ARGS),)

observe: setup ## the way into the fleet services: the gateway's URL and a curl that works, Prometheus, ready queries
	@$(BIN)/python bin/rigkit observe

fleet-graph: setup ## a picture of the fleet monitor's graph (draft acceptance per rig): make fleet-graph [out=PNG] [ARGS="--range 1h"]
	@$(BIN)/python bin/rigkit fleet-graph --out '$(or $(out),reports/fleet/acceptance.png)' $(ARGS)

bench: setup ## measure the drafter on a provisioned rig (off, draft length 1..N): make bench host=NAME
	@$(BIN)/python bin/rigkit check-host '$(host)'
	$(BIN)/ansible-playbook playbooks/bench.yml --limit '$(host)' $(VAULT_ARGS) $(ARGS)

bench-report: setup ## a table of past bench runs (reports/bench/): make bench-report [host=NAME]
	@$(BIN)/python bin/rigkit bench-report $(if $(filter command line,$(origin host)),--host '$(host)',) $(ARGS)

tune: setup ## set the host's draft length from its latest bench, if the gain beats the noise: make tune host=NAME
	@$(BIN)/python bin/rigkit check-host '$(host)'
	@$(BIN)/python bin/rigkit tune '$(host)' $(if $(report),--report '$(report)',) $(ARGS)

# A provision that needs the image while this builds it waits for that build: the role builds each tag once per
# build host, under a lock of its own (roles/llamacpp_image, flock).
image: setup ## build the rig's llama.cpp image on its build host ahead of a provision: make image host=NAME
	@$(BIN)/python bin/rigkit check-host '$(host)'
	$(BIN)/ansible-playbook playbooks/image.yml --limit '$(host)' $(VAULT_ARGS) $(ARGS)

harness: setup ## start the Docker engine and build the base and rig images on this machine
	$(BIN)/ansible-playbook playbooks/harness.yml

test: setup ## run every test (unit, then the container integration tests)
	$(BIN)/pytest --numprocesses=$(TEST_WORKERS) --dist=loadgroup $(PYTEST_ARGS)

lint: setup ## ansible-lint (production), yamllint, ruff, playbook syntax check, promtool on the fleet monitor's config and rules
	$(BIN)/ansible-lint
	$(BIN)/yamllint --strict .
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/ansible-playbook --syntax-check playbooks/*.yml
	@# every module's and plugin's documentation must render (ansible-doc exits non-zero on a broken one)
	$(BIN)/ansible-doc -M library $(basename $(notdir $(wildcard library/*.py))) > /dev/null
	$(BIN)/ansible-doc -t callback rigkit rigkit_results rigkit_preload > /dev/null
	@# the fleet monitor's generated configuration and alert rules through the pinned Prometheus's promtool
	$(BIN)/pytest -q -p no:cacheprovider tests/unit/test_fleet_monitor.py

gpu-bundle: setup ## .device/ for tests/gpu/run.sh on a GPU machine: verified llama.cpp source, wheels, models
	$(BIN)/python tests/gpu/make_bundle.py bundle

proofs: setup ## run every heavy proof (DKMS builds...) and write its receipt under reports/proofs/ (make test checks them)
	$(BIN)/python bin/rigkit proof $$($(BIN)/python bin/rigkit proof --list | cut -d' ' -f1 | sed 's/^proof-//')

proof-%: setup ## one heavy proof and its receipt: make proof-NAME (rigkit proof --list names them)
	$(BIN)/python bin/rigkit proof '$*'

clean: ## remove the virtualenv and caches (rigs are untouched)
	rm -rf $(VENV) .pytest_cache .ruff_cache
