#!/usr/bin/env bash
# make e2e: a real one-node Kubernetes cluster on ebpf-cni, outside CI.
#
# etcd (Debian), kube-apiserver, kube-controller-manager, kube-scheduler,
# kubelet, kube-proxy and kubectl (built from the k8s.io/kubernetes module)
# and containerd 2.x (built from its module) with Debian's runc run in a
# network namespace and a mount namespace of their own: the "node". A second
# node (containerd, kubelet and kube-proxy in namespaces of their own) joins
# the same API server. Each node's only link is a veth to a bridge in a
# third namespace, the "world" (192.0.2.0/24, 2001:db8::/64): one L2
# segment, so ebpf-cni's agent routes each node's pod ranges via the other's
# address (mode direct); pods get 10.244.0.0/16 and 2001:db8:244::/56. The
# machine's interfaces, mounts, /etc/cni, /opt/cni and any other runtime are
# untouched. ebpf-cni is installed through its DaemonSet
# (deploy/kubernetes/ebpf-cni.yaml as make manifest prints it) from an image
# imported as an OCI archive, as are the pause and test images: no registry
# is used. Everything is removed on exit, on failure and on Ctrl-C.
#
# Settings (environment, passed through by make):
#   E2E_CACHE   cache of the built binaries (/var/cache/ebpf-cni-e2e; test/e2e/build.sh)
#   E2E_PROXY_MODES  kube-proxy modes to run the Service checks in ("iptables nftables")
#   E2E_KEEP=1  on failure, wait for Enter before tearing down (to look around)
#   E2E_FROM    the release the cluster starts on and is upgraded from to this
#               tree, then downgraded back to (v0.1.0; a tag or commit; empty:
#               start on this tree, no upgrade or downgrade check)
#   E2E_NETPOL=1  then run the upstream NetworkPolicy e2e tests (test/e2e/netpol)
#                 against the cluster; E2E_NETPOL=only: those and none of the other checks;
#                 E2E_NETPOL_FOCUS narrows them (a ginkgo focus regexp); E2E_NETPOL_PROCS
#                 specs at a time (2)
#   E2E_CNP=1   then run the ClusterNetworkPolicy conformance suite (test/e2e/cnp)
#               and write its report to test/e2e/cnp/report-ipv4.yaml; E2E_CNP=only: that
#               and none of the other checks; E2E_CNP_FEATURES: the suite's
#               -supported-features (ClusterNetworkPolicy); E2E_CNP_RUN: some of its
#               tests only (a regexp of their names; no report is written);
#               E2E_CNP_FAMILY=6 (with E2E_CNP=only): a cluster IPv6 first
#               (report-ipv6.yaml; 4, the default: report-ipv4.yaml)
set -euo pipefail

cd "$(dirname "$0")/../.."
root=$PWD
log() { printf 'e2e: %s\n' "$*" >&2; }
die() { log "FAIL: $*"; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (namespaces, mounts, containerd)"

# Addresses: all private test ranges, only inside the namespaces made here.
NODE_IP4=192.0.2.2 WORLD_IP4=192.0.2.1
NODE_IP6=2001:db8::2 WORLD_IP6=2001:db8::1
NODE2_IP4=192.0.2.3 NODE2_IP6=2001:db8::3
CLUSTER_CIDRS=10.244.0.0/16,2001:db8:244::/56
SERVICE_CIDRS=10.96.0.0/16,2001:db8:96::/112
NODE_IPS=$NODE_IP4,$NODE_IP6 NODE2_IPS=$NODE2_IP4,$NODE2_IP6
ADVERTISE=$NODE_IP4 BIND=0.0.0.0
# E2E_CNP_FAMILY=6: IPv6 first (the nodes' addresses, the pod and Service
# ranges: a pod's primary address is IPv6), for the conformance suite,
# which pokes primary addresses only.
CNP_FAMILY=${E2E_CNP_FAMILY:-4}
case $CNP_FAMILY in
4) ;;
6)
	[ "${E2E_CNP:-}" = only ] || { echo "e2e: E2E_CNP_FAMILY=6 runs with E2E_CNP=only (the other checks read IPv4 first)" >&2; exit 2; }
	CLUSTER_CIDRS=2001:db8:244::/56,10.244.0.0/16 SERVICE_CIDRS=2001:db8:96::/112,10.96.0.0/16
	NODE_IPS=$NODE_IP6,$NODE_IP4 NODE2_IPS=$NODE2_IP6,$NODE2_IP4
	# The kubernetes Service takes the first family: its endpoint the
	# advertised address, which the API server must listen on.
	ADVERTISE=$NODE_IP6 BIND=::
	;;
*) echo "e2e: E2E_CNP_FAMILY=$CNP_FAMILY: 4 or 6" >&2; exit 2 ;;
esac
NODE=e2e-node
NODE2=e2e-node2
# The second node takes only the pods that ask for it (nodeName and this
# toleration): everything else is scheduled on the first.
NODE2_TAINT=e2e.ebpf-cni.io/second
IMAGE=localhost/ebpf-cni:e2e
IMAGE2=localhost/ebpf-cni:e2e-rollout
# The previous release: the cluster starts on it (E2E_FROM; docs/deploy.md,
# Releases). v0.1.0 is built with its commit as its version: its programs'
# pin names cannot hold the dots of "v0.1.0" (CHANGELOG.md).
E2E_FROM=${E2E_FROM-v0.1.0}
PREV_IMAGE=localhost/ebpf-cni:e2e-previous
TEST_IMAGE=localhost/e2ebox:e2e
PAUSE_IMAGE=localhost/pause:e2e

# The directories each node covers with its own ($T/root for the first,
# $T/root2 for the second).
NODE_DIRS="/opt/cni/bin /etc/cni/net.d /var/log/pods /var/log/containers /var/lib/kubelet /run/containerd /run/ebpf-cni /var/lib/cni /run/netns /run/nri"

if [ "${1:-}" = node2 ]; then
	# ---------------- the second node's mounts ----------------
	# Run by the first node in the second's network namespace and a new
	# copy of the first's mount namespace: its own /sys (its devices), the
	# cgroup hierarchies, its own bpffs and directories. Then it only
	# holds the namespaces; the first node starts the second's daemons in
	# them (nsenter -t this process).
	mount -t sysfs sysfs /sys
	mount --rbind "$T/cg" /sys/fs/cgroup
	mount -t bpf bpf /sys/fs/bpf
	for d in $NODE_DIRS; do
		mkdir -p "$T/root2$d"
		mount --bind "$T/root2$d" "$d"
	done
	echo $$ >"$T/node2.pid"
	exec sleep infinity
fi

if [ "${1:-}" != node ]; then
	# ---------------- outside: build, namespaces, then enter the node ----------------
	start=$SECONDS
	log "building the cluster's binaries (cached in ${E2E_CACHE:-/var/cache/ebpf-cni-e2e})"
	mapfile -t dirs < <(test/e2e/build.sh)
	log "binaries ready after $((SECONDS - start)) s"
	T=$(mktemp -d /tmp/ebpf-cni-e2e.XXXXXX)
	id=$$
	NS_NODE=e2e-node-$id NS_NODE2=e2e-node2-$id NS_WORLD=e2e-world-$id
	made_dirs=()
	cleanup() {
		local rc=$?
		trap - EXIT INT TERM
		log "cleanup"
		# Every process of the cluster is in this cgroup (the node's
		# daemons, containerd's shims, kubelet's pods).
		local cg
		for i in 1 2 3 4 5 6 7 8 9 10; do
			local pids
			pids=$(cat $(find /sys/fs/cgroup/pids/ebpf-cni-e2e-$id -name cgroup.procs 2>/dev/null) 2>/dev/null || true)
			[ -z "$pids" ] && break
			kill -9 $pids 2>/dev/null || true
			sleep 0.5
		done
		for cg in /sys/fs/cgroup/*/ebpf-cni-e2e-$id; do
			[ -d "$cg" ] && find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null
			[ -d "$cg" ] && log "cgroup $cg left behind"
		done
		ip netns del "$NS_NODE" 2>/dev/null || true
		ip netns del "$NS_NODE2" 2>/dev/null || true
		ip netns del "$NS_WORLD" 2>/dev/null || true
		for d in "${made_dirs[@]}"; do rmdir "$d" 2>/dev/null || true; done
		rm -rf "$T"
		log "done: $((SECONDS - start)) s in all"
		exit "$rc"
	}
	trap cleanup EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM

	log "building ebpf-cni, e2ebox and the images"
	# The project's image as make image writes it, and the same source as
	# another version: the rollout check's new image.
	make -s image BIN="$T/bin" IMAGE="$IMAGE" IMAGE_ARCHIVE="$T/images/ebpf-cni.tar" >/dev/null
	make -s image BIN="$T/bin2" VERSION=e2e-rollout IMAGE="$IMAGE2" IMAGE_ARCHIVE="$T/images/ebpf-cni-rollout.tar" >/dev/null
	CGO_ENABLED=0 go build -o "$T/bin/" ./test/e2e/e2ebox ./internal/ociimage
	box=$T/bin/e2ebox ociimage=$T/bin/ociimage
	$ociimage -o "$T/images/pause.tar" -name "$PAUSE_IMAGE" -entrypoint /e2ebox,pause e2ebox="$box"
	$ociimage -o "$T/images/e2ebox.tar" -name "$TEST_IMAGE" -entrypoint /e2ebox,serve e2ebox="$box"
	netpoldir=$(printf '%s\n' "${dirs[@]:2}" | grep /netpol- || true)
	cnpdir=$(printf '%s\n' "${dirs[@]:2}" | grep /cnp- || true)
	if [ -n "$netpoldir" ]; then
		# agnhost under the name the netpol suite asks for (build.sh
		# read it from k8s.io/kubernetes's test/utils/image/manifest.go).
		$ociimage -o "$T/images/agnhost.tar" -name "$(cat "$netpoldir/agnhost.image")" \
			-entrypoint /agnhost agnhost="$netpoldir/agnhost"
	fi
	if [ -n "$cnpdir" ]; then
		# agnhost under the name the ClusterNetworkPolicy suite's manifests
		# ask for, with the /bin/bash their containers run (Debian's
		# bash-static); a container without a command pauses, as the
		# upstream image's does.
		$ociimage -o "$T/images/agnhost-cnp.tar" -name "$(cat "$cnpdir/agnhost.image")" \
			-entrypoint /agnhost -cmd pause agnhost="$cnpdir/agnhost" bin/bash=/bin/bash-static
	fi
	if [ -n "$E2E_FROM" ] && [ "${E2E_NETPOL:-}" != only ] && [ "${E2E_CNP:-}" != only ]; then
		# The previous release's binaries, built once from its tree (git
		# archive: the tag, or for v0.1.0 its commit where a clone has no
		# tags) and cached by commit; its image written as make image does.
		prev=$(git rev-parse --verify -q "$E2E_FROM^{commit}" || { [ "$E2E_FROM" = v0.1.0 ] && git rev-parse --verify -q "edc7ee1^{commit}"; }) ||
			die "E2E_FROM=$E2E_FROM: no such tag or commit here"
		PREV_VERSION=${prev:0:7}
		prev_bin="${E2E_CACHE:-/var/cache/ebpf-cni-e2e}/release-$PREV_VERSION"
		if [ ! -x "$prev_bin/ebpf-cni-agent" ]; then
			log "building the previous release $E2E_FROM ($PREV_VERSION) into $prev_bin"
			mkdir -p "$T/src-previous"
			git archive "$prev" | tar -x -C "$T/src-previous"
			make -s -C "$T/src-previous" build BIN="$prev_bin.tmp" VERSION="$PREV_VERSION" >/dev/null
			rm -rf "$prev_bin" "$T/src-previous" && mv "$prev_bin.tmp" "$prev_bin"
		fi
		make -s image-archive BIN="$prev_bin" VERSION="$PREV_VERSION" IMAGE="$PREV_IMAGE" IMAGE_ARCHIVE="$T/images/ebpf-cni-previous.tar" >/dev/null
		export PREV_VERSION
	else
		E2E_FROM=""
	fi
	make -s tools >/dev/null
	export HELM=$root/bin/tools/helm E2E_FROM

	# The cgroup every process of the cluster runs in (kubelet's cgroupRoot).
	# The second node's kubelet has a cgroupRoot of its own below it.
	for h in /sys/fs/cgroup/*/; do
		for d in ebpf-cni-e2e-$id ebpf-cni-e2e-$id/node2; do
			mkdir "$h/$d"
			if [ -f "$h/cpuset.cpus" ]; then
				cat "$h/cpuset.cpus" >"$h/$d/cpuset.cpus"
				cat "$h/cpuset.mems" >"$h/$d/cpuset.mems"
			fi
		done
	done

	log "namespaces $NS_NODE, $NS_NODE2 and $NS_WORLD"
	ip netns add "$NS_WORLD"
	ip -n "$NS_WORLD" link set lo up
	ip -n "$NS_WORLD" link add br0 type bridge mcast_snooping 0
	ip -n "$NS_WORLD" addr add $WORLD_IP4/24 dev br0
	ip -n "$NS_WORLD" addr add $WORLD_IP6/64 dev br0 nodad
	ip -n "$NS_WORLD" link set br0 up
	for n in 1 2; do
		if [ $n = 1 ]; then ns=$NS_NODE ip4=$NODE_IP4 ip6=$NODE_IP6; else ns=$NS_NODE2 ip4=$NODE2_IP4 ip6=$NODE2_IP6; fi
		ip netns add "$ns"
		ip -n "$ns" link add eth0 type veth peer name n$n netns "$NS_WORLD"
		ip -n "$NS_WORLD" link set n$n master br0 up
		ip -n "$ns" link set lo up
		ip -n "$ns" addr add $ip4/24 dev eth0
		ip -n "$ns" addr add $ip6/64 dev eth0 nodad
		ip -n "$ns" link set eth0 up
		ip -n "$ns" route add default via $WORLD_IP4
		ip -n "$ns" -6 route add default via $WORLD_IP6
		ip netns exec "$ns" sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1
	done

	# Mount points the node covers with its own directories; made here
	# only where the machine has none, and removed again.
	for d in $NODE_DIRS; do
		if [ ! -d "$d" ]; then
			local_top=$d
			while [ ! -d "$(dirname "$local_top")" ]; do local_top=$(dirname "$local_top"); done
			mkdir -p "$d"
			# remove from the deepest up
			p=$d
			while :; do made_dirs+=("$p"); [ "$p" = "$local_top" ] && break; p=$(dirname "$p"); done
		fi
	done

	E2E_NETPOL_DIR="" E2E_CNP_DIR=""
	for d in "${dirs[@]:2}"; do
		case $d in */netpol-*) E2E_NETPOL_DIR=$d ;; */cnp-*) E2E_CNP_DIR=$d ;; esac
	done
	export T id NS_NODE NS_NODE2 NS_WORLD E2E_K8S_DIR=${dirs[0]} E2E_CONTAINERD_DIR=${dirs[1]} E2E_NETPOL_DIR E2E_CNP_DIR
	rc=0
	echo $$ >"$T/outer.pid"
	# Into the node: its network namespace, a mount namespace of its own,
	# and the cgroup.
	nsenter --net=/run/netns/"$NS_NODE" unshare --mount --propagation private -- \
		bash -c 'for h in /sys/fs/cgroup/*/ebpf-cni-e2e-'"$id"'; do echo $$ >"$h/cgroup.procs" 2>/dev/null || true; done; exec "$0" node' "$0" || rc=$?
	exit $rc
