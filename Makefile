# Trellis — kubebuilder-style targets. `make help` lists them.

# VERSION is Trellis's own (TRELLIS_VERSION of hack/versions.env, read below).
VERSION ?= $(TRELLIS_VERSION)
IMG ?= ghcr.io/trellis-net/trellis:$(VERSION)
# K8S_VERSION, ETCD_VERSION ... come from hack/versions.env, the one place that names them;
# as in the hack/ scripts, a non-empty value from the environment or the command line wins.
define version_from_file # KEY=value
$(firstword $(subst =, ,$(1))) := $(or $($(firstword $(subst =, ,$(1)))),$(lastword $(subst =, ,$(1))))
endef
$(foreach kv,$(shell grep -E '^[A-Z][A-Z0-9_]*=' hack/versions.env),$(eval $(call version_from_file,$(kv))))
# Caches live outside the repository so a warm machine (and CI on it) is fast.
TRELLIS_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/trellis
export TRELLIS_CACHE
KUBEBUILDER_ASSETS ?= $(TRELLIS_CACHE)/k8s/$(K8S_VERSION)
export KUBEBUILDER_ASSETS
KUBECTL ?= kubectl
# Every Go build the targets run — vet, the tests, the binaries the tests build, the local
# cluster's images — is without cgo, as the release binaries are: one configuration, so
# each package is compiled once for all of them (a fresh machine's make test compiles the
# dependencies once, not once per configuration), and the tests run what ships.
export CGO_ENABLED ?= 0
GO_TEST_FLAGS ?= -count=1 -timeout=30m
# The e2e package's cluster suites (TestXCluster: a shared local cluster each) run
# E2E_PARALLEL at a time.
E2E_TIMEOUT ?= 60m
E2E_PARALLEL ?= 2
# The e2e suite's go test -json events, which RUN_E2E keeps for `gotestsum tool slowest`.
E2E_JSON ?= $(TRELLIS_CACHE)/e2e-results/last.json
# RUN_E2E runs the e2e suite (in the test module) through gotestsum (hack/build-gotestsum.sh): a line per package
# and the whole output of each failed test, then, pass or fail, the tests and subtests
# that took 20 s or more, slowest first (what CI's time goes to).
RUN_E2E = gts=$$(hack/build-gotestsum.sh) || exit 1; mkdir -p $(dir $(E2E_JSON)); \
	cd test && "$$gts/gotestsum" --format pkgname-and-test-fails --format-icons text --jsonfile $(E2E_JSON) -- \
		-tags e2e -count=1 -parallel=$(E2E_PARALLEL) -timeout=$(E2E_TIMEOUT) ./e2e/...; rc=$$?; \
	echo "e2e tests and subtests of 20 s or more:"; "$$gts/gotestsum" tool slowest --jsonfile $(E2E_JSON) --threshold 20s; \
	exit $$rc
# The fuzz runs of make test, as counts of inputs (about 10 s each on 2 CPUs), not durations:
# with a -fuzztime duration Go 1.26's fuzz coordinator can fail a target with "context
# deadline exceeded" at the deadline when a worker is mid-input (golang/go#75804, fixed in
# Go 1.27) — FuzzIPBlockApply, ~0.05 s an input (it applies to a kernel), hit it. It
# minimizes a new input for 10 runs instead of go's 60 s for the same reason.
FUZZ_PARSE_EXECS ?= 300000x
FUZZ_IPBLOCK_EXECS ?= 200x
LDFLAGS := -X github.com/trellis-net/trellis/internal/version.Version=$(VERSION)
CONTROLLER_GEN := go tool controller-gen

.PHONY: all
all: build

##@ General

.PHONY: help
help: ## Show the targets.
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  %-20s %s\n", $$1, $$2 } /^##@/ { printf "\n%s\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Development

# The ClusterNetworkPolicy CRD (policy.networking.k8s.io) is not ours: it is copied as
# released from the sigs.k8s.io/network-policy-api module go.mod names, one file per
# channel. config/crd installs the standard channel; the experimental one is the component
# config/crd/network-policy-api/experimental (config/experimental). Bump the module in
# go.mod and `make manifests` brings the new CRDs.
NPAPI_MODULE := sigs.k8s.io/network-policy-api
NPAPI_CRD := policy.networking.k8s.io_clusternetworkpolicies.yaml
NPAPI_DIR := config/crd/network-policy-api

