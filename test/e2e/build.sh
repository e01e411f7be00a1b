#!/usr/bin/env bash
# Builds (once) and caches the pinned Kubernetes and containerd binaries the
# e2e cluster runs, outside the tree, under $E2E_CACHE/<name>-<version>/.
# A second run finds the cache and builds nothing. Builds run at nice 19 on
# one core (GOMAXPROCS=1, -p 1): the machine is shared.
# Usage: test/e2e/build.sh   (prints the cache directory of each component)
# With E2E_NETPOL=1 it also builds the upstream NetworkPolicy e2e tests
# (test/e2e/netpol, its own module) and agnhost into $E2E_CACHE/netpol-<version>/;
# with E2E_CNP=1 the ClusterNetworkPolicy conformance suite (test/e2e/cnp)
# and agnhost into $E2E_CACHE/cnp-<version>/.
set -euo pipefail

: "${E2E_CACHE:=/var/cache/ebpf-cni-e2e}"
: "${K8S_VERSION:=v1.34.3}"
: "${CONTAINERD_VERSION:=v2.2.9}"
GO=${GO:-go}
K8S_BINS="kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl"
# The staging modules (k8s.io/api, ...) are published as v0.<minor>.<patch>.
STAGING_VERSION="v0.${K8S_VERSION#v1.}"

mkdir -p "$E2E_CACHE"
log() { echo "e2e-build: $*" >&2; }
slow() { nice -n 19 env GOMAXPROCS=1 CGO_ENABLED=0 GOFLAGS=-buildvcs=false "$@"; }

