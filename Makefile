# ebpf-cni: run `make help` for the targets.
SHELL := /bin/bash
GO ?= go
BIN := bin
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X github.com/ebpf-cni/ebpf-cni/pkg/buildinfo.Version=$(VERSION)
DESTDIR ?=
CNI_BIN_DIR ?= /opt/cni/bin
CNI_CONF_DIR ?= /etc/cni/net.d
CNI_CONF_FILE ?= 10-ebpf-cni.conflist
# make install: the node's pod range (required; "v4,v6" for dual stack), and
# optionally every node's ranges (not masqueraded), masquerade on/off, FORCE=1
# to replace an existing conflist, and the plugin's state locations.
POD_CIDR ?=
CLUSTER_CIDRS ?=
MASQUERADE ?= true
FORCE ?=
BPF_ROOT ?=
STATE_DIR ?=
ifneq ($(filter install,$(MAKECMDGOALS)),)
ifeq ($(strip $(POD_CIDR)),)
$(error POD_CIDR is required: this node's pod range, e.g. make install POD_CIDR=10.244.1.0/24 (dual stack: POD_CIDR=10.244.1.0/24,fd00:10:244:1::/64))
endif
endif

# Debian packages the build, tests, demo and benchmarks need (ca-certificates:
# go mod download over TLS, a minimal Debian 12 has none; podman: the tests
# that load make image's archive and start the DaemonSet's containers; runc:
# the runtime they start them with, the one a kubelet's containerd uses).
DEB_PKGS := ca-certificates clang-16 llvm-16 libbpf-dev bpftool iproute2 iperf3 sockperf iputils-ping iptables containernetworking-plugins podman runc

.PHONY: help deps tools generate check-generated build plugins test install uninstall image image-archive manifest uninstall-manifest clean bench

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z0-9-]+:.*## / {printf "  %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# apt-install installs the Debian packages of $(1) that are missing.
define apt-install
	@missing=""; for p in $(1); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "deps: installing Debian packages:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	else echo "deps: Debian packages present: $(strip $(1))"; \
	fi
endef

deps: ## install the Debian packages, Go modules and tools (bin/tools) the project needs (idempotent)
	$(call apt-install,$(DEB_PKGS))
	@$(GO) mod download
	@$(MAKE) --no-print-directory tools

# Tools the tests run, built from their Go modules into bin/tools: helm for
# the chart's tests (test/deploy). Not in go.mod: helm's Kubernetes modules
# would pull ours (k8s.io/*) to its versions. Built from an empty directory,
# outside this module: the first build takes about 100 s on 2 cores (its
# modules downloaded), and is skipped when the binary says it is that version.
TOOLS := $(CURDIR)/$(BIN)/tools
HELM_VERSION := v3.22.0

tools: ## build helm $(HELM_VERSION) into bin/tools (skipped when there; make deps runs it)
	@if $(GO) version -m $(TOOLS)/helm 2>/dev/null | grep -qE '^\s+mod\s+helm\.sh/helm/v3\s+$(HELM_VERSION)\s'; then \
		echo "tools: helm $(HELM_VERSION) present"; \
	else \
		echo "tools: building helm $(HELM_VERSION) into $(TOOLS)"; \
		tmp=$$(mktemp -d) && trap 'rm -rf $$tmp' EXIT && cd $$tmp && \
		GOBIN=$(TOOLS) GOFLAGS="-mod=mod -buildvcs=false" $(GO) install \
			-ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$(HELM_VERSION)" helm.sh/helm/v3/cmd/helm@$(HELM_VERSION); \
	fi

generate: ## compile bpf/*.c with bpf2go into pkg/ (reproducible; commit the output)
	$(GO) generate ./pkg/...
	$(GO) run ./internal/gendigest