fi

# ---------------- inside the node ----------------
# log writes to the terminal also from within check (whose output goes to
# checks.log).
exec 3>&2
log() { printf 'e2e: %s\n' "$*" >&3; }
K=$E2E_K8S_DIR
C=$E2E_CONTAINERD_DIR
export PATH=$K:$C:$T/bin:$PATH
export KUBECONFIG=$T/pki/admin.kubeconfig
pids=()
declare -A pid_of
failed=0
summary=()

node_cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	if [ $rc != 0 ] && [ "${E2E_KEEP:-}" = 1 ]; then
		log "E2E_KEEP=1: $T holds the logs; Enter tears down"
		read -r _ || true
	fi
	if [ $rc != 0 ]; then
		for f in "$T"/logs/*.log; do
			[ -f "$f" ] || continue
			log "--- last lines of $(basename "$f")"
			tail -n 15 "$f" >&2
		done
	fi
	# Pods first (their sandboxes are torn down through CNI DEL), then
	# the daemons; the outer cleanup kills what is left in the cgroup.
	timeout 20 kubectl delete --all-namespaces --all pods --grace-period=0 --force --wait=false --request-timeout=5s >/dev/null 2>&1 || true
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	sleep 1
	for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
	exit $rc
}
trap node_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

mkdir -p "$T/logs" "$T/pki" "$T/root"
# The node's own /sys (this network namespace's devices) with the
# machine's cgroup hierarchies, and a bpffs of its own.
mkdir -p "$T/cg"
mount --rbind /sys/fs/cgroup "$T/cg"
mount -t sysfs sysfs /sys
mount --rbind "$T/cg" /sys/fs/cgroup
mount -t bpf bpf /sys/fs/bpf
touch "$T/world.ns" "$T/node2.ns"
mount --bind /run/netns/"$NS_WORLD" "$T/world.ns"
mount --bind /run/netns/"$NS_NODE2" "$T/node2.ns"
for d in $NODE_DIRS; do
	mkdir -p "$T/root$d"
	mount --bind "$T/root$d" "$d"
done
world() { nsenter --net="$T/world.ns" "$@"; }

start() { # name command...: runs a daemon, its output in $T/logs/name.log
	local name=$1
	shift
	# A session of its own: Ctrl-C reaches the script, whose cleanup
	# stops the daemons in order (pods through CNI DEL first).
	setsid "$@" >>"$T/logs/$name.log" 2>&1 &
	pids+=($!)
	pid_of[$name]=$!
}

wait_for() { # seconds what command...: polls until the command succeeds
	local limit=$1 what=$2 t0=$SECONDS
	shift 2
	until "$@" >/dev/null 2>&1; do
		[ $((SECONDS - t0)) -ge "$limit" ] && die "$what: not within $limit s"
		sleep 1
	done
	log "$what ($((SECONDS - t0)) s)"
}

# check NAME COUNT command...: runs the command COUNT times, reports the successes.
check() {
	local name=$1 n=$2 ok=0 out first=""
	shift 2
	for ((i = 0; i < n; i++)); do
		if out=$("$@" 2>&1); then ok=$((ok + 1)); else
			[ -n "$first" ] || first="attempt $((i + 1)): $(printf '%s' "$out" | tail -1)"
		fi
		printf '%s\n' "$out" >>"$T/logs/checks.log"
	done
	summary+=("$name: $ok/$n")
	if [ $ok = "$n" ]; then log "ok   $name: $ok/$n"; else
		log "FAIL $name: $ok/$n (first failed $first; once more now: $("$@" 2>&1 | tail -1))"
		failed=$((failed + 1))
	fi
}

# ---- certificates: one CA; everyone but the kubelet's server is admin ----
cd "$T/pki"
openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj /CN=e2e-ca 2>/dev/null
cert() { # name subject [SANs]
	openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
	if [ -n "${3:-}" ]; then printf 'subjectAltName=%s\n' "$3" >"$1.ext"; else : >"$1.ext"; fi
	openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -out "$1.crt" -extfile "$1.ext" 2>/dev/null
}
cert apiserver /CN=kube-apiserver "IP:$NODE_IP4,IP:$NODE_IP6,IP:10.96.0.1,IP:2001:db8:96::1,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
cert admin "/O=system:masters/CN=admin"
openssl genrsa -out sa.key 2048 2>/dev/null
openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
kubectl config --kubeconfig=admin.kubeconfig set-cluster e2e --server=https://$NODE_IP4:6443 --certificate-authority=ca.crt --embed-certs >/dev/null
kubectl config --kubeconfig=admin.kubeconfig set-credentials admin --client-certificate=admin.crt --client-key=admin.key --embed-certs >/dev/null
kubectl config --kubeconfig=admin.kubeconfig set-context e2e --cluster=e2e --user=admin >/dev/null
kubectl config --kubeconfig=admin.kubeconfig use-context e2e >/dev/null
cd "$root"

# ---- control plane ----
start etcd etcd --name e2e --data-dir "$T/etcd" \
	--listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
	--listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
	--initial-cluster e2e=http://127.0.0.1:2380
start kube-apiserver kube-apiserver --etcd-servers=http://127.0.0.1:2379 \
	--advertise-address=$ADVERTISE --bind-address=$BIND --secure-port=6443 \
	--tls-cert-file="$T/pki/apiserver.crt" --tls-private-key-file="$T/pki/apiserver.key" \
	--client-ca-file="$T/pki/ca.crt" --authorization-mode=Node,RBAC --allow-privileged=true \
	--service-account-issuer=https://kubernetes.default.svc --service-account-key-file="$T/pki/sa.pub" \
	--service-account-signing-key-file="$T/pki/sa.key" --service-cluster-ip-range=$SERVICE_CIDRS \
	--kubelet-preferred-address-types=InternalIP,Hostname \
	--kubelet-client-certificate="$T/pki/admin.crt" --kubelet-client-key="$T/pki/admin.key"
wait_for 120 "kube-apiserver is up" kubectl get --raw /readyz
start kube-controller-manager kube-controller-manager --kubeconfig="$KUBECONFIG" --leader-elect=false \
	--allocate-node-cidrs --cluster-cidr=$CLUSTER_CIDRS --node-cidr-mask-size-ipv4=24 --node-cidr-mask-size-ipv6=64 \
	--service-cluster-ip-range=$SERVICE_CIDRS --service-account-private-key-file="$T/pki/sa.key" \
	--root-ca-file="$T/pki/ca.crt" --use-service-account-credentials=false --bind-address=127.0.0.1
start kube-scheduler kube-scheduler --kubeconfig="$KUBECONFIG" --leader-elect=false --bind-address=127.0.0.1

# ---- the second node's namespaces ----
# Its mount namespace is a copy of this one (made now, after the binds
# above) with its own binds on top; in2 runs a command in it.
nsenter --net="$T/node2.ns" unshare --mount --propagation private -- "$0" node2 >>"$T/logs/node2.log" 2>&1 &
pids+=($!)
wait_for 10 "second node's mounts" test -s "$T/node2.pid"
N2PID=$(cat "$T/node2.pid")
IN2=(nsenter -t "$N2PID" -m -n --)
in2() { "${IN2[@]}" "$@"; }
on() { # node command...: runs the command on node 1 (here) or 2
	local n=$1
	shift
	if [ "$n" = 2 ]; then in2 "$@"; else "$@"; fi
}

# ---- other plugins' files, on the nodes before ebpf-cni ----
# Both nodes have a plugin binary of another project, e2e-record (e2ebox as
# a CNI plugin), and a conflist that sorts after ebpf-cni's. The first
# node's (1.1.0) names a plugin this node does not have: a runtime that
# takes it fails STATUS, so the node is NotReady until ebpf-cni's conflist
# sorts before it. The second node's is podman's default, and that node
# also has a Multus-like meta plugin's conflist that sorts before
# ebpf-cni's and runs ebpf-cni's conflist as its delegate: containerd takes
# the first file, so every pod of the second node and every STATUS of its
# runtime go through it. Install, the rollouts and uninstall must leave
# these byte for byte. After the init container's install, "another
# installer" appends e2e-record to ebpf-cni's own conflist, as istio-cni
# appends itself.
RECORD_LOG=/var/lib/cni/e2e-record.log
DELEGATE_LOG=/var/lib/cni/e2e-delegate.log
CONFLIST=/etc/cni/net.d/10-ebpf-cni.conflist
foreign_files() { # node: the other plugins' files on it
	if [ "$1" = 2 ]; then
		echo /opt/cni/bin/e2e-record /etc/cni/net.d/00-e2e-delegate.conflist /etc/cni/net.d/87-podman-bridge.conflist
	else
		echo /opt/cni/bin/e2e-record /etc/cni/net.d/99-e2e-other.conflist
	fi
}
place_foreign() { # node
	on "$1" install -m 0755 "$T/bin/e2ebox" /opt/cni/bin/e2e-record
	if [ "$1" = 1 ]; then
		tee /etc/cni/net.d/99-e2e-other.conflist >/dev/null <<'EOF'
{
  "cniVersion": "1.1.0",
  "name": "e2e-other",
  "plugins": [{ "type": "e2e-absent" }]
}
EOF
		sha256sum $(foreign_files 1) >"$T/foreign1.sha256"
		return
	fi
	on 2 tee /etc/cni/net.d/87-podman-bridge.conflist >/dev/null <<'EOF'
{
  "cniVersion": "0.4.0",
  "name": "podman",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni-podman0",
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "routes": [{ "dst": "0.0.0.0/0" }],
        "ranges": [[{ "subnet": "10.88.0.0/16", "gateway": "10.88.0.1" }]]
      }
    },
    { "type": "portmap", "capabilities": { "portMappings": true } },
    { "type": "firewall" },
    { "type": "tuning" }
  ]
}
EOF
	on 2 tee /etc/cni/net.d/00-e2e-delegate.conflist >/dev/null <<EOF
{
  "cniVersion": "1.1.0",
  "name": "e2e-delegate",
  "plugins": [
    {
      "type": "e2e-record",
      "log": "$DELEGATE_LOG",
      "delegate": "$CONFLIST",
      "capabilities": { "bandwidth": true, "ips": true, "mac": true, "portMappings": true }
    }
  ]
}
EOF
	on 2 sha256sum $(foreign_files 2) >"$T/foreign2.sha256"
}
foreign_same() { on "$1" sha256sum --check --quiet "$T/foreign$1.sha256"; }
place_foreign 1
place_foreign 2

# ---- containerd 2.x, one per node ($T/containerd for the first, $T/containerd2) ----
containerd_config() { # dir
	mkdir -p "$1"
	cat >"$1/config.toml" <<EOF
version = 3
root = "$1/root"
state = "$1/state"
[grpc]
  address = "$1/containerd.sock"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "native"
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "$PAUSE_IMAGE"
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = ["/opt/cni/bin"]
  conf_dir = "/etc/cni/net.d"
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  BinaryName = "$(command -v runc)"
  SystemdCgroup = false
EOF
}
containerd_config "$T/containerd"
containerd_config "$T/containerd2"
start_containerd() { start containerd containerd --config "$T/containerd/config.toml"; }
start_containerd
start containerd2 "${IN2[@]}" containerd --config "$T/containerd2/config.toml"
CTR=(ctr --address "$T/containerd/containerd.sock" -n k8s.io)
CTR2=(ctr --address "$T/containerd2/containerd.sock" -n k8s.io)
wait_for 60 "containerd is up" "${CTR[@]}" version
wait_for 60 "the second node's containerd is up" "${CTR2[@]}" version
images="pause e2ebox ebpf-cni ebpf-cni-rollout"
[ -n "$E2E_FROM" ] && images="$images ebpf-cni-previous"
[ -n "$E2E_NETPOL_DIR" ] && images="$images agnhost"
[ -n "$E2E_CNP_DIR" ] && images="$images agnhost-cnp"
for img in $images; do
	for c in CTR CTR2; do
		declare -n ctr_cmd=$c
		"${ctr_cmd[@]}" images import --local --snapshotter native --platform linux/amd64 "$T/images/$img.tar" >/dev/null 2>"$T/logs/ctr.log" || die "ctr import $img ($c): $(tail -1 "$T/logs/ctr.log")"
	done
done
log "images imported: $("${CTR[@]}" images ls -q 2>/dev/null | grep 'localhost\|agnhost' | tr "\n" " ")"

# ---- kubelet and kube-proxy, one each per node ----
: >"$T/resolv.conf"
kubelet_config() { # file cgroupRoot containerd-dir [extra yaml]
	cat >"$1" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
cgroupRoot: $2
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$3/containerd.sock
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $T/pki/ca.crt}
authorization: {mode: AlwaysAllow}
readOnlyPort: 0
resolvConf: $T/resolv.conf
podLogsDir: /var/log/pods
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
localStorageCapacityIsolation: false
maxPods: 250
${4:-}
EOF
}
kubelet_config "$T/kubelet.yaml" "/ebpf-cni-e2e-$id" "$T/containerd"
kubelet_config "$T/kubelet2.yaml" "/ebpf-cni-e2e-$id/node2" "$T/containerd2" \
	"registerWithTaints: [{key: $NODE2_TAINT, effect: NoSchedule}]"
start_kubelet() {
	start kubelet kubelet --config="$T/kubelet.yaml" --kubeconfig="$KUBECONFIG" --hostname-override=$NODE \
		--node-ip=$NODE_IPS --root-dir=/var/lib/kubelet --cert-dir="$T/kubelet-pki" -v=2
}
start_kubelet
start kubelet2 "${IN2[@]}" kubelet --config="$T/kubelet2.yaml" --kubeconfig="$KUBECONFIG" --hostname-override=$NODE2 \
	--node-ip=$NODE2_IPS --root-dir=/var/lib/kubelet --cert-dir="$T/kubelet2-pki" -v=2

kube_proxy() { # mode: (re)starts kube-proxy in that mode, on both nodes
	local n name pre
	for n in 1 2; do
		if [ $n = 1 ]; then name=$NODE pre=(); else name=$NODE2 pre=("${IN2[@]}"); fi
		cat >"$T/kube-proxy$n-$1.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $KUBECONFIG}
hostnameOverride: $name
mode: $1
clusterCIDR: "$CLUSTER_CIDRS"
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
		start "kube-proxy$n-$1" "${pre[@]}" kube-proxy --config="$T/kube-proxy$n-$1.yaml"
		kp_pid[$n]=${pids[-1]}
	done
}
declare -A kp_pid
kube_proxy iptables

# ---- check: NotReady, then Ready through the DaemonSet's CNI STATUS ----
# (each takes a node name; the first node's by default)
node_ready() { kubectl get node ${1:-$NODE} -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}'; }
node_cond() { kubectl get node ${1:-$NODE} -o jsonpath='{.status.conditions[?(@.type=="Ready")].message}'; }
has_cidrs() { test -n "$(kubectl get node ${1:-$NODE} -o jsonpath='{.spec.podCIDRs}')"; }
is_ready() { test "$(node_ready "$@")" = True; }
for nn in $NODE $NODE2; do
	wait_for 120 "node $nn registered" kubectl get node $nn
	wait_for 60 "node $nn has podCIDRs" has_cidrs $nn
done
sleep 5
for nn in $NODE $NODE2; do
	notready_ok=0
	[ "$(node_ready $nn)" = False ] && node_cond $nn | grep -qi "network plugin\|cni" && notready_ok=1
	log "$nn before the DaemonSet: Ready=$(node_ready $nn): $(node_cond $nn)"
	summary+=("$nn NotReady without a network plugin: $notready_ok/1")
	[ $notready_ok = 1 ] || failed=$((failed + 1))
done
# ---- ebpf-cni through its Helm chart (deploy/helm/ebpf-cni) ----
# The cluster's ranges as values; the image: the previous release's first
# (E2E_FROM: the upgrade and downgrade checks), else this tree's. Helm's
# own files stay in $T.
export HELM_CACHE_HOME=$T/helm/cache HELM_CONFIG_HOME=$T/helm/config HELM_DATA_HOME=$T/helm/data
cat >"$T/values.yaml" <<EOF
config:
  clusterCIDRs: "$CLUSTER_CIDRS"
  serviceCIDRs: "$SERVICE_CIDRS"
EOF
helm_deploy() { # install|upgrade image: the chart with these values and that image
	"$HELM" "$1" ebpf-cni "$root/deploy/helm/ebpf-cni" --namespace kube-system -f "$T/values.yaml" \
		--set image.repository="${2%:*}" --set image.tag="${2##*:}"
}
THIS_VERSION=$("$T/bin/ebpf-cni" version | awk 'NR == 1 {print $2}')
if [ -n "$E2E_FROM" ]; then START_IMAGE=$PREV_IMAGE START_VERSION=$PREV_VERSION; else START_IMAGE=$IMAGE START_VERSION=$THIS_VERSION; fi
helm_deploy install "$START_IMAGE" >"$T/logs/helm.log" 2>&1 || die "helm install: $(tail -3 "$T/logs/helm.log")"
t0=$SECONDS
for nn in $NODE $NODE2; do
	wait_for 180 "$nn Ready after the DaemonSet" is_ready $nn
	summary+=("$nn Ready through the DaemonSet (helm install, $START_IMAGE): 1/1 ($((SECONDS - t0)) s)")
done
wait_for 120 "ebpf-cni DaemonSet pods Ready" kubectl -n kube-system rollout status ds/ebpf-cni --timeout=5s
for n in 1 2; do
	on $n test -x /opt/cni/bin/ebpf-cni && on $n test -x /opt/cni/bin/loopback || die "the init container did not install the plugins on node $n"
done
log "conflist: $(tr -d ' \n' <$CONFLIST | cut -c1-200)"

# Another installer (istio-cni's way) appends its plugin to ebpf-cni's
# conflist; the rollouts of this tree keep it there.
append_recorder() { # node
	on "$1" python3 - "$CONFLIST" "$RECORD_LOG" <<'PY'
import json, os, sys
path, log = sys.argv[1], sys.argv[2]
l = json.load(open(path))
if not any(p.get("type") == "e2e-record" for p in l["plugins"]):
    l["plugins"].append({"type": "e2e-record", "log": log})
    with open(path + ".tmp", "w") as f:
        json.dump(l, f, indent=2)
    os.rename(path + ".tmp", path)
PY
}
chained_recorder() { # node: ebpf-cni's conflist runs ebpf-cni first and e2e-record after it
	on "$1" python3 -c 'import json, sys
t = [p.get("type") for p in json.load(open(sys.argv[1]))["plugins"]]
print(t)
sys.exit(0 if t[0] == "ebpf-cni" and "e2e-record" in t[1:] else 1)' "$CONFLIST"
}
append_recorder 1
append_recorder 2

# ---- check: NotReady while STATUS fails (no bpffs), Ready again once repaired ----
is_not_ready() { test "$(node_ready)" = False; }
no_bpffs_check() {
	local t0
	mount -t tmpfs e2e-no-bpffs /sys/fs/bpf
	t0=$SECONDS
	wait_for 90 "node NotReady while the node has no bpffs" is_not_ready
	log "condition: $(node_cond)"
	summary+=("node NotReady while CNI STATUS fails (no bpffs): 1/1 ($((SECONDS - t0)) s)")
	umount /sys/fs/bpf
	t0=$SECONDS
	wait_for 90 "node Ready again with the bpffs back" is_ready
	summary+=("node Ready again once STATUS passes: 1/1 ($((SECONDS - t0)) s)")
}

# ---- the upstream NetworkPolicy e2e tests (E2E_NETPOL=1) ----
# k8s.io/kubernetes's test/e2e/network/netpol at the cluster's version
# (test/e2e/netpol), its pods on both nodes (the second node's taint is
# lifted for it). Every spec's outcome goes to the summary, each skip with
# its reason: SCTP ones when the kernel has no SCTP, the rest as the suite
# decides. Its log: $T/logs/netpol.log.
netpol_e2e() {
	local skip="" focus=${E2E_NETPOL_FOCUS:-} procs=${E2E_NETPOL_PROCS:-2} t0=$SECONDS rc=0
	local report="$T/logs/netpol-report.json"
	kubectl taint node $NODE2 $NODE2_TAINT- >/dev/null
	# The SCTP specs need the kernel's sctp (not loaded from here: the
	# module would be the machine's).
	if [ ! -d /proc/sys/net/sctp ]; then skip='\[Feature:SCTPConnectivity\]'; fi
	log "netpol: the upstream NetworkPolicy e2e tests${focus:+ (focus: $focus)}${skip:+, without SCTP (the kernel has none)}, $procs at a time; log in $T/logs/netpol.log"
	# ginkgo runs the compiled suite in $procs processes (the specs
	# mostly wait: pods, probes, namespace deletion).
	"$E2E_NETPOL_DIR/ginkgo" run --procs="$procs" --no-color -v \
		--focus="${focus:-Netpol}" ${skip:+--skip="$skip"} \
		--output-dir="$T/logs" --json-report="$(basename "$report")" \
		"$E2E_NETPOL_DIR/netpol.test" -- -kubeconfig="$KUBECONFIG" -provider=skeleton \
		>"$T/logs/netpol.log" 2>&1 || rc=$?
	log "netpol: done in $((SECONDS - t0)) s (exit $rc)"
	if [ ! -s "$report" ]; then
		summary+=("netpol e2e: no report (exit $rc; $(tail -1 "$T/logs/netpol.log"))")
		failed=$((failed + 1))
		return
	fi
	# The counts, one line per spec that failed or was skipped (with the
	# failure's first line or the skip's reason: the suite's own, or no
	# SCTP), then the number of failures. The specs E2E_NETPOL_FOCUS
	# leaves out are only counted.
	local lines nfail
	lines=()
	mapfile -t lines < <(python3 - "$report" "${focus:-Netpol}" "$skip" <<'PY'
import json, re, sys
report, focus, skip = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3]
counts, out = {}, []
for suite in report:
    for s in suite.get("SpecReports") or []:
        if s.get("LeafNodeType") != "It":
            continue
        name = " ".join((s.get("ContainerHierarchyTexts") or []) + [s.get("LeafNodeText", "")])
        state = s["State"]
        counts[state] = counts.get(state, 0) + 1
        if state == "passed":
            continue
        why = (s.get("Failure") or {}).get("Message", "").strip().splitlines()
        why = why[0][:300] if why else ""
        if state == "skipped" and not why:
            if not re.search(focus, name) or not (skip and re.search(skip, name)):
                counts["left out by E2E_NETPOL_FOCUS"] = counts.get("left out by E2E_NETPOL_FOCUS", 0) + 1
                counts[state] -= 1
                continue
            why = "the kernel has no SCTP"
        out.append(f"netpol {state}: {name.strip()} ({s['RunTime'] / 1e9:.0f} s): {why}")
left = counts.pop("left out by E2E_NETPOL_FOCUS", 0)
total = sum(counts.values())
print(f"netpol e2e: {counts.get('passed', 0)}/{total} passed" + "".join(f", {n} {k}" for k, n in sorted(counts.items()) if n and k != "passed") + (f" ({left} left out by E2E_NETPOL_FOCUS)" if left else ""))
for line in out:
    print(line)
print(counts.get("failed", 0) + counts.get("panicked", 0) + counts.get("timedout", 0) + counts.get("interrupted", 0) + counts.get("aborted", 0))
PY
	)
	if [ ${#lines[@]} -lt 2 ]; then
		summary+=("netpol e2e: the report $report could not be read")
		failed=$((failed + 1))
		return
	fi
	nfail=${lines[-1]}
	unset 'lines[-1]'
	summary+=("${lines[@]}")
	log "${lines[0]} ($((SECONDS - t0)) s)"
	if [ "$nfail" != 0 ] || [ $rc != 0 ]; then failed=$((failed + 1)); fi
}
# ---- the ClusterNetworkPolicy conformance suite (E2E_CNP=1) ----
# sigs.k8s.io/network-policy-api's suite (test/e2e/cnp), profile
# ClusterNetworkPolicy, with the features E2E_CNP_FEATURES names (the
# standard ClusterNetworkPolicy by default). Its CRD applied if the chart
# has not (server-side: the chart's crds/ may hold the same), the SCTP
# tests skipped when the kernel has none (reported as SKIPPED; the base
# pods then start without their SCTP servers). Its
# ConformanceReport goes to test/e2e/cnp/report-ipv<family>.yaml (committed), every
# test's outcome to the summary. Its log: $T/logs/cnp.log.
cnp_e2e() {
	local t0=$SECONDS rc=0 skip="" features=${E2E_CNP_FEATURES:-ClusterNetworkPolicy,ClusterNetworkPolicyNamedPorts} report="$root/test/e2e/cnp/report-ipv$CNP_FAMILY.yaml"
	# The suite's host-network pods take the same ports: two of a
	# StatefulSet need both nodes.
	kubectl taint node $NODE2 $NODE2_TAINT- >/dev/null 2>&1 || true
	# The experimental CRD where an experimental feature is claimed (the
	# standard one prunes its fields: the named-port tests' patches fail).
	local crd=crd.yaml
	case ,$features, in *,ClusterNetworkPolicyNamedPorts,* | *,ClusterNetworkPolicyEgressNodePeers,*) crd=crd-experimental.yaml ;; esac
	kubectl apply --server-side --force-conflicts -f "$E2E_CNP_DIR/$crd" >/dev/null
	wait_for 60 "the ClusterNetworkPolicy CRD established" kubectl wait --for=condition=Established crd/clusternetworkpolicies.policy.networking.k8s.io --timeout=5s
	if [ ! -d /proc/sys/net/sctp ]; then skip=$(paste -sd, "$E2E_CNP_DIR/sctp.tests"); fi
	# The suite pokes primary addresses: a pod's is of the cluster's first family.
	kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: cnp-family}
spec:
  containers: [{name: c, image: $TEST_IMAGE, imagePullPolicy: Never}]
EOF
	kubectl wait --for=condition=Ready pod/cnp-family --timeout=60s >/dev/null
	local primary
	primary=$(kubectl get pod cnp-family -o jsonpath='{.status.podIP}')
	kubectl delete pod cnp-family --grace-period=1 >/dev/null
	check "cnp: a pod's primary address ($primary) is IPv$CNP_FAMILY, the family the suite pokes" 1 \
		python3 -c 'import ipaddress, sys; sys.exit(ipaddress.ip_address(sys.argv[1]).version != int(sys.argv[2]))' "$primary" "$CNP_FAMILY"
	log "cnp: the ClusterNetworkPolicy conformance suite (features: $features)${skip:+, without SCTP (the kernel has none: $skip)}; log in $T/logs/cnp.log"
	"$E2E_CNP_DIR/cnp.test" -test.v -test.timeout 90m -kubeconfig "$KUBECONFIG" \
		-conformance-profiles ClusterNetworkPolicy -supported-features "$features" \
		${skip:+-skip-tests "$skip" -base-manifests base/manifests-nosctp.yaml} \
		-organization ebpf-cni -project ebpf-cni -url https://github.com/ebpf-cni/ebpf-cni \
		-version "$THIS_VERSION" -contact "docs/networkpolicy.md" \
		-additional-info "make e2e E2E_CNP=1: two nodes, Kubernetes $(basename "$E2E_K8S_DIR" | sed 's/kubernetes-//'), kube-proxy, IPv$CNP_FAMILY first of a dual stack" \
		${E2E_CNP_RUN:+-test.run "TestConformanceProfiles/($E2E_CNP_RUN)"} \
		-report-output "$T/cnp-report.yaml" >"$T/logs/cnp.log" 2>&1 || rc=$?
	log "cnp: done in $((SECONDS - t0)) s (exit $rc)"
	cp "$T/logs/cnp.log" "$root/test/e2e/cnp/last-run-ipv$CNP_FAMILY.log" # not committed: to read after the run
	# A report of some tests only (E2E_CNP_RUN) is not the suite's: the
	# others would read as passed.
	[ -s "$T/cnp-report.yaml" ] && [ -z "${E2E_CNP_RUN:-}" ] && cp "$T/cnp-report.yaml" "$report"
	local lines nfail
	lines=()
	mapfile -t lines < <(python3 - "$T/logs/cnp.log" "$skip" <<'PY'
import re, sys
log, skip = open(sys.argv[1]).read(), set(filter(None, sys.argv[2].split(",")))
# The protocols of the failed pokes, by test (its subtests' included).
pokes, cur = {}, ""
for line in log.splitlines():
    m = re.match(r"^=== RUN\s+TestConformanceProfiles/(\S+)", line)
    if m:
        cur = m.group(1)
        continue
    m = re.search(r"FAILED Command was \[/agnhost connect .*--protocol=(\w+)", line)
    if m and cur:
        for name in (cur, cur.split("/")[0]):
            pokes.setdefault(name, {}).setdefault(m.group(1), 0)
            pokes[name][m.group(1)] += 1
counts, out = {}, []
for m in re.finditer(r"^\s*--- (PASS|FAIL|SKIP): TestConformanceProfiles/(\S+) \(([\d.]+)s\)", log, re.M):
    state, name, secs = m.group(1).lower(), m.group(2), float(m.group(3))
    if state == "pass" and name in skip:
        state = "skipped (the kernel has no SCTP)"
    counts[state] = counts.get(state, 0) + 1
    if state != "pass":
        p = pokes.get(name)
        why = (": failed pokes " + ", ".join(f"{k} x{n}" for k, n in sorted(p.items()))) if p else ""
        out.append(f"cnp {state}: {name} ({secs:.0f} s){why}")
total = sum(counts.values())
print(f"cnp conformance: {counts.get('pass', 0)}/{total} passed" + "".join(f", {n} {k}" for k, n in sorted(counts.items()) if n and k != "pass"))
for line in out:
    print(line)
print(counts.get("fail", 0) if total else 1)
PY
	)
	nfail=${lines[-1]}
	unset 'lines[-1]'
	summary+=("${lines[@]}")
	log "${lines[0]} ($((SECONDS - t0)) s; report: test/e2e/cnp/report-ipv$CNP_FAMILY.yaml)"
	if [ "$nfail" != 0 ] || [ $rc != 0 ]; then failed=$((failed + 1)); fi
}

# ---- the checks (all of them but with E2E_NETPOL=only or E2E_CNP=only) ----
checks() {
# ---- workloads ----
kubectl apply -f - >/dev/null <<EOF
apiVersion: apps/v1
kind: Deployment
metadata: {name: echo}
spec:
  replicas: 2
  selector: {matchLabels: {app: echo}}
  template:
    metadata: {labels: {app: echo}}
    spec:
      containers:
        - name: echo
          image: $TEST_IMAGE
          imagePullPolicy: Never
          ports: [{containerPort: 8080}, {containerPort: 8081, protocol: UDP}]
---
apiVersion: v1
kind: Pod
metadata: {name: client}
spec:
  containers:
    - name: client
      image: $TEST_IMAGE
      imagePullPolicy: Never
---
apiVersion: v1
kind: Pod
metadata: {name: hostport}
spec:
  containers:
    - name: hostport
      image: $TEST_IMAGE
      imagePullPolicy: Never
      ports: [{containerPort: 8080, hostPort: 30080}]
---
apiVersion: v1
kind: Service
metadata: {name: echo}
spec:
  type: NodePort
  ipFamilyPolicy: PreferDualStack
  selector: {app: echo}
  ports:
    - {name: tcp, port: 80, targetPort: 8080, protocol: TCP}
    - {name: udp, port: 81, targetPort: 8081, protocol: UDP}
---
# The second node's: a client and an echo pod, and a Service of that pod.
apiVersion: v1
kind: Pod
metadata: {name: client2}
spec:
  nodeName: $NODE2
  tolerations: [{key: $NODE2_TAINT, operator: Exists}]
  containers: [{name: c, image: $TEST_IMAGE, imagePullPolicy: Never}]
---
apiVersion: v1
kind: Pod
metadata: {name: echo2, labels: {app: echo2}}
spec:
  nodeName: $NODE2
  tolerations: [{key: $NODE2_TAINT, operator: Exists}]
  containers: [{name: c, image: $TEST_IMAGE, imagePullPolicy: Never}]
---
apiVersion: v1
kind: Service
metadata: {name: echo2}
spec:
  ipFamilyPolicy: PreferDualStack
  selector: {app: echo2}
  ports:
    - {name: tcp, port: 80, targetPort: 8080, protocol: TCP}
    - {name: udp, port: 81, targetPort: 8081, protocol: UDP}
EOF
wait_for 180 "pods Running" kubectl wait --for=condition=Ready pod --all --timeout=5s
mapfile -t cidrs < <(kubectl get node $NODE -o jsonpath='{range .spec.podCIDRs[*]}{@}{"\n"}{end}')
mapfile -t cidrs2 < <(kubectl get node $NODE2 -o jsonpath='{range .spec.podCIDRs[*]}{@}{"\n"}{end}')
log "podCIDRs: $NODE ${cidrs[*]}, $NODE2 ${cidrs2[*]}"
mapfile -t echo_ips < <(kubectl get pod -l app=echo -o jsonpath='{range .items[*]}{range .status.podIPs[*]}{.ip}{"\n"}{end}{end}')
mapfile -t echo2_ips < <(kubectl get pod echo2 -o jsonpath='{range .status.podIPs[*]}{.ip}{"\n"}{end}')
mapfile -t cluster_ips < <(kubectl get svc echo -o jsonpath='{range .spec.clusterIPs[*]}{@}{"\n"}{end}')
mapfile -t cluster2_ips < <(kubectl get svc echo2 -o jsonpath='{range .spec.clusterIPs[*]}{@}{"\n"}{end}')
hostport() { case $1 in *:*) echo "[$1]:$2" ;; *) echo "$1:$2" ;; esac; }
pod_get() { kubectl exec client -- /e2ebox get "$@"; }
pod2_get() { kubectl exec client2 -- /e2ebox get "$@"; }
node_name() { if [ "$1" = 2 ]; then echo $NODE2; else echo $NODE; fi; }
pod_state() { kubectl get pods -o jsonpath='{range .items[*]}{.metadata.name}{" "}{.status.podIP}{" "}{.status.containerStatuses[0].restartCount}{"\n"}{end}' | sort; }
# The node's endpoints as the installed plugin's CLI lists them (the
# release the node runs).
endpoint_list() { on "${1:-1}" /opt/cni/bin/ebpf-cni endpoints -o json | python3 -c 'import json,sys; print(sorted((e["containerID"], e["hostIfindex"], tuple(e["ips"])) for e in json.load(sys.stdin) or []))'; }

# traffic_start: the client pod sends a request to the echo ClusterIP
# every 0.2 s until traffic_stop, which sets traffic_ok and traffic_sent
# (answered, sent). One at a time.
traffic_start() {
	rm -f "$T/traffic.stop" "$T/traffic"
	(
		ok=0 n=0
		while [ ! -e "$T/traffic.stop" ]; do
			n=$((n + 1))
			pod_get -timeout 1s "$(hostport "${cluster_ips[0]}" 80)" >/dev/null 2>&1 && ok=$((ok + 1))
			sleep 0.2
		done
		echo "$ok $n" >"$T/traffic"
	) &
	traffic_pid=$!
}
traffic_stop() { # (not in a subshell: it waits for traffic_start's)
	touch "$T/traffic.stop"
	wait "$traffic_pid" || true
	read -r traffic_ok traffic_sent <"$T/traffic"
}
# In place: the build's STATUS loaded its programs and moved every endpoint
# to them; nothing of the build before stays pinned.
upgraded_in_place() { # node version
	on "$1" /opt/cni/bin/ebpf-cni status -o json >"$T/status-rollout-$1.json" || true
	python3 -c '
import json, sys
st = json.load(open(sys.argv[1]))
sets = st["programs"]
eps = st["endpoints"]
ok = len(sets) == 1 and sets[0]["version"] == sys.argv[2] and eps > 0 and \
    any(p["hook"] == "from_container" and p["endpoints"] == eps for p in sets[0]["programs"])
if not ok:
    print("programs pinned:", [(s["version"], [(p["hook"], p["endpoints"]) for p in s["programs"]]) for s in sets], "endpoints:", eps)
sys.exit(0 if ok else 1)' "$T/status-rollout-$1.json" "$2"
}
rolled_to() { # image: the DaemonSet rolled out, its one pod on each node running the image
	kubectl -n kube-system rollout status ds/ebpf-cni --timeout=5s >/dev/null || return 1
	local imgs
	imgs=$(kubectl -n kube-system get pods -l app.kubernetes.io/name=ebpf-cni -o jsonpath='{range .items[*]}{.spec.nodeName}={.spec.containers[0].image}{" "}{end}')
	[ "$(wc -w <<<"$imgs")" = 2 ] && [[ " $imgs " == *" $NODE=$1 "* ]] && [[ " $imgs " == *" $NODE2=$1 "* ]]
}
# roll WHAT IMAGE VERSION command...: the command (helm upgrade or
# rollback) rolls the DaemonSet to IMAGE (the plugins' VERSION) with the
# workloads running: the client's requests to the echo ClusterIP go on the
# whole time; no pod restarts or changes address; each node keeps its
# endpoints, all moved in place to VERSION's programs, and its status is
# clean (the installed CLI's); the other plugins' files stay as they were.
roll() {
	local what=$1 image=$2 version=$3 n nn t0=$SECONDS before_pods before_eps1 before_eps2
	shift 3
	before_pods=$(pod_state) before_eps1=$(endpoint_list 1) before_eps2=$(endpoint_list 2)
	log "$what: $*"
	traffic_start
	if ! "$@" >>"$T/logs/helm.log" 2>&1; then
		traffic_stop
		die "$what: $* failed: $(tail -3 "$T/logs/helm.log")"
	fi
	wait_for 240 "$what: the DaemonSet rolled out to $image" rolled_to "$image"
	traffic_stop
	summary+=("$what: rolled out to $image in $((SECONDS - t0)) s")
	check "$what: ClusterIP from a pod during the rollout ($traffic_ok/$traffic_sent)" 1 test "$traffic_ok" = "$traffic_sent" -a "$traffic_sent" -gt 0
	for n in 1 2; do
		nn=$(node_name $n)
		check "$what: /opt/cni/bin/ebpf-cni is $version on $nn" 1 grep -qx "ebpf-cni $version" <(on $n /opt/cni/bin/ebpf-cni version)
		check "$what: ebpf-cni status clean on $nn" 1 on $n /opt/cni/bin/ebpf-cni status
		check "$what: every endpoint of $nn runs $version's programs (moved in place)" 1 upgraded_in_place $n "$version"
		check "$what: the other plugins' files on $nn unchanged" 1 foreign_same $n
	done
	check "$what: no pod restarted or changed address" 1 test "$(pod_state)" = "$before_pods"
	check "$what: the same endpoints on $NODE" 1 test "$(endpoint_list 1)" = "$before_eps1"
	check "$what: the same endpoints on $NODE2" 1 test "$(endpoint_list 2)" = "$before_eps2"
	check "$what: pod to pod after it" 5 pod_get "$(hostport "${echo_ips[0]}" 8080)"
	check "$what: pod to pod across the nodes after it" 5 pod_get "$(hostport "${echo2_ips[0]}" 8080)"
}

# ---- check: the upgrade from the previous release (E2E_FROM) ----
# The workloads started on it; the chart upgraded to this tree's image.
if [ -n "$E2E_FROM" ]; then
	check "on $E2E_FROM ($PREV_VERSION): ClusterIP from a pod" 5 pod_get "$(hostport "${cluster_ips[0]}" 80)"
	roll "upgrade from $E2E_FROM" "$IMAGE" "$THIS_VERSION" helm_deploy upgrade "$IMAGE"
	for n in 1 2; do
		check "upgrade from $E2E_FROM: e2e-record (another installer's) still chained after ebpf-cni on $(node_name $n)" 1 chained_recorder $n
	done
fi
no_bpffs_check

# ---- check: dual-stack pod addresses from the Node's podCIDRs ----
in_cidrs() { # pod ranges...: both of the pod's addresses are in the node's ranges, one per family
	local pod=$1
	shift
	python3 - "$(kubectl get pod "$pod" -o jsonpath='{range .status.podIPs[*]}{.ip}{" "}{end}')" "$@" <<'PY'
import ipaddress, sys
ips = [ipaddress.ip_address(a) for a in sys.argv[1].split()]
nets = [ipaddress.ip_network(n) for n in sys.argv[2:]]
assert len(ips) == 2 and {a.version for a in ips} == {4, 6}, ips
for a in ips:
    assert any(a in n for n in nets), (a, nets)
PY
}
pods=(client hostport $(kubectl get pod -l app=echo -o jsonpath='{.items[*].metadata.name}'))
n=0
for p in "${pods[@]}"; do in_cidrs "$p" "${cidrs[@]}" && n=$((n + 1)); done
for p in client2 echo2; do in_cidrs "$p" "${cidrs2[@]}" && n=$((n + 1)); done
summary+=("dual-stack pod addresses in their node's podCIDRs: $n/$((${#pods[@]} + 2))")
[ $n = $((${#pods[@]} + 2)) ] || { failed=$((failed + 1)); log "FAIL pod addresses"; }
[ "$(kubectl get pod echo2 -o jsonpath='{.spec.nodeName}')" = $NODE2 ] || die "echo2 is not on $NODE2"
[ -z "$(kubectl get pods --field-selector spec.nodeName=$NODE2 -o name | grep -v 'pod/client2$\|pod/echo2$')" ] || die "pods other than client2 and echo2 on $NODE2"

# ---- check: the agents' routes: each node reaches the other's pod ranges via its address ----
agent_routes() { # node peer-address ranges...: every range routed via the peer (proto 236, the agent's)
	local n=$1 via=$2 r
	shift 2
	for r in "$@"; do
		case $r in *:*) f=-6 ;; *) f=-4 ;; esac
		on "$n" ip $f route show proto 236 "$r" | grep -q "via $via " || return 1
	done
}
check "routes: $NODE reaches $NODE2's pod ranges via $NODE2_IP4/$NODE2_IP6" 1 \
	agent_routes 1 "$NODE2_IP4\|$NODE2_IP6" "${cidrs2[@]}"
check "routes: $NODE2 reaches $NODE's pod ranges via $NODE_IP4/$NODE_IP6" 1 \
	agent_routes 2 "$NODE_IP4\|$NODE_IP6" "${cidrs[@]}"

# ---- check: the agents' metrics on each node's port (the DaemonSet's 9967) ----
agent_metrics() { # node: /metrics answers with the datapath's counters, and the agent is ready
	on "$1" python3 -c 'import sys, urllib.request
t = urllib.request.urlopen("http://127.0.0.1:9967/metrics", timeout=5).read().decode()
sys.exit(0 if "ebpf_cni_packets_total{" in t and "\nebpf_cni_agent_ready 1\n" in t else 1)'
}
check "metrics: the agent on $NODE serves /metrics" 1 agent_metrics 1
check "metrics: the agent on $NODE2 serves /metrics" 1 agent_metrics 2

# ---- check: pod to pod, both families ----
for ip in "${echo_ips[@]}"; do
	check "pod to pod TCP $ip" 3 pod_get "$(hostport "$ip" 8080)"
	check "pod to pod UDP $ip" 3 pod_get -udp "$(hostport "$ip" 8081)"
done

# ---- check: pod to pod across the nodes, both ways, both families ----
# The pods' own addresses on the wire (clusterCIDRs: no masquerade): each
# echo answers with the address it saw the request from.
mapfile -t client_ips < <(kubectl get pod client -o jsonpath='{range .status.podIPs[*]}{.ip}{"\n"}{end}')
mapfile -t client2_ips < <(kubectl get pod client2 -o jsonpath='{range .status.podIPs[*]}{.ip}{"\n"}{end}')
from_addr() { # want get-command...: the answer names the client address want
	local want=$1
	shift
	"$@" | tee /dev/stderr | grep -qwF "$want"
}
for ip in "${echo2_ips[@]}"; do
	case $ip in *:*) src=${client_ips[1]} ;; *) src=${client_ips[0]} ;; esac
	check "across nodes: $NODE pod to $NODE2 pod TCP $ip" 3 from_addr "$src" pod_get "$(hostport "$ip" 8080)"
	check "across nodes: $NODE pod to $NODE2 pod UDP $ip" 3 from_addr "$src" pod_get -udp "$(hostport "$ip" 8081)"
done
for ip in "${echo_ips[@]}"; do
	case $ip in *:*) src=${client2_ips[1]} ;; *) src=${client2_ips[0]} ;; esac
	check "across nodes: $NODE2 pod to $NODE pod TCP $ip" 3 from_addr "$src" pod2_get "$(hostport "$ip" 8080)"
	check "across nodes: $NODE2 pod to $NODE pod UDP $ip" 3 from_addr "$src" pod2_get -udp "$(hostport "$ip" 8081)"
done

# ---- Services, in each kube-proxy mode ----
nodeport=$(kubectl get svc echo -o jsonpath='{.spec.ports[?(@.name=="tcp")].nodePort}')
# distinct_backends: 20 connections reach both endpoints.
both_endpoints() { # get-command...
	local seen
	seen=$(for i in $(seq 20); do "$@" 2>/dev/null; done | sort -u | wc -l)
	[ "$seen" = 2 ]
}
node_get() { e2ebox get "$@"; }
test_pod() { # name [metadata]: a pod of the test image (serve)
	kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $1${2:+, $2}}
spec:
  containers: [{name: c, image: $TEST_IMAGE, imagePullPolicy: Never}]
EOF
}
epoch() { date -d "$1" +%s; }
# late_udp mode: a pod sends UDP (one socket, one flow) to a Service that
# has no endpoint yet; then the endpoint comes; the first answer must come
# within 2 s of the endpoint's Ready condition (1 s resolution).
late_udp() {
	local m=$1 cip ready answered ok=1
	kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Service
metadata: {name: late-$m}
spec:
  selector: {app: late-$m}
  ports: [{name: udp, port: 81, targetPort: 8081, protocol: UDP}]
EOF
	cip=$(kubectl get svc "late-$m" -o jsonpath='{.spec.clusterIP}')
	kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: udpwait-$m}
spec:
  containers:
    - name: c
      image: $TEST_IMAGE
      imagePullPolicy: Never
      command: [/e2ebox, udpwait, -timeout, 120s, "$cip:81"]
EOF
	kubectl wait --for=condition=Ready "pod/udpwait-$m" --timeout=60s >/dev/null
	sleep 5 # the client sends into a Service without endpoints
	test_pod "late-$m" "labels: {app: late-$m}"
	kubectl wait --for=condition=Ready "pod/late-$m" --timeout=60s >/dev/null
	ready=$(epoch "$(kubectl get pod "late-$m" -o jsonpath='{.status.conditions[?(@.type=="Ready")].lastTransitionTime}')")
	for i in $(seq 30); do
		kubectl logs "udpwait-$m" 2>/dev/null | grep -q answered && break
		sleep 1
	done
	answered=$(kubectl logs "udpwait-$m" 2>/dev/null | awk '/answered/ {print $2}')
	log "[$m] late UDP client: endpoint Ready at $ready, first answer at ${answered:-never} ($(kubectl logs "udpwait-$m" 2>&1 | tail -1))"
	if [ -z "$answered" ] || ! python3 -c "import sys; sys.exit(0 if $answered - $ready <= 2.0 else 1)"; then ok=0; fi
	kubectl delete pod "udpwait-$m" "late-$m" --grace-period=1 >/dev/null
	kubectl delete svc "late-$m" >/dev/null
	[ $ok = 1 ]
}
world_get() { world "$T/bin/e2ebox" get "$@"; }
# ---- nodes without iptables: the nftables pass and every check after it ----
# kube-proxy's iptables rules are removed (kube-proxy --cleanup, while the
# binary is there); then every iptables, ip6tables, xtables, arptables and
# ebtables binary is hidden in both nodes' mount namespaces (RHEL 10's
# nodes have none): /usr/sbin (Debian's /sbin links to it) becomes a tmpfs
# of links to the rest of it.
hide_iptables() { # node
	local real="$T/usr-sbin$1"
	mkdir -p "$real"
	on "$1" mount --bind /usr/sbin "$real"
	on "$1" mount -t tmpfs -o mode=0755 e2e-no-iptables /usr/sbin
	on "$1" bash -c 'for f in "$1"/*; do
		b=${f##*/}
		case $b in iptables* | ip6tables* | xtables* | arptables* | ebtables*) continue ;; esac
		ln -s "$f" "/usr/sbin/$b"
	done' _ "$real"
}
no_iptables() { # node: no such binary on the node's PATH, no rule of kube-proxy's iptables mode
	on "$1" bash -c 'for b in iptables ip6tables iptables-nft ip6tables-nft iptables-legacy ip6tables-legacy \
		iptables-save ip6tables-save iptables-restore ip6tables-restore xtables-nft-multi xtables-legacy-multi; do
		if command -v "$b"; then exit 1; fi
	done; ! ls /usr/sbin /sbin | grep -E "^(ip6?tables|xtables)"' &&
		! on "$1" nft list ruleset | grep -q KUBE-SERVICES
}