.PHONY: manifests
manifests: ## Generate CRDs and the operator's ClusterRole/Role from the markers; copy the ClusterNetworkPolicy CRDs from the network-policy-api module.
	$(CONTROLLER_GEN) rbac:roleName=trellis-operator crd paths=./... output:crd:artifacts:config=config/crd/bases output:rbac:artifacts:config=config/rbac
	@go mod download $(NPAPI_MODULE) || exit 1; \
	src=$$(go list -m -f '{{.Dir}}' $(NPAPI_MODULE)); \
	test -n "$$src" || { echo "go list -m $(NPAPI_MODULE) gives no module directory"; exit 1; }; \
	for ch in standard experimental; do \
		install -D -m 0644 "$$src/config/crd/$$ch/$(NPAPI_CRD)" "$(NPAPI_DIR)/$$ch/$(NPAPI_CRD)" || exit 1; \
	done
	@# The image tag config/default installs: the version, from its one place.
	@sed -i -E 's/^(  newTag: ).*/\1$(VERSION)/' config/manager/kustomization.yaml

.PHONY: generate
generate: ## Generate DeepCopy methods.
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./api/...

.PHONY: fmt
fmt: ## go fmt (both modules).
	go fmt ./... && go -C test fmt ./...

.PHONY: vet
vet: ## go vet (both modules, and the e2e and conformance build tags).
	go vet ./... && go -C test vet ./... && go -C test vet -tags e2e ./e2e/ && go -C test vet -tags conformance ./conformance/

.PHONY: lint
lint: lint-cli-portable ## golangci-lint with .golangci.yml (GOLANGCI_LINT_VERSION, built into $(TRELLIS_CACHE) by hack/build-golangci-lint.sh); kubectl-trellis builds for darwin and windows (make lint-cli-portable).
	bin=$$(hack/build-golangci-lint.sh) && "$$bin/golangci-lint" run ./... && (cd test && "$$bin/golangci-lint" run --config ../.golangci.yml ./...)

# kubectl-trellis is shipped for darwin and windows too (make dist-cli): nothing it links may
# need Linux (issue #38; .golangci.yml's depguard rule "portable" names what it may not import).
CLI_PORTABLE_GOOS ?= darwin windows
.PHONY: lint-cli-portable
lint-cli-portable: ## Build kubectl-trellis for darwin and windows (amd64), as make dist-cli ships it; fails naming each GOOS it does not build for.
	@failed=; for os in $(CLI_PORTABLE_GOOS); do \
		echo "GOOS=$$os GOARCH=amd64 go build ./cmd/kubectl-trellis"; \
		CGO_ENABLED=0 GOOS=$$os GOARCH=amd64 go build -o /dev/null ./cmd/kubectl-trellis || failed="$$failed $$os"; \
	done; \
	[ -z "$$failed" ] || { echo "lint-cli-portable: kubectl-trellis does not build for$$failed" >&2; exit 1; }

# make deps runs its builds DEPS_JOBS at a time: the Kubernetes chain (the binaries, then
# e2e.test and agnhost, which reuse their compiled packages, so never beside them) beside
# the other tools. A fresh machine's builds download and link as much as they compile, and
# one at a time leaves a CPU idle then. Each build's output is printed when it ends, with
# its time; a build with everything in place takes no time.
DEPS_JOBS ?= 2
DEPS_BUILDS := build-k8s build-olm build-prometheus build-coredns build-runtime-tools build-kwok build-gotestsum build-e2e build-agnhost

.PHONY: deps $(DEPS_BUILDS:%=deps-%)
deps: ## Install what the tests need (apt packages; k8s binaries, crictl, reference CNI plugins, OLM, opm, kwok, CoreDNS, Prometheus, the upstream e2e.test + ginkgo, agnhost and gotestsum into $(TRELLIS_CACHE)), DEPS_JOBS builds at a time.
	hack/install-deps.sh
	@$(MAKE) --no-print-directory -j$(DEPS_JOBS) --output-sync=target $(DEPS_BUILDS:%=deps-%)

