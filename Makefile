# Gatehouse developer entry points. `make help` lists them.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

export GATEHOUSE_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/gatehouse
export PATH := $(GATEHOUSE_CACHE)/tools/bin:/usr/local/go/bin:$(PATH)

# Packages that `go test` runs; the race detector is always on.
PKGS ?= ./...
TEST_FLAGS ?= -race -count=1 -timeout=30m

.PHONY: help
help: ## List the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

.PHONY: setup
setup: ## Install what the local cluster needs: its Debian packages, the pinned Kubernetes binaries, CoreDNS and the registry
	hack/setup.sh

.PHONY: setup-vm
setup-vm: ## `setup`, and what VM nodes need: QEMU, OVMF and the tools that build the node image
	hack/setup.sh --vm

.PHONY: setup-test
setup-test: ## `setup`, and what only the tests need: their Debian packages, the pinned Go tools, MinIO, upstream CABPK and clusterctl, the Vault server, Prometheus and promtool
	hack/setup.sh --test

.PHONY: kube-binaries
kube-binaries: ## Build the pinned Kubernetes binaries and etcd into the cache, and the previous minor version's for the upgrade test (no-op when cached)
	hack/kube-binaries.sh
	hack/kube-binaries.sh 1.35

.PHONY: tools
tools: ## Install the pinned Go tools into the cache
	hack/go-tools.sh >/dev/null

.PHONY: generate
generate: tools ## Regenerate code: api/*.proto with buf, the versions table, the CAPI provider's deepcopy, CRDs, RBAC and clusterctl repository files
	buf lint
	buf generate
	go generate ./internal/versions
	controller-gen object paths=./api/bootstrap/... crd:maxDescLen=0 paths=./api/bootstrap/... output:crd:dir=config/crd
	@# controller-gen writes no role.yaml when it finds no markers; a stale one must not survive that.
	rm -f config/rbac/role.yaml
	controller-gen rbac:roleName=gatehouse-capi-bootstrap-manager paths=./capi/controller/... output:rbac:dir=config/rbac
	go run ./hack/capicomponents

.PHONY: check-generate
check-generate: generate ## Fail when regenerating changes any generated code
	@if [[ -n "$$(git status --porcelain -- api internal/versions config/crd config/rbac config/clusterctl)" ]]; then \
		git status --porcelain -- api internal/versions config/crd config/rbac config/clusterctl; \
		git diff -- api internal/versions config/crd config/rbac config/clusterctl | head -50; \
		echo "generated code is out of date: run 'make generate' and commit the result" >&2; exit 1; fi

.PHONY: lint
lint: tools ## gofmt, go mod tidy, go vet and golangci-lint
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
		if [[ -n "$$unformatted" ]]; then echo "not gofmt-ed: $$unformatted" >&2; exit 1; fi
	go mod tidy -diff
	@# The CAPI parity module builds against this one (replace ../..): a dependency moved here moves there.
	cd test/capiparity && go mod tidy -diff
	go vet ./...
	golangci-lint run --allow-serial-runners ./...
	@# The VM tests, built only with their tags.
	go vet -tags vmnodes,vmcontrolplane ./test/vme2e/... ./test/capiboot/...
	golangci-lint run --allow-serial-runners --build-tags vmnodes,vmcontrolplane ./test/vme2e/... ./test/capiboot/...

.PHONY: stress
stress: tools ## Flake hunt: run each package's tests COUNT (20) times, with and without -race (PKGS, RUN narrow it)
	hack/stress.sh $(or $(COUNT),20) $(if $(filter ./...,$(PKGS)),,$(PKGS))

.PHONY: build
build: ## Build the binaries into bin/
	hack/build.sh

# The binaries the local cluster runs: every one but the CAPI provider's.
MINI_CMDS := gatehouse gatehouse-bootstrapper gatehouse-joinservice gatehouse-keyservice gatehouse-pause

.PHONY: build-mini
build-mini: ## Build the binaries the local cluster runs into bin/ (all but the CAPI provider's)
	hack/build.sh $(addprefix ./cmd/,$(MINI_CMDS))

.PHONY: unit
unit: tools ## Run the tests (needs `make setup-test` first)
	@# The real-boot test (test/realboot) boots the node image built from this checkout (cached by content).
	@# The end-to-end test starts its cluster at the previous minor version and upgrades it (test/e2e).
	GATEHOUSE_KUBE_BIN=$$(hack/kube-binaries.sh) GATEHOUSE_ADDON_BIN=$$(hack/addon-binaries.sh) GATEHOUSE_VAULT_BIN=$$(hack/vault-binary.sh) \
		GATEHOUSE_PROMETHEUS_BIN=$$(hack/prometheus-binary.sh) \
		$(if $(filter ./... ./test/e2e/...,$(PKGS)),GATEHOUSE_KUBE_BIN_PREVIOUS=$$(hack/kube-binaries.sh 1.35)) \
		$(if $(filter ./... ./test/realboot/...,$(PKGS)),GATEHOUSE_NODE_IMAGE=$$(hack/node-image.sh)) \
		gotestsum --format testname --format-hide-empty-pkg -- $(TEST_FLAGS) $(PKGS)
	@# The CAPI provider's parity test against upstream CABPK's renderers: a module of its own (docs/capi-parity.md).
	$(if $(filter ./...,$(PKGS)),cd test/capiparity && GATEHOUSE_KUBE_BIN=$$(../../hack/kube-binaries.sh) gotestsum --format testname --format-hide-empty-pkg -- $(TEST_FLAGS) ./...)
	$(if $(filter ./...,$(PKGS)),$(MAKE) --no-print-directory test-vm)