# ---- check: NetworkPolicy, in each kube-proxy mode ----
# A policy that admits to echo2 (on the second node) only pods labelled
# access=true: the client (first node, unlabelled) is refused at echo2's
# addresses and through its ClusterIP, then admitted once labelled; each
# change is given 60 s to land (the agent compiles it into the maps).
refused() { ! pod_get -timeout 1s "$1" >/dev/null 2>&1; }
admitted() { pod_get -timeout 2s "$1" >/dev/null 2>&1; }
settle() { # seconds command...: polls until the command succeeds; fails if it never did
	local end=$((SECONDS + $1))
	shift
	until "$@"; do
		[ $SECONDS -ge $end ] && return 1
		sleep 1
	done
}
netpol_check() { # mode
	local m=$1 ip targets=()
	for ip in "${echo2_ips[@]}"; do targets+=("$(hostport "$ip" 8080)"); done
	for ip in "${cluster2_ips[@]}"; do targets+=("$(hostport "$ip" 80)"); done
	kubectl apply -f - >/dev/null <<EOF
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: echo2-access}
spec:
  podSelector: {matchLabels: {app: echo2}}
  policyTypes: [Ingress]
  ingress: [{from: [{podSelector: {matchLabels: {access: "true"}}}]}]
EOF
	settle 60 refused "${targets[0]}" || true
	for ip in "${targets[@]}"; do
		check "[$m] NetworkPolicy: echo2 refuses a pod it does not admit, at $ip" 3 refused "$ip"
	done
	kubectl label pod client access=true >/dev/null
	settle 60 admitted "${targets[0]}" || true
	for ip in "${targets[@]}"; do
		check "[$m] NetworkPolicy: echo2 admits the pod once labelled, at $ip" 3 admitted "$ip"
	done
	kubectl delete networkpolicy echo2-access >/dev/null
	kubectl label pod client access- >/dev/null
	settle 60 admitted "${targets[0]}" || true
	check "[$m] NetworkPolicy: gone with the policy" 1 admitted "${targets[0]}"
}

