# shadow-operator — developer entry points. `make help` lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV ?= .venv
PY := $(VENV)/bin/python
CACHE ?= $(or $(SHADOW_CACHE),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/shadow-operator)
TOOLS_BIN := $(CACHE)/bin
export SHADOW_CACHE := $(CACHE)
export PATH := $(TOOLS_BIN):$(PATH)
PYTEST_ARGS ?=
# make test and make unit run on every core, a test module per worker (each worker starts its own control plane
# for the integration tier; nothing else may be shared). PYTEST_WORKERS=0 runs them in this process, in turn.
PYTEST_WORKERS ?= auto
PYTEST_PARALLEL := $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile)

.PHONY: help dev tools snapshot-tools snapshot-test test unit integration lint fmt crds cluster-up cluster-down images kind-up kind-down e2e e2e-argocd conformance upgrade-check demo release clean

help: ## list targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

# The egress gateway runs mitmproxy, which pins its dependencies tightly: it gets a virtualenv of its own (as it
# gets an image of its own, images/egress-gateway), and its tests start it from there.
EGRESS_VENV ?= .venv-egress
$(EGRESS_VENV)/.installed: pyproject.toml images/egress-gateway/requirements.txt
	@test -x $(EGRESS_VENV)/bin/python || python3 -m venv $(EGRESS_VENV)
	$(EGRESS_VENV)/bin/python -m pip install -q -U pip
	$(EGRESS_VENV)/bin/python -m pip install -q -r images/egress-gateway/requirements.txt
	$(EGRESS_VENV)/bin/python -m pip install -q --no-deps -e .
	@touch $@

$(VENV)/.installed: pyproject.toml sandbox-runtime/pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q -e '.[operator,dev]' -e './sandbox-runtime[dev]'
	@touch $@

dev: $(VENV)/.installed $(EGRESS_VENV)/.installed ## create .venv with the operator, the runtime and dev tools (and .venv-egress: the egress gateway)

tools: ## build the pinned tools (etcd, kube-apiserver, controllers, kwok, helm, gitea, csi-sanity) into ~/.cache/shadow-operator
	hack/build-tools.sh

snapshot-tools: ## build snapshot-controller, csi-snapshotter, csi-provisioner (cold: 15-35 min on 2 cores; warm: a no-op)
	hack/build-tools.sh snapshots

test: dev tools ## unit + integration tests on every core (PYTEST_WORKERS=0: one process); fails if integration tests are skipped or missing
	SHADOW_REQUIRE_INTEGRATION=1 $(PY) -m pytest -m "unit or integration" $(PYTEST_PARALLEL) $(PYTEST_ARGS)

unit: dev ## unit tests only (no cluster)
	$(PY) -m pytest -m unit $(PYTEST_PARALLEL) $(PYTEST_ARGS)

integration: dev tools ## integration tests against a local control plane
	SHADOW_REQUIRE_INTEGRATION=1 $(PY) -m pytest -m integration $(PYTEST_PARALLEL) $(PYTEST_ARGS)

snapshot-test: dev tools snapshot-tools ## the CSI snapshot stack (snapshot-controller, csi-provisioner, csi-snapshotter, our driver) on a local control plane
	$(PY) -m pytest -m storage $(PYTEST_ARGS)

lint: dev ## ruff, mypy and the import-linter layering contract
	$(VENV)/bin/ruff check operator sandbox-runtime tests hack
	$(VENV)/bin/ruff format --check operator sandbox-runtime tests hack
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

fmt: dev ## format and autofix
	$(VENV)/bin/ruff format operator sandbox-runtime tests hack
	$(VENV)/bin/ruff check --fix operator sandbox-runtime tests hack

crds: dev ## regenerate crds/ and the chart's CRDs from the pydantic models
	$(PY) -m shadow_operator.api.crdgen --out crds --out charts/shadow-operator/crds

cluster-up: dev tools ## start a local control plane (etcd, apiserver, controllers, kwok fake nodes) in the background
	@$(PY) -m tests.support.controlplane up --dir $(CACHE)/cluster

cluster-down: dev ## stop the local control plane and every process it started
	@$(PY) -m tests.support.controlplane down --dir $(CACHE)/cluster

images: ## build every container image offline (cached) and push them to the local registry
	hack/images.sh

kind-up: images ## create (or reuse) the kind cluster `shadow` from hack/kind/config.yaml
	hack/kind/cluster.sh up

kind-down: ## delete the kind cluster
	hack/kind/cluster.sh down

e2e: dev ## dockerd, images, kind cluster, helm install, then the e2e tests on real pods (E2E_WORKERS=2 processes; 0: one)
	hack/e2e.sh

e2e-argocd: dev ## a real ArgoCD (built offline) installs the chart and a team's environments from git on the kind cluster, then its tests; not part of make e2e
	hack/kind/argocd.sh

conformance: dev ## upstream agent-sandbox's own e2e suite (pinned commit, Go) against the kind cluster with the operator installed (make e2e first); not part of make e2e or CI
	hack/upstream-e2e.sh $(CONFORMANCE_ARGS)

upgrade-check: dev ## upgrade an earlier version on the kind cluster to this checkout, nothing lost (FROM=git ref, default the newest v* tag)
	hack/upgrade-check.sh $(if $(FROM),--from $(FROM)) --replace

release: dev ## a release: images, chart (OCI), wheels, sdists, SHA256SUMS in dist/ (VERSION=1.2.0 REGISTRY=ghcr.io/org)
	@test -n "$(VERSION)" -a -n "$(REGISTRY)" || { echo "usage: make release VERSION=1.2.0 REGISTRY=ghcr.io/my-org [RELEASE_ARGS=--skip-push]" >&2; exit 2; }
	hack/release.sh "$(VERSION)" "$(REGISTRY)" $(RELEASE_ARGS)

demo: dev ## from a fresh machine to a sandbox running a command and serving a preview, on kind
	hack/demo.sh
