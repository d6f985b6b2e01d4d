# labcloud: build, test, lint, and the tools the tests and the lab run.
SHELL := /bin/bash
export PATH := /usr/local/go/bin:$(PATH)
BIN ?= bin
GOTEST ?= go test -count=1
CHAOS_DURATION ?= 5m
CHAOS_SEED ?= 42

.PHONY: all build deb deps tools modules test unit e2e lint lab down bench chaos-soak conformance fuzz guide

all: build

deps:
	hack/install-deps.sh

# The version (hack/version.sh: git describe) is stamped into both binaries.
# component-base's version is the Kubernetes libraries' (k8s.io/cloud-provider
# v0.36.3 -> v1.36.3), as /version, the user agent and kubernetes_build_info
# expect. The feature gates take their emulation version from it: ours (v0.1)
# would give every versioned gate its default of before Kubernetes 1.0 (off,
# for ContextualLogging). Tests and the lab build through this target.
#
# grpcnotrace keeps golang.org/x/net/trace out of the binaries: through
# html/template it links text/template's executor, which calls methods by name,
# and then the linker keeps every exported method of every linked type. The
# CCM's text and read-only data are 45 MB with the tag, 70 without, and it
# maps most of them (TestCCMBinaryLinksNoTemplateExecutor, BenchmarkCCMMemory).
# The libvirt_without_* tags leave out the bindings of libvirt's QEMU and LXC
# libraries, which neither binary calls: two fewer libraries loaded. (The
# admin library's tag does not link in libvirt.org/go/libvirt v1.11010.0.)
TAGS := grpcnotrace libvirt_without_qemu libvirt_without_lxc
VERSION ?= $(shell hack/version.sh)
KUBE_VERSION ?= $(shell go list -m -f '{{.Version}}' k8s.io/cloud-provider | sed 's/^v0\./v1./')
LDFLAGS := -X github.com/labcloud/labcloud/version.stamped=$(VERSION) -X k8s.io/component-base/version.gitVersion=$(KUBE_VERSION)

# -trimpath: the binaries, and Go's cache entries for them, do not depend on
# where the checkout or the module cache is, so a CI job's restored cache
# (action.yml) serves a checkout at another path.
build:
	mkdir -p $(BIN)
	go build -trimpath -tags '$(TAGS)' -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/libvirt-cloud-controller-manager ./cmd/labcloud
	CGO_ENABLED=0 go build -trimpath -o $(BIN)/ ./cmd/lab-node

# The Debian package of the CCM (packaging/nfpm.yaml) into DIST, built with
# nfpm as a library (hack/pkgtools, its own module, nfpm pinned there) from
# the binary `make build` stamped, stripped as Debian's dh_strip would (its
# debug information and symbols are 18 MB; Go's stack traces and `go version -m` do not
# need them). The package's version is VERSION in Debian's order:
# v0.1.0-12-gabc1234[-dirty] -> 0.1.0+12.gabc1234[.dirty], v0.2.0-rc.1 -> 0.2.0~rc.1.
DIST ?= dist
DEB_VERSION ?= $(shell echo '$(VERSION)' | sed -E 's/^v//; s/-([0-9]+)-g([0-9a-f]+)/+\1.g\2/; s/-dirty$$/.dirty/; s/-/~/g')
deb: build
	mkdir -p $(BIN)/deb
	strip -o $(BIN)/deb/libvirt-cloud-controller-manager $(BIN)/libvirt-cloud-controller-manager
	go -C hack/pkgtools build -o $(abspath $(BIN))/nfpm-deb .
	# One package in DIST: the guide installs dist/..._*_amd64.deb.
	rm -f $(DIST)/libvirt-cloud-controller-manager_*_amd64.deb
	DEB_VERSION='$(DEB_VERSION)' CCM_BIN='$(abspath $(BIN))/deb/libvirt-cloud-controller-manager' \
		$(BIN)/nfpm-deb -f packaging/nfpm.yaml -t $(DIST)

# The Kubernetes binaries (control plane, kubelet, kube-proxy, agnhost,
# e2e.test), containerd and the CNI plugins, built from the module proxy into
# /var/cache/labcloud (a no-op once built).
tools:
	hack/build-tools.sh

# Every module the tests build with, fetched before the tests run: the e2e
# suite runs in network namespaces of its own, which do not reach the module
# proxy, and builds there (`make build` for the binaries, whose packages the
# test binary does not import; TestDebPackage's `make deb` builds
# hack/pkgtools, a module of its own).
modules:
	go mod download
	go -C hack/pkgtools mod download