for mode in ${E2E_PROXY_MODES:-iptables nftables}; do
	if [ "$mode" != iptables ]; then
		kill "${kp_pid[1]}" "${kp_pid[2]}"
		wait "${kp_pid[1]}" "${kp_pid[2]}" 2>/dev/null || true
		if [ "$mode" = nftables ]; then
			for n in 1 2; do
				on $n kube-proxy --cleanup --config="$T/kube-proxy$n-iptables.yaml" >>"$T/logs/kube-proxy-cleanup.log" 2>&1 || true
				hide_iptables $n
			done
			for n in 1 2; do
				check "[nftables] $(node_name $n) has no iptables or ip6tables binary, and no iptables rule of kube-proxy's" 1 no_iptables $n
			done
		fi
		kube_proxy "$mode"
		sleep 5
	fi
	for n in 1 2; do
		wait_for 60 "kube-proxy ($mode) healthy on node $n" on $n python3 -c 'import urllib.request; urllib.request.urlopen("http://127.0.0.1:10256/healthz", timeout=1)'
	done
	sleep 3
	for cip in "${cluster_ips[@]}"; do
		check "[$mode] ClusterIP TCP $cip from a pod" 10 pod_get "$(hostport "$cip" 80)"
		check "[$mode] ClusterIP TCP $cip from a pod reaches both endpoints" 1 both_endpoints pod_get "$(hostport "$cip" 80)"
		check "[$mode] ClusterIP UDP $cip from a pod" 10 pod_get -udp "$(hostport "$cip" 81)"
		check "[$mode] ClusterIP TCP $cip from the node" 10 node_get "$(hostport "$cip" 80)"
		check "[$mode] ClusterIP UDP $cip from the node" 10 node_get -udp "$(hostport "$cip" 81)"
	done
	check "[$mode] NodePort $NODE_IP4:$nodeport from the world" 10 world_get "$NODE_IP4:$nodeport"
	check "[$mode] NodePort [$NODE_IP6]:$nodeport from the world" 10 world_get "[$NODE_IP6]:$nodeport"
	check "[$mode] hostPort $NODE_IP4:30080 from the world" 10 world_get "$NODE_IP4:30080"
	check "[$mode] hostPort [$NODE_IP6]:30080 from the world" 10 world_get "[$NODE_IP6]:30080"
	check "[$mode] UDP client started before its Service's endpoint answered within 2 s of it being Ready" 1 late_udp "$mode"
	# Across the nodes: Services whose endpoints are on the other node.
	for cip in "${cluster_ips[@]}"; do
		check "[$mode] across nodes: ClusterIP TCP $cip from a $NODE2 pod" 5 pod2_get "$(hostport "$cip" 80)"
		check "[$mode] across nodes: ClusterIP TCP $cip from a $NODE2 pod reaches both endpoints" 1 both_endpoints pod2_get "$(hostport "$cip" 80)"
		check "[$mode] across nodes: ClusterIP UDP $cip from a $NODE2 pod" 5 pod2_get -udp "$(hostport "$cip" 81)"
	done
	for cip in "${cluster2_ips[@]}"; do
		check "[$mode] across nodes: ClusterIP TCP $cip (endpoint on $NODE2) from a $NODE pod" 5 pod_get "$(hostport "$cip" 80)"
		check "[$mode] across nodes: ClusterIP UDP $cip (endpoint on $NODE2) from a $NODE pod" 5 pod_get -udp "$(hostport "$cip" 81)"
	done
	check "[$mode] across nodes: NodePort $NODE2_IP4:$nodeport (endpoints on $NODE) from the world" 5 world_get "$NODE2_IP4:$nodeport"
	check "[$mode] across nodes: NodePort [$NODE2_IP6]:$nodeport (endpoints on $NODE) from the world" 5 world_get "[$NODE2_IP6]:$nodeport"
	netpol_check "$mode"