.PHONY: test-vm
test-vm: tools ## VM nodes in the local cluster (test/vme2e): `make unit`'s last step, one VM at a time on an otherwise idle machine
	@# Built with the vmnodes tag so that `go test ./...` leaves them to this step: VMs under TCG
	@# emulation boot in minutes on an idle machine and in tens of minutes beside the other tests.
	@# The CAPI data booted in a VM (test/capiboot) left this step for CI's budget: `make test-vm-capi`.
	GATEHOUSE_KUBE_BIN=$$(hack/kube-binaries.sh) GATEHOUSE_ADDON_BIN=$$(hack/addon-binaries.sh) GATEHOUSE_NODE_IMAGE=$$(hack/node-image.sh) \
		gotestsum --format testname -- $(TEST_FLAGS) -tags vmnodes -timeout 60m -p 1 ./test/vme2e/...

.PHONY: test-vm-capi
test-vm-capi: tools ## The Cluster API provider's data booted in a VM with real cloud-init (test/capiboot; about 4 min under TCG, not in `make test`: CI's budget)
	GATEHOUSE_KUBE_BIN=$$(hack/kube-binaries.sh) GATEHOUSE_ADDON_BIN=$$(hack/addon-binaries.sh) GATEHOUSE_NODE_IMAGE=$$(hack/node-image.sh) \
		gotestsum --format testname -- $(TEST_FLAGS) -tags vmnodes -timeout 60m -p 1 ./test/capiboot/...

.PHONY: test-vm-controlplane
test-vm-controlplane: tools ## A VM control plane: mini up --provider qemu, mini stop/start and gatehouse recover (test/vme2e, tag vmcontrolplane; about 16 min under TCG, not in `make test`)
	GATEHOUSE_KUBE_BIN=$$(hack/kube-binaries.sh) GATEHOUSE_ADDON_BIN=$$(hack/addon-binaries.sh) GATEHOUSE_NODE_IMAGE=$$(hack/node-image.sh) \
		gotestsum --format testname -- $(TEST_FLAGS) -tags vmnodes,vmcontrolplane -timeout 60m -run TestVMControlPlane ./test/vme2e/...

.PHONY: test-vm-long
test-vm-long: tools ## Every VM test, the long ones too: the VM control plane and the CAPI data pinning another CA (tag vmcontrolplane; about 40 min under TCG, not in `make test`)
	GATEHOUSE_KUBE_BIN=$$(hack/kube-binaries.sh) GATEHOUSE_ADDON_BIN=$$(hack/addon-binaries.sh) GATEHOUSE_NODE_IMAGE=$$(hack/node-image.sh) \
		gotestsum --format testname -- $(TEST_FLAGS) -tags vmnodes,vmcontrolplane -timeout 90m -p 1 ./test/vme2e/... ./test/capiboot/...

.PHONY: fuzz
fuzz: ## Run every go test -fuzz target for FUZZTIME (default 3s) each
	hack/fuzz.sh

.PHONY: test
test: setup-test check-generate lint unit fuzz ## Set up the machine for the tests, check generated code, lint, run every test with -race, fuzz briefly

.PHONY: mini-up
mini-up: setup build-mini ## Set up what the local cluster needs and start one (1 control plane + 2 workers)
	GATEHOUSE_KUBE_BIN=$$(hack/kube-binaries.sh) GATEHOUSE_ADDON_BIN=$$(hack/addon-binaries.sh) bin/gatehouse mini up

.PHONY: mini-up-vm
mini-up-vm: setup-vm build-mini ## Like mini-up, with a worker that is a VM of the node image (built first: make image)
	GATEHOUSE_KUBE_BIN=$$(hack/kube-binaries.sh) GATEHOUSE_ADDON_BIN=$$(hack/addon-binaries.sh) \
		bin/gatehouse mini up --workers 2 --vm-workers 1 --node-image $$(hack/node-image.sh)

.PHONY: mini-down
mini-down: build-mini ## Remove the local cluster and everything it made
	bin/gatehouse mini down

.PHONY: image
image: setup-vm ## Build the node image (docs/image.md) from this checkout and print its directory
	hack/node-image.sh

.PHONY: release
release: ## Build the release artifacts of VERSION (vX.Y.Z) into _output/release/VERSION, signed with RELEASE_KEY (docs/development.md, "Releases"); NODE_IMAGE=dir adds a node image, REGISTRY the images' registry (ghcr.io/gatehouse-dev)
	@[[ -n "$(VERSION)" ]] || { echo "usage: make release VERSION=vX.Y.Z RELEASE_KEY=release.key [NODE_IMAGE=dir]" >&2; exit 1; }
	@[[ -n "$(RELEASE_KEY)" ]] || { echo "RELEASE_KEY: the Ed25519 private key file (docs/install.md, \"Signed artifacts\")" >&2; exit 1; }
	@git diff --quiet HEAD || echo "warning: uncommitted changes: the release is built from the working tree, not from commit $$(git rev-parse --short HEAD)" >&2
	go run ./hack/release -version $(VERSION) -commit $$(git rev-parse HEAD) -epoch $$(git log -1 --format=%ct) \
		-key $(RELEASE_KEY) -out _output/release/$(VERSION) $(if $(NODE_IMAGE),-node-image $(NODE_IMAGE)) $(if $(REGISTRY),-registry $(REGISTRY))

.PHONY: clean
clean: ## Remove build outputs (not the caches)
	rm -rf bin/