build_k8s() {
	local out="$E2E_CACHE/kubernetes-$K8S_VERSION"
	local missing=""
	for b in $K8S_BINS; do [ -x "$out/$b" ] || missing="$missing $b"; done
	if [ -z "$missing" ]; then log "kubernetes $K8S_VERSION: cached in $out"; return; fi
	local start=$SECONDS src="$E2E_CACHE/src/kubernetes-$K8S_VERSION"
	log "kubernetes $K8S_VERSION: building$missing (cold: ~30 min on 1 core)"
	if [ ! -f "$src/.prepared" ]; then
		local dir
		dir=$(cd "$E2E_CACHE" && $GO mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
		rm -rf "$src" && mkdir -p "$(dirname "$src")" && cp -r "$dir" "$src" && chmod -R u+w "$src"
		# The module zip carries a go.work and a stub vendor/ for the
		# staging tree it does not carry: use the published staging modules.
		rm -rf "$src/go.work" "$src/go.work.sum" "$src/vendor"
		sed -i -E "s#^([[:space:]]*)(k8s\.io/[a-z0-9-]+) => \./staging/src/k8s\.io/[a-z0-9-]+#\1\2 => \2 $STAGING_VERSION#" "$src/go.mod"
		touch "$src/.prepared"
	fi
	mkdir -p "$out.tmp"
	local pkgs=""
	for b in $missing; do pkgs="$pkgs ./cmd/$b"; done
	(cd "$src" && slow $GO build -p 1 -trimpath -mod=mod -ldflags "-s -w" -o "$out.tmp/" $pkgs)
	mkdir -p "$out" && mv "$out.tmp"/* "$out/" && rmdir "$out.tmp"
	log "kubernetes $K8S_VERSION: built in $((SECONDS - start)) s"
}

build_containerd() {
	local out="$E2E_CACHE/containerd-$CONTAINERD_VERSION"
	if [ -x "$out/containerd" ] && [ -x "$out/containerd-shim-runc-v2" ] && [ -x "$out/ctr" ]; then
		log "containerd $CONTAINERD_VERSION: cached in $out"; return
	fi
	local start=$SECONDS dir
	log "containerd $CONTAINERD_VERSION: building"
	dir=$(cd "$E2E_CACHE" && $GO mod download -json "github.com/containerd/containerd/v2@$CONTAINERD_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
	mkdir -p "$out.tmp"
	(cd "$dir" && slow $GO build -p 1 -trimpath -mod=mod \
		-tags "urfave_cli_no_docs osusergo netgo static_build no_btrfs" \
		-ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" \
		-o "$out.tmp/" ./cmd/containerd ./cmd/containerd-shim-runc-v2 ./cmd/ctr)
	mkdir -p "$out" && mv "$out.tmp"/* "$out/" && rmdir "$out.tmp"
	log "containerd $CONTAINERD_VERSION: built in $((SECONDS - start)) s"
}

# The NetworkPolicy e2e suite (test/e2e/netpol: only k8s.io/kubernetes's
# test/e2e/network/netpol and the e2e framework), agnhost (the image its
# pods run) from the k8s.io/kubernetes module at K8S_VERSION (the version
# test/e2e/netpol/go.mod requires), and the ginkgo runner (parallel
# processes). Built again when a file of test/e2e/netpol is newer than the
# binaries.
build_netpol() {
	local out="$E2E_CACHE/netpol-$K8S_VERSION" dir
	dir=$(cd "$(dirname "$0")/netpol" && pwd)
	grep -q "^[[:space:]]*k8s.io/kubernetes $K8S_VERSION\$" "$dir/go.mod" ||
		{ log "test/e2e/netpol/go.mod does not require k8s.io/kubernetes $K8S_VERSION"; exit 1; }
	if [ -x "$out/netpol.test" ] && [ -x "$out/agnhost" ] && [ -x "$out/ginkgo" ] && [ -s "$out/agnhost.image" ] &&
		[ -z "$(find "$dir" -newer "$out/netpol.test" -type f)" ]; then
		log "netpol e2e $K8S_VERSION: cached in $out"; return
	fi
	local start=$SECONDS
	log "netpol e2e $K8S_VERSION: building the suite and agnhost"
	rm -rf "$out.tmp" && mkdir -p "$out.tmp"
	(cd "$dir" && slow $GO test -c -vet=off -p 1 -trimpath -ldflags "-s -w" -o "$out.tmp/netpol.test" . &&
		slow $GO build -p 1 -trimpath -ldflags "-s -w" -o "$out.tmp/agnhost" k8s.io/kubernetes/test/images/agnhost &&
		slow $GO build -p 1 -trimpath -ldflags "-s -w" -o "$out.tmp/ginkgo" github.com/onsi/ginkgo/v2/ginkgo)
	# The name the suite asks for (imageutils.GetE2EImage(Agnhost)): the
	# e2e registry and the tag of test/utils/image/manifest.go.
	local k8s tag
	k8s=$(cd "$dir" && $GO list -m -f '{{.Dir}}' k8s.io/kubernetes)
	tag=$(sed -n 's/^[[:space:]]*configs\[Agnhost\] = Config{list.PromoterE2eRegistry, "agnhost", "\([^"]*\)"}.*/\1/p' "$k8s/test/utils/image/manifest.go")
	[ -n "$tag" ] || { log "no agnhost tag in $k8s/test/utils/image/manifest.go"; exit 1; }
	echo "registry.k8s.io/e2e-test-images/agnhost:$tag" >"$out.tmp/agnhost.image"
	rm -rf "$out" && mv "$out.tmp" "$out"
	log "netpol e2e $K8S_VERSION: built in $((SECONDS - start)) s"
}

# The ClusterNetworkPolicy conformance suite (test/e2e/cnp, its own module:
# sigs.k8s.io/network-policy-api's ClusterNetworkPolicy profile), agnhost
# (built from test/e2e/netpol's module, at K8S_VERSION) and the image name
# the suite's manifests ask for. Built again when a file of test/e2e/cnp is
# newer than the suite.
build_cnp() {
	local dir netpol version out
	dir=$(cd "$(dirname "$0")/cnp" && pwd) netpol=$(cd "$(dirname "$0")/netpol" && pwd)
	version=$(cd "$dir" && $GO list -m -f '{{.Version}}' sigs.k8s.io/network-policy-api)
	out="$E2E_CACHE/cnp-$version"
	if [ -x "$out/cnp.test" ] && [ -x "$out/agnhost" ] && [ -s "$out/agnhost.image" ] && [ -s "$out/crd.yaml" ] && [ -s "$out/crd-experimental.yaml" ] && [ -s "$out/sctp.tests" ] &&
		[ -z "$(find "$dir" -newer "$out/cnp.test" -type f -not -path "$dir/base/*")" ]; then
		log "cnp conformance $version: cached in $out"; return
	fi
	local start=$SECONDS api
	log "cnp conformance $version: building the suite and agnhost"
	rm -rf "$out.tmp" && mkdir -p "$out.tmp"
	api=$(cd "$dir" && $GO list -m -f '{{.Dir}}' sigs.k8s.io/network-policy-api)
	# The suite's manifests, embedded from here (test/e2e/cnp/base, not
	# committed), with manifests-nosctp.yaml beside them: the base pods
	# without their SCTP servers, which cannot start on a kernel without
	# SCTP (the suite's Setup waits for every pod to be ready).
	rm -rf "$dir/base" && cp -r "$api/conformance/base" "$dir/base" && chmod -R u+w "$dir/base"
	python3 - "$dir/base/manifests.yaml" >"$dir/base/manifests-nosctp.yaml" <<'PY'
import re, sys
lines = open(sys.argv[1]).read().split("\n")
out, i = [], 0
while i < len(lines):
    m = re.match(r"^(\s*)- name: ", lines[i])
    if m:
        j = i + 1
        while j < len(lines) and (not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip()) > len(m.group(1))):
            j += 1
        block = lines[i:j]
        if not any("SERVE_SCTP_PORT" in l for l in block):
            out.extend(block)
        i = j
        continue
    out.append(lines[i])
    i += 1
sys.stdout.write("\n".join(out))
PY
	grep -q SCTP "$dir/base/manifests-nosctp.yaml" && { log "SCTP servers left in $dir/base/manifests-nosctp.yaml"; exit 1; }
	(cd "$dir" && slow $GO test -c -vet=off -p 1 -trimpath -ldflags "-s -w" -o "$out.tmp/cnp.test" .)
	(cd "$netpol" && slow $GO build -p 1 -trimpath -ldflags "-s -w" -o "$out.tmp/agnhost" k8s.io/kubernetes/test/images/agnhost)
	sed -n 's/^[[:space:]]*image: \(registry.k8s.io\/e2e-test-images\/agnhost:[^[:space:]]*\).*/\1/p' "$api/conformance/base/manifests.yaml" | sort -u >"$out.tmp/agnhost.image"
	[ "$(wc -l <"$out.tmp/agnhost.image")" = 1 ] || { log "not one agnhost image in $api/conformance/base/manifests.yaml"; exit 1; }
	cp "$api/config/crd/standard/policy.networking.k8s.io_clusternetworkpolicies.yaml" "$out.tmp/crd.yaml"
	cp "$api/config/crd/experimental/policy.networking.k8s.io_clusternetworkpolicies.yaml" "$out.tmp/crd-experimental.yaml"
	# The tests that need the kernel's SCTP (skipped where it has none):
	# those of SCTP and those that poke SCTP among other protocols.
	sed -n 's/^[[:space:]]*ShortName:[[:space:]]*"\([A-Za-z0-9]*\)".*/\1/p' $(grep -l '"sctp"' "$api"/conformance/tests/*.go) | sort -u >"$out.tmp/sctp.tests"
	rm -rf "$out" && mv "$out.tmp" "$out"
	log "cnp conformance $version: built in $((SECONDS - start)) s"
}

debs() {
	local missing=""
	# bash-static: the conformance suite's pods run /bin/bash -c (E2E_CNP).
	for p in etcd-server etcd-client runc iptables nftables conntrack bash-static; do
		dpkg-query -W -f='${Status}' $p 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
	done
	if [ -n "$missing" ]; then
		log "installing Debian packages:$missing"
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
	fi
}

start=$SECONDS
debs
build_containerd
build_k8s
case ${E2E_NETPOL:-} in 1 | only) build_netpol ;; esac
case ${E2E_CNP:-} in 1 | only) build_cnp ;; esac
log "all components ready in $((SECONDS - start)) s"
echo "$E2E_CACHE/kubernetes-$K8S_VERSION"
echo "$E2E_CACHE/containerd-$CONTAINERD_VERSION"
case ${E2E_NETPOL:-} in 1 | only) echo "$E2E_CACHE/netpol-$K8S_VERSION" ;; esac
case ${E2E_CNP:-} in 1 | only) echo "$E2E_CACHE/cnp-$(cd "$(dirname "$0")/cnp" && $GO list -m -f '{{.Version}}' sigs.k8s.io/network-policy-api)" ;; esac