done

# ---- check: bandwidth annotations, measured at the receiver per second ----
# 10 Mbit/s egress on the sender, then 10 Mbit/s ingress on the receiver;
# every full second at the receiver within 50-120% of the limit.
kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: bw-src, annotations: {kubernetes.io/egress-bandwidth: 10M}}
spec:
  containers: [{name: c, image: $TEST_IMAGE, imagePullPolicy: Never}]
---
apiVersion: v1
kind: Pod
metadata: {name: bw-sink}
spec:
  containers: [{name: c, image: $TEST_IMAGE, imagePullPolicy: Never, command: [/e2ebox, sink]}]
---
apiVersion: v1
kind: Pod
metadata: {name: bw-sink-in, annotations: {kubernetes.io/ingress-bandwidth: 10M}}
spec:
  containers: [{name: c, image: $TEST_IMAGE, imagePullPolicy: Never, command: [/e2ebox, sink]}]
EOF
kubectl wait --for=condition=Ready pod/bw-src pod/bw-sink pod/bw-sink-in --timeout=60s >/dev/null
pod_ip() { kubectl get pod "$1" -o jsonpath='{.status.podIP}'; }
rates_within() { # limit-Mbit/s rates...: at least 3 full seconds, each within 50-120%
	python3 - "$@" <<'PY'
import sys
limit, rates = float(sys.argv[1]), [float(r) for r in sys.argv[2:]]
sys.exit(0 if len(rates) >= 3 and all(0.5 * limit <= r <= 1.2 * limit for r in rates) else 1)
PY
}
rates=$(kubectl exec bw-src -- /e2ebox blast -duration 5s "$(pod_ip bw-sink):9000" 2>&1 | tail -1)
log "egress 10M (bw-src -> bw-sink), Mbit/s in each second at the receiver: $rates"
check "bandwidth: egress 10 Mbit/s held in every second at the receiver ($rates)" 1 rates_within 10 $rates
rates=$(kubectl exec client -- /e2ebox blast -duration 5s "$(pod_ip bw-sink-in):9000" 2>&1 | tail -1)
log "ingress 10M (client -> bw-sink-in), Mbit/s in each second at the receiver: $rates"
check "bandwidth: ingress 10 Mbit/s held in every second at the receiver ($rates)" 1 rates_within 10 $rates
kubectl delete pod bw-src bw-sink bw-sink-in --grace-period=1 >/dev/null