$(DEPS_BUILDS:%=deps-%): deps-%:
	@start=$$(date +%s); hack/$*.sh >/dev/null || exit 1; echo "deps: $* ready ($$(($$(date +%s) - start)) s)"

# e2e.test and agnhost are built from the same Kubernetes module as the binaries: after them,
# they compile only what the binaries don't share.
deps-build-e2e deps-build-agnhost: | deps-build-k8s

# The ClusterNetworkPolicy conformance tests make test runs (make conformance-cnp runs all):
# both tiers with NetworkPolicy, priorities, TCP and UDP rules, the experimental named ports.
CNP_CI ?= CNPAdminTierIntegration|CNPAdminTierPriorityField|CNPAdminTierIngressNamedPort|CNPAdminTierEgressNamedPort|CNPBaselineTierIngressTCP|CNPBaselineTierEgressUDP

.PHONY: test
test: ## Run every test, in timed stages (hack/test-stages.sh; budgets in docs/development.md): deps, generate, vet, lint, then at once the Go tests (unit, real kube-apiserver/etcd, real namespaces, containerd) with fuzz and bundle validation, the local-cluster e2e, the NetworkPolicy conformance subset (a cluster per family), the upstream [sig-network] subset (test/upstream/ci.txt), the ClusterNetworkPolicy conformance subset (CNP_CI).
	hack/test-stages.sh

# The stages of make test (each also runs alone; none runs deps first).
.PHONY: test-go
test-go: ## Stage of make test: go test ./... (unit, real kube-apiserver/etcd, real namespaces, containerd); needs make deps.
	go test $(GO_TEST_FLAGS) ./... && go -C test test $(GO_TEST_FLAGS) ./...

.PHONY: test-fuzz
test-fuzz: ## Stage of make test: short fuzz runs of the conflist parser and of ipBlock application.
	go test -run='^$$' -fuzz=FuzzParseConf -fuzztime=$(FUZZ_PARSE_EXECS) ./cni/plugin/
	go test -run='^$$' -fuzz='^FuzzIPBlockApply$$' -fuzztime=$(FUZZ_IPBLOCK_EXECS) -fuzzminimizetime=10x ./agent/policy/

.PHONY: e2e-run
e2e-run: ## Stage of make test: the e2e suite (make e2e without deps).
	hack/build-agnhost.sh >/dev/null
	$(RUN_E2E)

.PHONY: conformance-upstream-ci
conformance-upstream-ci: ## Stage of make test: the upstream [sig-network] subset of test/upstream/ci.txt.
	UPSTREAM_FOCUS=test/upstream/ci.txt UPSTREAM_DIRECT=0 hack/conformance-upstream.sh

.PHONY: conformance-cnp-ci
conformance-cnp-ci: ## Stage of make test: the ClusterNetworkPolicy conformance subset CNP_CI.
	CNP_RUN='$(CNP_CI)' ARTIFACTS=$(TRELLIS_CACHE)/cnp-ci hack/conformance-cnp.sh

.PHONY: test-unit
test-unit: ## Unit tests only, for the edit-test loop: go test -short ./... (no root, no cluster, no API server needed; root is fine too).
	go test -short ./... && go -C test test -short ./...
	@echo "test-unit: tests needing root/network namespaces, kube-apiserver/etcd, containerd or built binaries were skipped (go test -short -v shows which); make test runs them."