check-generated: ## fail if the committed bpf2go output differs from a fresh generate
	@tmp=$$(mktemp -d); trap 'rm -rf $$tmp' EXIT; \
	cp -a go.mod go.sum bpf pkg internal $$tmp/ && (cd $$tmp && $(GO) generate ./pkg/... >/dev/null && $(GO) run ./internal/gendigest) && \
	for f in $$(cd $$tmp && ls pkg/*/*_bpfel.go pkg/*/*_bpfel.o pkg/*/*_gen.go); do \
		cmp -s $$f $$tmp/$$f || { echo "stale generated file: $$f (run make generate and commit)"; exit 1; }; \
	done; echo "generated objects are current"

# Static binaries: a plugin is exec'd for every call, and ld.so plus libc
# initialisation cost more than the IPAM work itself.
# loopback: the reference plugin (containernetworking/plugins, a module
# dependency) that runtimes run for each pod's lo; make install and the
# DaemonSet put it where a node has none (docs/deploy.md).
LOOPBACK := github.com/containernetworking/plugins/plugins/main/loopback

build: ## build bin/ebpf-cni, bin/ebpf-ipam, bin/ebpf-cni-agent and bin/loopback (static)
	CGO_ENABLED=0 $(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/ebpf-cni ./cmd/ebpf-ipam ./cmd/ebpf-cni-agent $(LOOPBACK)

plugins: ## build bin/ebpf-cni, bin/ebpf-ipam and bin/loopback only (what make install needs)
	CGO_ENABLED=0 $(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/ebpf-cni ./cmd/ebpf-ipam $(LOOPBACK)

test: deps build check-generated ## run every test (unit, integration in namespaces); as root
	$(GO) vet ./...
	cd pkg/hugeheap && $(GO) vet ./... && $(GO) test -count=1 ./... # a module of its own (its package comment)
	$(GO) test -count=1 -p 1 -timeout 30m ./...

install: plugins ## plugins into $(DESTDIR)$(CNI_BIN_DIR), a conflist for POD_CIDR= (required) into $(CNI_CONF_DIR) unless there (FORCE=1); as root
	@DESTDIR='$(DESTDIR)' CNI_BIN_DIR='$(CNI_BIN_DIR)' CNI_CONF_DIR='$(CNI_CONF_DIR)' CNI_CONF_FILE='$(CNI_CONF_FILE)' \
	BIN='$(BIN)' POD_CIDR='$(POD_CIDR)' CLUSTER_CIDRS='$(CLUSTER_CIDRS)' MASQUERADE='$(MASQUERADE)' FORCE='$(FORCE)' \
	BPF_ROOT='$(BPF_ROOT)' STATE_DIR='$(STATE_DIR)' bash deploy/install.sh install

uninstall: ## remove exactly what make install wrote (same DESTDIR and CNI_BIN_DIR); as root
	@DESTDIR='$(DESTDIR)' CNI_BIN_DIR='$(CNI_BIN_DIR)' bash deploy/install.sh uninstall

# The DaemonSet's image, tagged with the build version, and the OCI archive
# make image writes it into (docs/deploy.md, Releases).
IMAGE ?= localhost/ebpf-cni:$(VERSION)
IMAGE_ARCHIVE ?= $(BIN)/ebpf-cni-$(VERSION).oci.tar

# write-image writes the binaries in $(BIN) as the image $(IMAGE), in the
# DaemonSet's layout (the agent at /, the plugins in /opt/ebpf-cni/bin:
# agent.DefaultSrcDir), into the OCI archive $(IMAGE_ARCHIVE), with
# internal/ociimage: no registry, no container engine.
define write-image
	$(GO) run ./internal/ociimage -o '$(IMAGE_ARCHIVE)' -name '$(IMAGE)' -arch "$$($(GO) env GOARCH)" \
		-entrypoint /ebpf-cni-agent -cmd run \
		-label org.opencontainers.image.title=ebpf-cni -label 'org.opencontainers.image.version=$(VERSION)' \
		ebpf-cni-agent='$(BIN)/ebpf-cni-agent' opt/ebpf-cni/bin/ebpf-cni='$(BIN)/ebpf-cni' \
		opt/ebpf-cni/bin/ebpf-ipam='$(BIN)/ebpf-ipam' opt/ebpf-cni/bin/loopback='$(BIN)/loopback'
	@echo "make image: $(IMAGE) in $(IMAGE_ARCHIVE) (ctr -n k8s.io images import, podman load -i)"
endef

image: build ## the DaemonSet's image $(IMAGE) of the static binaries as an OCI archive, $(IMAGE_ARCHIVE) (offline; no registry, no podman)
	$(write-image)

image-archive: ## the same archive of the binaries already in $(BIN), without building (e.g. an earlier release's make build, with its VERSION=)
	$(write-image)

manifest: ## print deploy/kubernetes/ebpf-cni.yaml with the image set to $(IMAGE) (kubectl apply -f -)
	@sed 's|image: localhost/ebpf-cni:latest|image: $(IMAGE)|' deploy/kubernetes/ebpf-cni.yaml

uninstall-manifest: ## print deploy/kubernetes/ebpf-cni-uninstall.yaml with the image set to $(IMAGE): takes ebpf-cni off every node once its DaemonSet is deleted (docs/deploy.md, Removing)
	@sed 's|image: localhost/ebpf-cni:latest|image: $(IMAGE)|' deploy/kubernetes/ebpf-cni-uninstall.yaml

clean: ## remove build output
	rm -rf $(BIN)

BENCH ?= full
BENCH_FLAGS ?= # e.g. -ebpf-features masq,hostport,bandwidth, or -note "what else ran"
bench: build ## REF, EBPF and RAW side by side into test/bench/results (full: 33-37 min on 2 vCPUs; BENCH=quick: ~7 min); as root
	$(GO) run ./test/bench -profile $(BENCH) -bin $(BIN) -out test/bench/results $(BENCH_FLAGS)
	$(GO) run ./test/bench/ipam -n $(if $(filter quick,$(BENCH)),200,1000) -bin $(BIN)

.PHONY: demo
demo: deps build ## the product in under a minute on a simulated node: pods, masquerade, hostPort, bandwidth, vs bridge+iptables, the CLI; as root
	$(GO) run ./test/demo -bin $(BIN)

# The kernel test: qemu (TCG: no KVM needed), debootstrap for the guest's root
# filesystem, cpio for its initramfs, kmod (depmod) for the kernel's modules.
VM_DEB_PKGS := qemu-system-x86 debootstrap cpio kmod
KERNEL ?= # a Debian kernel package; empty: the one linux-image-amd64 depends on (Debian 12: 6.1)
VM_CACHE ?= /var/cache/ebpf-cni-vm
VM_TESTS ?= test/datapath test/cli test/ipam
VM_RUN ?=
VM_SKIP ?=
VM_BENCH ?=
.PHONY: test-kernel
test-kernel: deps ## boot a Debian kernel (KERNEL=linux-image-6.1.0-NN-amd64) in qemu, run the integration tests in it (VM_TESTS, VM_RUN, VM_SKIP); as root; see docs/kernels.md
	$(call apt-install,$(VM_DEB_PKGS))
	KERNEL="$(strip $(KERNEL))" VM_CACHE="$(VM_CACHE)" VM_TESTS="$(VM_TESTS)" VM_RUN="$(VM_RUN)" VM_SKIP="$(VM_SKIP)" VM_BENCH="$(VM_BENCH)" test/kernel/run.sh

# The e2e test: a real two-node Kubernetes cluster (etcd from Debian;
# Kubernetes and containerd 2.x built from their Go modules, cached by
# version in E2E_CACHE), each node in a network and mount namespace of its own, with
# ebpf-cni installed through its Helm chart. Outside CI: the first build
# takes ~30 min on a loaded 2-core machine. docs/development.md.
E2E_DEB_PKGS := etcd-server etcd-client runc iptables nftables conntrack openssl util-linux python3 bash-static
E2E_CACHE ?= /var/cache/ebpf-cni-e2e
E2E_PROXY_MODES ?= iptables nftables
# E2E_NETPOL=1: then the upstream NetworkPolicy e2e tests (test/e2e/netpol,
# built once into E2E_CACHE); E2E_NETPOL=only: those without the other checks;
# E2E_NETPOL_FOCUS: a ginkgo focus regexp within them; E2E_NETPOL_PROCS:
# specs at a time.
# E2E_FROM: the release the cluster starts on, upgraded from and downgraded
# back to (a tag or commit; empty: start on this tree).
E2E_FROM ?= v0.1.0
E2E_NETPOL ?=
E2E_NETPOL_FOCUS ?=
E2E_NETPOL_PROCS ?= 2
# E2E_CNP=1: then the ClusterNetworkPolicy conformance suite (test/e2e/cnp),
# its report into test/e2e/cnp/report-ipv4.yaml; E2E_CNP=only: that without the
# other checks; E2E_CNP_FEATURES: the features it is told are supported.
E2E_CNP ?=
E2E_CNP_FEATURES ?= ClusterNetworkPolicy,ClusterNetworkPolicyNamedPorts
E2E_CNP_RUN ?=
# E2E_CNP_FAMILY=6 (with E2E_CNP=only): the cluster IPv6 first, the report
# report-ipv6.yaml (4: report-ipv4.yaml).
E2E_CNP_FAMILY ?= 4
.PHONY: e2e
e2e: ## a two-node Kubernetes v1.34 cluster (containerd 2.x, kube-proxy) in namespaces, ebpf-cni through its Helm chart (from E2E_FROM, upgraded), the checks (E2E_NETPOL=1: and the upstream NetworkPolicy e2e tests); as root; see docs/development.md
	$(call apt-install,$(E2E_DEB_PKGS))
	E2E_CACHE="$(E2E_CACHE)" E2E_PROXY_MODES="$(E2E_PROXY_MODES)" E2E_FROM="$(E2E_FROM)" E2E_NETPOL="$(E2E_NETPOL)" E2E_NETPOL_FOCUS="$(E2E_NETPOL_FOCUS)" E2E_NETPOL_PROCS="$(E2E_NETPOL_PROCS)" E2E_CNP="$(E2E_CNP)" E2E_CNP_FEATURES="$(E2E_CNP_FEATURES)" E2E_CNP_RUN="$(E2E_CNP_RUN)" E2E_CNP_FAMILY="$(E2E_CNP_FAMILY)" test/e2e/run.sh

# The scale harness: the agent at 1,000 nodes / 30,000 pods / 30,000
# NetworkPolicies against a real API server (make e2e's kube-apiserver,
# built by test/e2e/build.sh into E2E_CACHE when missing; etcd from Debian),
# 20 real agents in network namespaces of their own. Outside CI: 10 to 20
# min on 2 cores. SCALE_FLAGS: e.g. -nodes 100 -pods 3000 -namespaces 100
# -policies 3000 -agents 4 for a quick look; -note "what else ran".
# docs/scale.md.
SCALE_OUT ?= test/bench/results/scale
SCALE_FLAGS ?=
.PHONY: scale
scale: build ## the agent at 1,000 nodes / 30,000 pods / 30,000 policies against a real API server, 20 agents; rows of path scale into $(SCALE_OUT); as root; see docs/scale.md
	@k8s=$$(E2E_CACHE="$(E2E_CACHE)" test/e2e/build.sh | head -1) && \
	$(GO) run ./test/scale -bin $(BIN) -k8s "$$k8s" -out $(SCALE_OUT) $(SCALE_FLAGS)
	$(GO) run ./test/bench -render $(SCALE_OUT)