# ---- check: restart containerd and kubelet with pods running ----
# The pods keep their sandboxes, addresses and endpoints; traffic through
# the ClusterIP from the node goes on the whole time (one request each
# 0.2 s) and after, from a pod too.
before_pods=$(pod_state) before_eps=$(endpoint_list)
( ok=0 n=0; end=$((SECONDS + 40)); while [ $SECONDS -lt $end ]; do n=$((n + 1)); e2ebox get -timeout 1s "$(hostport "${cluster_ips[0]}" 80)" >/dev/null 2>&1 && ok=$((ok + 1)); sleep 0.2; done; echo "$ok $n" >"$T/restart-traffic" ) &
traffic=$!
sleep 3
kill "${pid_of[containerd]}"; wait "${pid_of[containerd]}" 2>/dev/null || true
start_containerd
wait_for 60 "containerd restarted" "${CTR[@]}" version
sleep 3
kill "${pid_of[kubelet]}"; wait "${pid_of[kubelet]}" 2>/dev/null || true
start_kubelet
sleep 15
wait_for 60 "node Ready after the restarts" is_ready
wait "$traffic" || true
read -r t_ok t_n <"$T/restart-traffic"
check "restarts: ClusterIP from the node during containerd and kubelet restarts ($t_ok/$t_n)" 1 test "$t_ok" = "$t_n"
check "restarts: pods keep their addresses, no container restarted" 1 test "$(pod_state)" = "$before_pods"
check "restarts: the same endpoints ($(ebpf-cni endpoints -o json | python3 -c 'import json,sys; print(len(json.load(sys.stdin) or []))') of them)" 1 test "$(endpoint_list)" = "$before_eps"
check "restarts: ClusterIP TCP from a pod" 10 pod_get "$(hostport "${cluster_ips[0]}" 80)"