# Everything: unit, privileged (netns, raw sockets) and end-to-end tests.
# Run as root; the privileged tests and the e2e suite do not skip as root.
# It installs the host packages it needs first (a no-op when present).
# It includes the chaos soak of CHAOS_DURATION (5 minutes, seed 42, as CI runs it)
# and, on the dual-stack lab of the CI script users run (hack/ci-e2e.sh), a
# representative subset of Kubernetes' own e2e tests; make conformance runs them all.
test: deps tools modules
	LABCLOUD_TOOLS=$$(hack/build-tools.sh | tail -1) LABCLOUD_CHAOS_DURATION=$(CHAOS_DURATION) LABCLOUD_CHAOS_SEED=$(CHAOS_SEED) \
		hack/test-suites.sh

# Each fuzz target for FUZZTIME: the parsers of what users and libvirt
# hand the CCM (annotations, cloud config, domain XML, ARP and NDP frames,
# Announced conditions, the kernel's socket listing).
# A count, not a duration: Go 1.26's fuzzing coordinator can fail a target
# that found nothing when a duration ends while a starved worker is busy
# ("context deadline exceeded", golang/go#75804, fixed in Go 1.27).
FUZZTIME ?= 100000x
FUZZ_TARGETS := lb:FuzzParseRequest lb:FuzzParseAnnounced provider:FuzzLoadConfig libvirtcloud:FuzzParseDomainXML lb/announce:FuzzHandle lb/announce:FuzzHandleND lb/announce:FuzzParseBound
fuzz:
	set -e; for t in $(FUZZ_TARGETS); do \
		go test -run '^$$' -fuzz "^$${t#*:}$$" -fuzztime $(FUZZTIME) ./$${t%%:*}/; \
	done

unit:
	$(GOTEST) ./provider/... ./libvirtcloud/... ./netroutes/... ./lb/... ./bgp/...

e2e: tools modules
	LABCLOUD_TOOLS=$$(hack/build-tools.sh | tail -1) $(GOTEST) -v -timeout 30m ./test/e2e/...

bench: tools modules
	LABCLOUD_TOOLS=$$(hack/build-tools.sh | tail -1) go test -run '^$$' -bench . -benchtime 1x ./...

# A chaos soak on a fresh two-node lab: CHAOS_DURATION of seeded faults
# (seed CHAOS_SEED) with the invariants checked throughout; fails on any
# violation. CI runs it as is (5 minutes, seed 42). Root; ~15-25 min in all.
chaos-soak: tools modules
	LABCLOUD_TOOLS=$$(hack/build-tools.sh | tail -1) LABCLOUD_CHAOS_DURATION=$(CHAOS_DURATION) LABCLOUD_CHAOS_SEED=$(CHAOS_SEED) \
		$(GOTEST) -v -timeout 60m -run '^TestChaosSoak$$' ./test/labe2e/

# docs/install-kubeadm.md run as written (test/guide): every sh block in
# order on a KVM host set up as Debian sets one up, with three Debian guests
# running kubeadm v1.36.3 (TCG here: about 20-30 minutes), then the checks
# from outside. Root. make conformance runs it too.
guide: deps modules
	LABCLOUD_GUIDE=1 $(GOTEST) -v -timeout 80m -run '^TestGuide$$' ./test/guide/

# Kubernetes' own e2e tests on fresh three-node labs (hack/conformance.sh):
# the LoadBalancer focus on ipv4 and ipv6, the dual-stack tests and the
# sig-network Conformance tests. CONFORMANCE_RUNS picks runs,
# CONFORMANCE_ARGS adds labcloud e2e flags; reports land in CONFORMANCE_DIR.
# Root; two hours or more on TCG guests.
CONFORMANCE_DIR ?= labcloud-e2e
CONFORMANCE_ARGS ?=
CONFORMANCE_RUNS ?= loadbalancer-ipv4 loadbalancer-ipv6 dualstack sig-network
export BIN CONFORMANCE_DIR CONFORMANCE_ARGS CONFORMANCE_RUNS
conformance: deps tools build
	hack/conformance.sh

lint:
	test -z "$$(gofmt -l $$(git ls-files '*.go'))"
	go vet ./...
	go mod tidy -diff

lab: deps tools build
	$(BIN)/labcloud up --nodes 3

down:
	$(BIN)/labcloud down