.PHONY: verify
verify: manifests generate bundle catalog ## Fail if generated files (CRDs, RBAC, deep copies, OLM bundle and catalog) are out of date.
	@git diff --exit-code -- api config bundle catalog || { echo "generated files changed: run 'make manifests generate bundle catalog' and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- bundle catalog)" || { git status --porcelain -- bundle catalog; echo "make bundle catalog made new files: commit them"; exit 1; }

##@ OLM

.PHONY: bundle
bundle: manifests ## Generate the OLM bundle in bundle/ from config/ (CSV, CRDs, metadata, bundle.Dockerfile, scorecard config).
	go run ./hack/olm bundle -version $(VERSION) -image $(IMG)

.PHONY: catalog
catalog: bundle ## Publish bundle/ as version $(VERSION) in the file-based catalog catalog/ (earlier versions' files stay as released).
	go run ./hack/olm catalog -bundle bundle -out catalog

.PHONY: validate-bundle
validate-bundle: ## Validate bundle/ with operator-framework/api (its own module, test/bundle: kept out of the product's dependencies).
	cd test/bundle && go test $(GO_TEST_FLAGS) ./...

##@ Build

.PHONY: build
build: ## Build trellis-operator, trellis-agent, trellis (the CNI plugin) and kubectl-trellis into bin/.
	CGO_ENABLED=0 go build -trimpath -ldflags "$(LDFLAGS)" -o bin/trellis-operator ./cmd/manager
	CGO_ENABLED=0 go build -trimpath -ldflags "$(LDFLAGS)" -o bin/trellis-agent ./cmd/agent
	CGO_ENABLED=0 go build -trimpath -ldflags "$(LDFLAGS)" -o bin/trellis ./cmd/cni
	CGO_ENABLED=0 go build -trimpath -ldflags "$(LDFLAGS)" -o bin/kubectl-trellis ./cmd/kubectl-trellis

# The kubectl plugin is released as an archive per platform, as krew and users download it:
# a .tar.gz for linux and darwin, a .zip for windows, each the binary and LICENSE
# (hack/clidist packs them, the same tree giving the same bytes), SHA256SUMS, and
# trellis.yaml, the krew plugin manifest whose uris are CLI_RELEASE_URL/<archive>, checked
# by krew's own validate-krew-manifest, which installs every platform from its archive
# (hack/validate-krew-manifest.sh). A platform kubectl-trellis doesn't build for fails it.
CLI_PLATFORMS ?= linux/amd64 linux/arm64 darwin/amd64 darwin/arm64 windows/amd64 windows/arm64
CLI_REPO_URL ?= https://github.com/trellis-net/trellis
CLI_RELEASE_URL ?= $(CLI_REPO_URL)/releases/download/$(VERSION)
DIST_DIR := _output/dist
.PHONY: dist-cli
dist-cli: ## Build kubectl-trellis for CLI_PLATFORMS (linux, darwin, windows × amd64, arm64) into _output/dist: a .tar.gz each (.zip for windows) with LICENSE, SHA256SUMS, and the krew manifest trellis.yaml (uris under CLI_RELEASE_URL), validated by krew's validate-krew-manifest.
	@rm -rf $(DIST_DIR) && mkdir -p $(DIST_DIR)/bin
	@failed=; for p in $(CLI_PLATFORMS); do \
		os=$${p%/*}; arch=$${p#*/}; exe=kubectl-trellis; [ $$os != windows ] || exe=$$exe.exe; \
		echo "go build $$p"; \
		CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch go build -trimpath -ldflags "$(LDFLAGS)" -o $(DIST_DIR)/bin/$${os}_$${arch}/$$exe ./cmd/kubectl-trellis || failed="$$failed $$p"; \
	done; \
	[ -z "$$failed" ] || { echo "dist-cli: kubectl-trellis does not build for$$failed" >&2; exit 1; }
	go run ./hack/clidist -platforms "$(CLI_PLATFORMS)" -bin-dir $(DIST_DIR)/bin -out $(DIST_DIR) -version $(VERSION) \
		-release-url $(CLI_RELEASE_URL) -homepage $(CLI_REPO_URL)/blob/main/docs/kubectl-trellis/README.md \
		-license LICENSE -mtime $$(git log -1 --format=%ct)
	@rm -rf $(DIST_DIR)/bin
	hack/validate-krew-manifest.sh $(DIST_DIR)/trellis.yaml

.PHONY: run
run: manifests generate ## Run the operator against the cluster in ~/.kube/config.
	RELATED_IMAGE_AGENT=$(IMG) go run ./cmd/manager

.PHONY: docker-build
docker-build: ## Build the image with a Docker engine (none runs on the CI machines).
	docker build --build-arg VERSION=$(VERSION) -t $(IMG) .

.PHONY: docker-push
docker-push: ## Push IMG (make docker-build IMG=... first) for a real cluster's nodes to pull.
	docker push $(IMG)

##@ Deployment

.PHONY: install
install: manifests ## Install the CRDs into the cluster in ~/.kube/config.
	$(KUBECTL) apply -k config/crd

.PHONY: uninstall
uninstall: ## Remove the CRDs (and with them every ClusterNetwork/NodeNetwork).
	$(KUBECTL) delete -k config/crd --ignore-not-found

.PHONY: deploy
deploy: manifests ## Install the operator (CRDs, RBAC, Deployment) running IMG, which the node agent runs too (hack/deploy.sh: config/default, the repository's files untouched).
	KUBECTL=$(KUBECTL) hack/deploy.sh $(IMG) apply

.PHONY: undeploy
undeploy: ## Remove the operator.
	KUBECTL=$(KUBECTL) hack/deploy.sh $(IMG) delete

##@ Local cluster

# A local multi-node cluster: every node a network namespace with containerd, kubelet and
# kube-proxy, a real control plane (test/cluster, test/cmd/localcluster). Run as root.
CLUSTER_FLAGS ?=
LOCALCLUSTER := go -C test run ./cmd/localcluster

.PHONY: cluster-up
cluster-up: ## Bring up the local cluster (3 nodes, Trellis installed from config/). Options: CLUSTER_FLAGS="--cni reference --nodes 2 --remote-node --ip-family dual".
	$(LOCALCLUSTER) up $(CLUSTER_FLAGS)

.PHONY: cluster-down
cluster-down: ## Remove the local cluster: every process, namespace, mount, cgroup and file it made. CLUSTER_FLAGS="--keep-logs" keeps its logs.
	$(LOCALCLUSTER) down $(CLUSTER_FLAGS)

.PHONY: demo
demo: ## Bring up the local cluster with Trellis and show nodes, pod blocks, the ClusterNetwork and pod-to-pod connectivity; leaves it running.
	$(LOCALCLUSTER) up --cni trellis
	$(LOCALCLUSTER) demo

.PHONY: e2e
e2e: deps ## End-to-end tests on a fresh local cluster (TRELLIS_CLUSTER_REUSE=1 to reuse one).
	hack/build-agnhost.sh >/dev/null
	$(RUN_E2E)

.PHONY: e2e-olm
e2e-olm: deps ## Install Trellis N (hack/previous-release) with a real OLM on a local cluster "upgrade", then upgrade it to this tree under traffic (TestUpgradeCluster/OLMUpgrade alone).
	hack/build-agnhost.sh >/dev/null
	go -C test test -tags e2e -count=1 -timeout 30m -v -run '^TestUpgradeCluster$$/^OLMUpgrade$$' ./e2e/

##@ NetworkPolicy conformance

# Judged by cyclonus v0.5.6 (test/conformance): its runner on a local 3-node cluster "conf".
# Results: per-case lines, totals, $(CONFORMANCE_OUT)/junit.xml and report.txt. `make test`
# runs the subset. CONFORMANCE_FAMILY: dual (the default with Trellis: a pass over the
# pods' IPv4 addresses, then one over their IPv6 addresses, on a dual-stack cluster; the
# subset's IPv6 pass is SubsetIPv6, every tag in 27 cases), ipv4 (the default with the
# reference CNI) or ipv6.
CONFORMANCE_OUT ?= _output/conformance
CONFORMANCE_FAMILY ?=
CONFORMANCE_STACK ?=
CONFORMANCE_CLUSTER ?= conf
CONFORMANCE_MODE ?= subset
CONFORMANCE_DATAPLANE ?=
CONFORMANCE_ENV = TRELLIS_CONFORMANCE_JUNIT=$(CURDIR)/$(CONFORMANCE_OUT)/junit.xml TRELLIS_CONFORMANCE_FAMILY=$(CONFORMANCE_FAMILY) \
	TRELLIS_CONFORMANCE_STACK=$(CONFORMANCE_STACK) TRELLIS_CONFORMANCE_CLUSTER=$(CONFORMANCE_CLUSTER) \
	TRELLIS_CONFORMANCE_DATAPLANE=$(CONFORMANCE_DATAPLANE)
CONFORMANCE_RUN = -tags conformance -count=1 -v -run '^TestNetworkPolicyConformance$$' ./conformance/

.PHONY: conformance
conformance: deps ## Every case cyclonus generates (230; ~82,000 probes per family) over IPv4 and over IPv6 on a fresh dual-stack local cluster (CONFORMANCE_FAMILY=dual|ipv4|ipv6, TRELLIS_CONFORMANCE_CNI=trellis|reference, TRELLIS_CLUSTER_REUSE=1).
	hack/build-agnhost.sh >/dev/null
	TRELLIS_CONFORMANCE=all $(CONFORMANCE_ENV) go -C test test -timeout 4h $(CONFORMANCE_RUN)

.PHONY: conformance-subset
conformance-subset: deps ## The fixed subsets of conformance cases CI runs: 46 over IPv4, 27 over IPv6 (each every tag).
	hack/build-agnhost.sh >/dev/null
	TRELLIS_CONFORMANCE=subset $(CONFORMANCE_ENV) go -C test test -timeout 1h $(CONFORMANCE_RUN)

.PHONY: conformance-run
conformance-run: ## Stage of make test: conformance cases (CONFORMANCE_MODE=subset|all) with no deps first; make test runs the IPv4 and IPv6 passes at once on clusters conf4 and conf6 (CONFORMANCE_FAMILY, CONFORMANCE_STACK, CONFORMANCE_CLUSTER, CONFORMANCE_OUT).
	hack/build-agnhost.sh >/dev/null
	TRELLIS_CONFORMANCE=$(CONFORMANCE_MODE) $(CONFORMANCE_ENV) go -C test test -timeout 4h $(CONFORMANCE_RUN)

.PHONY: conformance-upstream
conformance-upstream: deps ## The upstream Kubernetes e2e suite, unchanged, on a fresh local cluster: the specs of test/upstream/focus.txt but test/upstream/skip.txt; prints N passed, M failed, K skipped and writes JUnit XML (UPSTREAM_PROCS, UPSTREAM_KEEP=1, ARTIFACTS).
	hack/conformance-upstream.sh

.PHONY: conformance-upstream-list
conformance-upstream-list: ## List the upstream specs make conformance-upstream selects (UPSTREAM_FOCUS=test/upstream/ci.txt: those make test runs); no cluster.
	UPSTREAM_LIST=1 hack/conformance-upstream.sh

.PHONY: conformance-cnp
conformance-cnp: deps ## The upstream ClusterNetworkPolicy conformance suite (network-policy-api, standard profile + NamedPorts, EgressNodePeers) on a fresh local cluster "cnp"; prints N passed, M failed, K skipped, E exempt (no kernel SCTP) and writes the ConformanceReport YAML (CNP_RUN, CNP_KEEP=1, ARTIFACTS).
	hack/conformance-cnp.sh

.PHONY: conformance-cnp-list
conformance-cnp-list: ## List the ClusterNetworkPolicy conformance tests make conformance-cnp runs (the skipped ones marked); no cluster.
	CNP_LIST=1 hack/conformance-cnp.sh

##@ Benchmarks

BENCH_CNI_FLAGS ?=

.PHONY: bench-cni
bench-cni: ## CNI ADD/DEL latency, trellis vs ptp + host-local (root; own netns). Options: BENCH_CNI_FLAGS="-pods 200 -rounds 2 -concurrency 20 -families ipv4,dual".
	@tools=$$(hack/build-runtime-tools.sh) && \
	tmp="$${TMPDIR:-/tmp}/trlbench-$$$$-make" && mkdir -m 700 "$$tmp" && \
	trap 'rm -rf "$$tmp"' EXIT && trap 'exit 130' INT TERM HUP && \
	CGO_ENABLED=0 go build -trimpath -ldflags "$(LDFLAGS)" -o "$$tmp/trellis" ./cmd/cni && \
	go -C test run ./bench/cni -reference-dir "$$tools" -trellis "$$tmp/trellis" $(BENCH_CNI_FLAGS)

# bench-datapath flags: -duration 3s -repeat 5 (per path and side), -sides (comma-separated, default all:
# trellis,reference,flannel,no-nat,no-antispoof,no-rpfilter,no-dispatch,notrack,no-netfilter,bare,native-nft,notrack-vxlan,nft-policy; trellis always among them),
# -tx-checksum-offload Auto|Enabled|Disabled, -hold, -profile 'VXLAN cross node' (perf: where the CPU time goes).
# The goals' verdicts want an idle machine: -duration 10s -repeat 7.
BENCH_DATAPATH_FLAGS ?=

.PHONY: bench-datapath
bench-datapath: ## Pod-to-pod TCP throughput (iperf3) per mode, trellis (plugin + agent datapath + policy dispatch) vs hand-built and flannel-equivalent paths, goals PASS/MISS (inconclusive when loaded or noisy), ablation rows attributing trellis's cost (root; own netns). Options: BENCH_DATAPATH_FLAGS="-duration 3s -repeat 5 -sides trellis,reference,flannel,no-nat,no-antispoof,no-rpfilter,no-dispatch,notrack,no-netfilter,bare,native-nft,notrack-vxlan,nft-policy -tx-checksum-offload Disabled -hold -profile 'VXLAN cross node'".
	@hack/install-deps.sh && \
	tmp="$${TMPDIR:-/tmp}/trlb-$$$$-make" && mkdir -m 700 "$$tmp" && \
	trap 'rm -rf "$$tmp"' EXIT && trap 'exit 130' INT TERM HUP && \
	CGO_ENABLED=0 go build -trimpath -ldflags "$(LDFLAGS)" -o "$$tmp/trellis" ./cmd/cni && \
	go -C test build -o "$$tmp/bench-datapath" ./bench/datapath && \
	"$$tmp/bench-datapath" -trellis "$$tmp/trellis" $(BENCH_DATAPATH_FLAGS)

BENCH_POLICY_FLAGS ?=

.PHONY: bench-policy
bench-policy: ## NetworkPolicy at 1,000 and 10,000 pods (1,000 NetworkPolicies, 100 ClusterNetworkPolicies) side by side: full sync, label change/pod add/policy add/CNP add/CNP rule edit/CNP priority edit -> enforced p50/p99, CNI ADD with vs without 100,000 conntrack entries, RSS, throughput with vs without policy, goals PASS/MISS (root; real API server; own netns). Options: BENCH_POLICY_FLAGS="-sizes 1000,10000 -policies 1000 -cnps 100 -changes 20 -conntrack 100000 -repeat 3 -profile-dir DIR" (-pods N = -sizes N).
	@hack/install-deps.sh && hack/build-k8s.sh >/dev/null && \
	tmp="$${TMPDIR:-/tmp}/trlbp-$$$$-make" && mkdir -m 700 "$$tmp" && \
	trap 'rm -rf "$$tmp"' EXIT && trap 'exit 130' INT TERM HUP && \
	go -C test build -o "$$tmp/bench-policy" ./bench/policy && \
	"$$tmp/bench-policy" $(BENCH_POLICY_FLAGS)

NODES ?= 500,2000,5000
BENCH_SCALE_FLAGS ?=

.PHONY: bench-scale
bench-scale: ## Operator and agent at NODES kwok nodes (default 500,2000,5000) on a real API server: allocation, convergence, per-peer latency, RSS, API writes and watch events (root; own netns). Options: BENCH_SCALE_FLAGS="-steady 1m -changes 3".
	@hack/install-deps.sh && hack/build-k8s.sh >/dev/null && hack/build-kwok.sh >/dev/null && \
	tmp="$${TMPDIR:-/tmp}/trlbs-$$$$-make" && mkdir -m 700 "$$tmp" && \
	trap 'rm -rf "$$tmp"' EXIT && trap 'exit 130' INT TERM HUP && \
	go -C test build -o "$$tmp/bench-scale" ./bench/scale && \
	"$$tmp/bench-scale" -nodes "$(NODES)" $(BENCH_SCALE_FLAGS)