# ---- check: a DaemonSet rollout to a new image with pods running ----
# The image of the same source built as another version (helm upgrade):
# the init container puts the new plugin binaries in place and rewrites
# the conflist, keeping the plugin another installer chained after
# ebpf-cni's; a pod started after it is still passed through that plugin,
# with ebpf-cni's result (the second node's through the Multus-like
# delegate too).
roll "rollout to $IMAGE2" "$IMAGE2" e2e-rollout helm_deploy upgrade "$IMAGE2"
# recorded NODE LOG FIELD POD: the log of an e2e-record on the node has
# the pod's ADD, with the pod's addresses in FIELD: ips, the prevResult it
# was given (chained: ebpf-cni's), or resultIPs, the result it returned
# (the delegate's, whose first plugin is ebpf-cni).
recorded() {
	local ips
	ips=$(kubectl get pod "$4" -o jsonpath='{range .status.podIPs[*]}{.ip}{" "}{end}')
	on "$1" cat "$2" | python3 -c '
import json, sys
field, want = sys.argv[1], set(sys.argv[2].split())
for line in sys.stdin:
    r = json.loads(line)
    if r.get("command") == "ADD" and want and want <= {a.split("/")[0] for a in r.get(field) or []}:
        sys.exit(0)
print("no ADD with", sorted(want), "in", field)
sys.exit(1)' "$3" "$ips"
}
for n in 1 2; do
	nn=$(node_name $n)
	check "rollout: e2e-record (another installer's) still chained after ebpf-cni on $nn" 1 chained_recorder $n
	kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: chained$n}
spec:
  nodeName: $nn
  tolerations: [{key: $NODE2_TAINT, operator: Exists}]
  containers: [{name: c, image: $TEST_IMAGE, imagePullPolicy: Never}]
EOF
done
kubectl wait --for=condition=Ready pod/chained1 pod/chained2 --timeout=60s >/dev/null || true
check "rollout: the chained plugin got ebpf-cni's result for a new pod on $NODE" 1 recorded 1 "$RECORD_LOG" ips chained1
check "rollout: the chained plugin got ebpf-cni's result for a new pod on $NODE2" 1 recorded 2 "$RECORD_LOG" ips chained2
check "rollout: the delegating meta plugin on $NODE2 returned ebpf-cni's result" 1 recorded 2 "$DELEGATE_LOG" resultIPs chained2
kubectl delete pod chained1 chained2 --grace-period=1 >/dev/null

# ---- check: the downgrade to the previous release, and up again ----
# helm rollback to the first revision (E2E_FROM's image), then to the
# third (this tree's rollout image): the same checks each way.
if [ -n "$E2E_FROM" ]; then
	roll "downgrade to $E2E_FROM" "$PREV_IMAGE" "$PREV_VERSION" "$HELM" rollback ebpf-cni 1 --namespace kube-system
	# The previous release's install writes the whole conflist: a plugin
	# another installer appended goes (CHANGELOG.md); that installer (as
	# istio-cni's, which watches the file) puts it back.
	for n in 1 2; do
		if chained_recorder $n >/dev/null; then kept=kept; else kept="dropped (re-appended)"; fi
		summary+=("downgrade to $E2E_FROM: the plugin chained after ebpf-cni's on $(node_name $n): $kept")
		append_recorder $n
	done
	roll "upgrade again from $E2E_FROM" "$IMAGE2" e2e-rollout "$HELM" rollback ebpf-cni 3 --namespace kube-system
	for n in 1 2; do
		check "upgrade again from $E2E_FROM: e2e-record still chained after ebpf-cni on $(node_name $n)" 1 chained_recorder $n
	done
fi

# ---- check: a burst of 100 pods on one node, twice ----
# A Deployment of 100 pods created at once on the first node (the second
# is tainted), then again with the node's ebpf-cni pod deleted in the
# middle of the burst (the DaemonSet makes it again: its init container
# installs and runs STATUS while ADDs run). Every pod Running, no failed
# sandbox, no failed ADD; the plugin's own ADD time per pod (p50/p99 from
# its calls log, the record the agent's metrics read) and pods per second
# from the Deployment's creation to the last pod Ready.
burst_ready() { test "$(kubectl get deploy burst -o jsonpath='{.status.readyReplicas}')" = 100; }
burst_scheduled() { test "$(kubectl get pods -l app=burst --field-selector "spec.nodeName=$NODE" -o name | wc -l)" -ge "$1"; }
burst_gone() { test -z "$(kubectl get pods -l app=burst -o name)"; }
burst_adds() { # since-ms: ADD records of the first node's plugin since then: count failed p50 p99, then the phases of the largest p50
	cat /run/ebpf-cni/calls.log.1 /run/ebpf-cni/calls.log 2>/dev/null | python3 -c '
import json, sys
since = int(sys.argv[1])
ms, failed, phases = [], 0, {}
for line in sys.stdin:
    try:
        r = json.loads(line)
    except ValueError:
        continue
    if r.get("verb") != "ADD" or r.get("t", 0) < since:
        continue
    if r.get("code"):
        failed += 1
    ms.append(r["ms"])
    for k, v in (r.get("phases") or {}).items():
        phases.setdefault(k, []).append(v)
def q(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else 0
print(len(ms), failed, "%.1f" % q(ms, 0.5), "%.1f" % q(ms, 0.99))
top = sorted(phases, key=lambda k: -q(phases[k], 0.5))[:4]
print(", ".join("%s %.1f" % (k, q(phases[k], 0.5)) for k in top) or "none")
' "$1"
}
burst() { # form [restart]: a burst of 100 pods; restart: the node's ebpf-cni pod deleted when half are scheduled
	local form=$1 t0 t0ms elapsed n failed p50 p99 phases sandboxes agent
	t0ms=$(($(date +%s%N) / 1000000)) t0=$(date +%s.%N)
	kubectl apply -f - >/dev/null <<EOF
apiVersion: apps/v1
kind: Deployment
metadata: {name: burst}
spec:
  replicas: 100
  selector: {matchLabels: {app: burst}}
  template:
    metadata: {labels: {app: burst}}
    spec:
      terminationGracePeriodSeconds: 1
      containers: [{name: c, image: $TEST_IMAGE, imagePullPolicy: Never}]
EOF
	if [ -n "${2:-}" ]; then
		wait_for 120 "half the burst scheduled" burst_scheduled 50
		agent=$(kubectl -n kube-system get pods -l app.kubernetes.io/name=ebpf-cni --field-selector "spec.nodeName=$NODE" -o name)
		log "burst ($form): deleting $agent with $(kubectl get pods -l app=burst --field-selector status.phase=Running -o name | wc -l) of the burst running"
		kubectl -n kube-system delete "$agent" --wait=false >/dev/null
	fi
	wait_for 400 "the burst of 100 pods Ready ($form)" burst_ready
	elapsed=$(python3 -c "import time; print('%.1f' % (time.time() - $t0))")
	{ read -r n failed p50 p99; read -r phases; } <<<"$(burst_adds "$t0ms")"
	sandboxes=$(kubectl get events --field-selector reason=FailedCreatePodSandBox -o jsonpath='{range .items[*]}{.involvedObject.name}{" "}{.count}{"\n"}{end}' | awk '/^burst-/ {n += $2} END {print n + 0}')
	log "burst ($form): 100 pods Ready in $elapsed s ($(python3 -c "print('%.1f' % (100 / $elapsed))") pods/s), the plugin's ADD p50 $p50 ms p99 $p99 ms over $n ADDs, $failed failed (phases' p50 in ms: $phases); $sandboxes failed sandboxes"
	summary+=("burst ($form): 100 pods Ready in $elapsed s, the plugin's ADD p50 $p50 ms p99 $p99 ms")
	check "burst ($form): every pod Running" 1 test "$(kubectl get pods -l app=burst --field-selector status.phase=Running -o name | wc -l)" = 100
	check "burst ($form): no failed sandbox ($sandboxes)" 1 test "$sandboxes" = 0
	check "burst ($form): 100 ADDs of the plugin, none failed ($n, $failed failed)" 1 test "$n" -ge 100 -a "$failed" = 0
	[ -z "${2:-}" ] || check "burst ($form): the node's ebpf-cni pod back and ready" 1 settle 120 kubectl -n kube-system rollout status ds/ebpf-cni --timeout=5s
	check "burst ($form): pod to pod after it" 5 pod_get "$(hostport "${echo_ips[0]}" 8080)"
	kubectl delete deploy burst --wait=false >/dev/null
	wait_for 240 "the burst's pods gone" burst_gone
}
burst "as created"
burst "the agent's pod deleted in the middle" restart

# ---- check: delete everything, nothing left ----
kubectl delete svc echo echo2 >/dev/null
kubectl delete deploy echo >/dev/null
kubectl delete pod --all --wait=false >/dev/null
no_pods() { test -z "$(kubectl get pods -o name)"; }
wait_for 120 "every workload pod gone" no_pods
no_endpoints() { on "${1:-1}" ebpf-cni endpoints | tee -a "$T/logs/checks.log" | grep -x "no endpoints on this node" >/dev/null; }
no_addresses() { on "${1:-1}" ebpf-cni ipam -o json | python3 -c 'import json,sys; d=json.load(sys.stdin) or []; n=sum(len(x.get("allocations") or []) for x in d); print(n, "addresses held"); sys.exit(n != 0)'; }
gc_nothing() { on "${1:-1}" ebpf-cni gc --dry-run -o json | tee -a "$T/logs/checks.log" | python3 -c 'import json,sys; d=json.load(sys.stdin); f={k: d[k] for k in ("endpoints", "ipamLeaks", "leftovers") if d.get(k)}; print(json.dumps(f)[:400] if f else "nothing"); sys.exit(1 if f else 0)'; }
for n in 1 2; do
	if [ $n = 1 ]; then nn=$NODE; else nn=$NODE2; fi
	check "after deleting every pod: ebpf-cni endpoints empty on $nn" 1 no_endpoints $n
	check "after deleting every pod: ebpf-cni ipam empty on $nn" 1 no_addresses $n
	check "after deleting every pod: ebpf-cni status clean on $nn" 1 on $n ebpf-cni status
	check "after deleting every pod: ebpf-cni gc --dry-run finds nothing on $nn" 1 gc_nothing $n
done

# ---- check: without loopback, failed ADDs leave nothing within one STATUS period ----
# containerd runs loopback and ebpf-cni's ADD; loopback fails, and the
# teardown stops at loopback's DEL, so ebpf-cni never sees a DEL: what an
# ADD made must go by the next STATUS (every 5 s). Sampled each second
# for 40 s while the kubelet retries: never more than one attempt's
# addresses (one per family), and nothing once the pod is gone.
held() { ebpf-cni ipam -o json | python3 -c 'import json,sys; d=json.load(sys.stdin) or []; print(sum(len(x.get("allocations") or []) for x in d))'; }
mv /opt/cni/bin/loopback "$T/loopback.saved"
test_pod noloopback
max_held=0 samples=""
for i in $(seq 40); do
	h=$(held)
	samples="$samples $h"
	[ "$h" -gt $max_held ] && max_held=$h
	sleep 1
done
status=$(kubectl get pod noloopback -o jsonpath='{.status.phase}')
failures=$(kubectl get events --field-selector involvedObject.name=noloopback,reason=FailedCreatePodSandBox -o jsonpath='{range .items[*]}{.count}{"\n"}{end}' | awk '{n += $1} END {print n + 0}')
log "without loopback: pod $status, $failures failed sandboxes, addresses held each second:$samples"
kubectl delete pod noloopback --grace-period=0 --force >/dev/null 2>&1 || true
sleep 6 # one STATUS period of containerd (5 s)
check "without loopback: pod never Running" 1 test "$status" != Running
check "without loopback: at least 2 failed ADDs" 1 test "$failures" -ge 2
check "without loopback: never more than one attempt's addresses held (max $max_held)" 1 test "$max_held" -le 2
check "without loopback: ebpf-cni endpoints empty after" 1 no_endpoints
check "without loopback: ebpf-cni ipam empty after" 1 no_addresses
mv "$T/loopback.saved" /opt/cni/bin/loopback

# ---- check: a chained plugin without its binary ----
# Another installer chains a plugin whose binary is not on the node (a
# 2026 report on containerd 2.2): every ADD fails after ebpf-cni's, and the
# teardown stops at that plugin's failing DEL, so ebpf-cni's DEL never
# comes (containerd never calls GC). Two forms of the conflist:
# - as ebpf-cni writes it (cniVersions up to 1.1.0): containerd calls CNI
#   STATUS, which fails on the missing plugin, so the node turns NotReady
#   and kubelet stops making sandboxes after the first (which may come
#   before the node is seen NotReady, or not at all); ebpf-cni's STATUS,
#   run before the missing plugin's, reclaims a failed attempt's
#   addresses;
# - limited to 1.0.0, as the report's (no STATUS: the node stays Ready):
#   kubelet retries the sandbox for the whole minute, and each ADD of
#   ebpf-cni's reclaims the attempt before it (its repair), so no more than
#   one attempt's addresses are held at a time.
# Then the conflist is fixed: the pod runs, and one STATUS period later the
# addresses held are its own; once it is deleted none are held and gc
# finds nothing.
set_missing() { # on [version]: a plugin without a binary at the end of ebpf-cni's conflist (the first node), the list limited to that CNI version; off: the conflist as it was
	if [ "$1" = off ]; then
		cp "$T/conflist.saved" "$CONFLIST.tmp" && mv "$CONFLIST.tmp" "$CONFLIST"
		return
	fi
	cp "$CONFLIST" "$T/conflist.saved"
	python3 - "$CONFLIST" "${2:-}" <<'PY'
import json, os, sys
path, version = sys.argv[1], sys.argv[2]
l = json.load(open(path))
l["plugins"].append({"type": "e2e-missing"})
if version:
    l["cniVersion"] = version
    l.pop("cniVersions", None)
with open(path + ".tmp", "w") as f:
    json.dump(l, f, indent=2)
os.rename(path + ".tmp", path)
PY
}
held_by() { # pod: the addresses held are exactly the pod's
	test "$(ebpf-cni ipam -o json | python3 -c 'import json,sys; print(" ".join(sorted(a["address"] for x in json.load(sys.stdin) or [] for a in x.get("allocations") or [])))')" = \
		"$(kubectl get pod "$1" -o jsonpath='{range .status.podIPs[*]}{.ip}{"\n"}{end}' | sort | xargs)"
}
pod_ready() { test "$(kubectl get pod "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True; }
broken_chain() { # pod form version min-failed: the check with the conflist limited to version ("": as written)
	local pod=$1 form=$2 version=$3 min_failed=$4 h max_held=0 samples="" status failures
	set_missing on "$version"
	test_pod "$pod"
	for i in $(seq 60); do
		h=$(held)
		samples="$samples $h"
		[ "$h" -gt $max_held ] && max_held=$h
		sleep 1
	done
	status=$(kubectl get pod "$pod" -o jsonpath='{.status.phase}')
	failures=$(kubectl get events --field-selector "involvedObject.name=$pod,reason=FailedCreatePodSandBox" -o jsonpath='{range .items[*]}{.count}{"\n"}{end}' | awk '{n += $1} END {print n + 0}')
	log "broken chain ($form): pod $status, its warnings: $(kubectl get events --field-selector "involvedObject.name=$pod,type=Warning" -o jsonpath='{range .items[*]}{.reason}{" x"}{.count}{"; "}{end}') node $(node_ready); addresses held each second:$samples"
	check "broken chain ($form): the pod stuck for a minute, at least $min_failed failed sandboxes ($failures)" 1 test "$status" != Running -a "$failures" -ge "$min_failed"
	if [ -z "$version" ]; then
		check "broken chain ($form): the node NotReady, its STATUS failing on the missing plugin" 1 test "$(node_ready)" = False
	else
		check "broken chain ($form): the node Ready all along, and ebpf-cni's ADD ran (an attempt's addresses seen held)" 1 test "$(node_ready)" = True -a "$max_held" -ge 1
	fi
	check "broken chain ($form): never more than one attempt's addresses held (max $max_held)" 1 test "$max_held" -le 2
	set_missing off
	check "broken chain ($form) fixed: the pod runs" 1 settle 180 pod_ready "$pod"
	sleep 6 # one STATUS period of containerd (5 s)
	check "broken chain ($form) fixed: one STATUS period later, the addresses held are the pod's ($(held))" 1 held_by "$pod"
	kubectl delete pod "$pod" --grace-period=1 >/dev/null
	wait_for 60 "the fixed pod gone" no_pods
	sleep 6
	check "broken chain ($form), the pod deleted: ebpf-cni ipam empty" 1 no_addresses
	check "broken chain ($form), the pod deleted: ebpf-cni endpoints empty" 1 no_endpoints
	check "broken chain ($form), the pod deleted: ebpf-cni gc --dry-run finds nothing" 1 gc_nothing
}
broken_chain brokenchain "STATUS: the node NotReady" "" 1
broken_chain brokenchain10 "CNI 1.0.0: no STATUS" 1.0.0 2

[ -n "$E2E_NETPOL_DIR" ] && netpol_e2e
[ -n "$E2E_CNP_DIR" ] && cnp_e2e
uninstall_check
finish
}

# ---- check: uninstall removes what ebpf-cni wrote, and only that ----
# The chart's way (docs/deploy.md, Removing): helm upgrade --set
# uninstall=true puts the uninstall DaemonSet in the place of ebpf-cni's
# objects (its pods retry until the agents are gone), then helm uninstall.
# Each node is left with the other plugins' files, byte for byte, and
# nothing of ebpf-cni's: no plugin, conflist or record, no route of its
# agent, nothing in bpfRoot or the stateDir (the directories stay, empty:
# they are the uninstall pods' mounts).
only_foreign() { # node: the CNI directories hold the other plugins' files only
	test "$(on "$1" find /opt/cni/bin /etc/cni/net.d -mindepth 1 | sort | xargs)" = "$(foreign_files "$1" | xargs -n1 | sort | xargs)"
}
nothing_of_ebpf_cni() { # node
	test -z "$(on "$1" ip -4 route show proto 236)$(on "$1" ip -6 route show proto 236)" &&
		test -z "$(on "$1" find /sys/fs/bpf/ebpf-cni /run/ebpf-cni -mindepth 1 2>/dev/null)" &&
		test -z "$(on "$1" ip -o link show type veth | grep -v ' eth0@')" # the node's uplink is a veth
}
uninstall_check() {
	local n nn
	kubectl delete pod --all --wait=true --timeout=60s >/dev/null 2>&1 || true
	"$HELM" upgrade ebpf-cni "$root/deploy/helm/ebpf-cni" --namespace kube-system --reuse-values --set uninstall=true >>"$T/logs/helm.log" 2>&1 ||
		die "helm upgrade --set uninstall=true: $(tail -3 "$T/logs/helm.log")"
	wait_for 180 "the uninstall DaemonSet done on both nodes" kubectl -n kube-system rollout status ds/ebpf-cni-uninstall --timeout=5s
	for p in $(kubectl -n kube-system get pods -o name | grep ebpf-cni-uninstall); do
		kubectl -n kube-system logs "$p" -c uninstall >>"$T/logs/uninstall.log" 2>&1 || true
	done
	"$HELM" uninstall ebpf-cni --namespace kube-system --wait >>"$T/logs/helm.log" 2>&1 || die "helm uninstall: $(tail -3 "$T/logs/helm.log")"
	for n in 1 2; do
		nn=$(node_name $n)
		check "uninstall: the other plugins' files on $nn unchanged" 1 foreign_same $n
		check "uninstall: nothing but them left in $nn's CNI directories ($(on $n find /opt/cni/bin /etc/cni/net.d -mindepth 1 | xargs))" 1 only_foreign $n
		check "uninstall: no route, pin, state or host veth of ebpf-cni's left on $nn" 1 nothing_of_ebpf_cni $n
	done
}

finish() { # the summary; fails if a check failed
	echo
	echo "make e2e: Kubernetes $(basename "$K" | sed 's/kubernetes-//'), containerd $(basename "$C" | sed 's/containerd-//'), $(runc --version | head -1), etcd $(etcd --version | head -1 | awk '{print $NF}')"
	for s in "${summary[@]}"; do echo "  $s"; done
	[ $failed = 0 ] || die "$failed checks failed"
	echo "make e2e: all checks passed"
}

if [ "${E2E_NETPOL:-}" = only ] || [ "${E2E_CNP:-}" = only ]; then
	[ "${E2E_NETPOL:-}" != only ] || netpol_e2e
	[ "${E2E_CNP:-}" != only ] || cnp_e2e
	finish
else
	checks
fi
