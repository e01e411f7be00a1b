#!/usr/bin/env bash
# Boots a Debian kernel package in qemu and runs the project's integration
# tests inside it (make test-kernel). Everything comes from Debian's
# packages: the kernel (apt-get download, nothing installed into /boot) and
# a root filesystem built with debootstrap, cached between runs. The test
# binaries are compiled here and handed to the guest in its initramfs; their
# output comes back over the serial console. The guest has no network device
# at all (-nic none): the tests make their own namespaces inside it.
#
# Settings (environment, passed through by make):
#   KERNEL      Debian kernel package (default: what linux-image-amd64 depends on)
#   VM_CACHE    cache for kernels and the root filesystem (/var/cache/ebpf-cni-vm)
#   VM_TESTS    test packages to run (test/datapath test/cli test/ipam)
#   VM_RUN      -test.run regexp for every package (default: all)
#   VM_SKIP     -test.skip regexp for every package (default: none)
#   VM_BENCH    -test.bench regexp, each benchmark run once (default: none;
#               with VM_RUN='^$' only the benchmarks run)
#   VM_MEM      guest memory (3G); VM_SMP guest CPUs (2)
#   VM_TIMEOUT  limit for the whole boot (90m); VM_TEST_TIMEOUT per package (60m)
set -euo pipefail

cd "$(dirname "$0")/../.."
root=$PWD

CACHE=${VM_CACHE:-/var/cache/ebpf-cni-vm}
SUITE=${VM_SUITE:-bookworm}
MIRROR=${VM_MIRROR:-http://deb.debian.org/debian}
TESTS=${VM_TESTS:-test/datapath test/cli test/ipam}
RUN=${VM_RUN:-}
SKIP=${VM_SKIP:-}
BENCH=${VM_BENCH:-}
MEM=${VM_MEM:-3G}
SMP=${VM_SMP:-2}
TIMEOUT=${VM_TIMEOUT:-90m}
TEST_TIMEOUT=${VM_TEST_TIMEOUT:-60m}

# What the tests exec inside the guest, and what they need to exist there.
ROOTFS_PKGS=iproute2,iptables,nftables,iperf3,sockperf,iputils-ping,containernetworking-plugins,kmod,util-linux,procps
# Bump when the recipe below changes, so cached images are rebuilt.
ROOTFS_RECIPE=1

# Versions the upgrade tests run as "a newer release": every name the tests
# pass to testutil.VersionDir.
VERSIONS=$(grep -rhoE 'VersionDir\(t, "[A-Za-z0-9._-]+"' test | sed -E 's/.*"(.*)"/\1/' | sort -u)
# Earlier commits: every const a testutil.CommitDir call names.
COMMITS=$(for n in $(grep -rhoE 'CommitDir\(t, [A-Za-z0-9_]+\)' test | sed -E 's/.*, (.*)\)/\1/' | sort -u); do
	grep -rhoE "const $n = \"[0-9a-f]+\"" test | sed -E 's/.*"(.*)"/\1/'
done | sort -u)

log() { printf 'test-kernel: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (debootstrap, device nodes in the image)"
for t in qemu-system-x86_64 debootstrap cpio depmod apt-get dpkg-deb; do
	command -v "$t" >/dev/null || die "$t missing: make test-kernel installs it"
done

if [ -z "${KERNEL:-}" ]; then
	KERNEL=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-/ {print $2; exit}')
	[ -n "$KERNEL" ] || die "cannot tell the current Debian kernel package: run apt-get update, or set KERNEL="
fi

tmp=$(mktemp -d /tmp/ebpf-cni-vm.XXXXXX)
qpid=
cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	if [ -n "$qpid" ] && kill -0 "$qpid" 2>/dev/null; then
		log "stopping qemu ($qpid)"
		kill "$qpid" 2>/dev/null || true
		wait "$qpid" 2>/dev/null || true
	fi
	[ -n "${tailpid:-}" ] && kill "$tailpid" 2>/dev/null
	rm -rf "$tmp" "${partial:-}"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
mkdir -p "$CACHE"

# --- kernel: vmlinuz and the modules the tests need, as an initramfs part ---
kdir=$CACHE/kernels/$KERNEL
if [ ! -f "$kdir/modules.cpio" ]; then
	log "fetching $KERNEL"
	partial=$kdir.partial
	rm -rf "$partial" && mkdir -p "$partial/deb"
	chmod 755 "$partial" "$partial/deb"
	# apt-get download drops privileges to _apt: give it a directory it may write.
	chown _apt "$partial/deb" 2>/dev/null || true
	(cd "$partial/deb" && apt-get download -q "$KERNEL" >&2) || die "apt-get download $KERNEL failed (does the package exist? apt-cache search linux-image-6.1)"
	dpkg-deb -x "$partial"/deb/*.deb "$partial/x"
	kver=$(ls "$partial/x/lib/modules")
	cp "$partial"/x/boot/vmlinuz-* "$partial/vmlinuz"
	cp "$partial"/x/boot/config-* "$partial/config"
	# Networking, its crypto and library helpers, and the virtual devices the
	# tests create; not the hardware drivers (most of the package).
	# usr/lib: the root filesystem's /lib is a symlink, which a lib/
	# directory in a later initramfs archive would replace.
	m=$partial/m/usr/lib/modules/$kver
	mkdir -p "$m/kernel/drivers/net"
	src=$partial/x/lib/modules/$kver
	for d in net lib crypto arch; do
		[ -d "$src/kernel/$d" ] && cp -a "$src/kernel/$d" "$m/kernel/"
	done
	for f in veth vxlan ifb dummy macvlan ipvlan tun geneve netkit; do
		find "$src/kernel/drivers/net" -name "$f.ko*" -exec cp {} "$m/kernel/drivers/net/" \;
	done
	find "$src/kernel/drivers/net" -path '*/vxlan/*' -name '*.ko*' -exec cp {} "$m/kernel/drivers/net/" \;
	find "$src/kernel/drivers/net" -path '*/ipvlan/*' -name '*.ko*' -exec cp {} "$m/kernel/drivers/net/" \;
	cp "$src"/modules.builtin* "$src"/modules.order "$m/" 2>/dev/null || true
	depmod -b "$partial/m/usr" "$kver"
	(cd "$partial/m" && find . | cpio -o -H newc --quiet) >"$partial/modules.cpio"
	echo "$kver" >"$partial/version"
	rm -rf "$partial/x" "$partial/m" "$partial/deb"
	rm -rf "$kdir" && mv "$partial" "$kdir"
	partial=
fi
kver=$(cat "$kdir/version")
log "kernel $KERNEL ($kver)"

# --- root filesystem: debootstrap of Debian's packages, cached ---
key=$(printf '%s\n' "$SUITE" "$MIRROR" "$ROOTFS_PKGS" "$ROOTFS_RECIPE" | sha256sum | cut -c1-12)
rootfs=$CACHE/rootfs-$SUITE-$key.cpio
if [ ! -f "$rootfs" ]; then
	log "building the root filesystem ($SUITE: $ROOTFS_PKGS); cached as $rootfs"
	partial=$CACHE/rootfs-$SUITE-$key.partial
	rm -rf "$partial"
	debootstrap --variant=minbase --include="$ROOTFS_PKGS" "$SUITE" "$partial" "$MIRROR" >&2 ||
		die "debootstrap failed: see $partial/debootstrap/debootstrap.log"
	rm -rf "$partial"/usr/share/{doc,man,info,locale} "$partial"/var/cache/apt/* "$partial"/var/lib/apt/lists/*
	echo ebpf-cni-vm >"$partial/etc/hostname"
	(cd "$partial" && find . | cpio -o -H newc --quiet) >"$rootfs.tmp"
	mv "$rootfs.tmp" "$rootfs"
	rm -rf "$partial"
	partial=
fi

# --- the project's binaries, compiled here ---
run=$tmp/run
mkdir -p "$run/ebpf-cni/bin"
log "building bin/ebpf-cni, bin/ebpf-ipam and the test binaries ($TESTS)"
# As testutil.PluginDir builds them: unstamped, so the programs' tag (which
# carries the version) is the one the test binaries compute.
CGO_ENABLED=0 go build -o "$run/ebpf-cni/bin/" ./cmd/ebpf-cni ./cmd/ebpf-ipam \
	github.com/containernetworking/plugins/plugins/main/loopback # internal/testutil.UpstreamLoopback
for v in $VERSIONS; do
	CGO_ENABLED=0 go build -ldflags "-X github.com/ebpf-cni/ebpf-cni/pkg/buildinfo.Version=$v" \
		-o "$run/ebpf-cni/versions/$v/" ./cmd/ebpf-cni ./cmd/ebpf-ipam
done
# Earlier commits the rollback tests run (testutil.CommitDir(t, name) of a
# `const name = "<commit>"`), built from git as CommitDir builds them.
for c in $COMMITS; do
	src=$tmp/src-$c
	mkdir -p "$src"
	if git archive "$c" 2>/dev/null | tar -x -C "$src" 2>/dev/null; then
		(cd "$src" && CGO_ENABLED=0 go build -ldflags "-X github.com/ebpf-cni/ebpf-cni/pkg/buildinfo.Version=commit-$c" \
			-o "$run/ebpf-cni/versions/commit-$c/" ./cmd/ebpf-cni ./cmd/ebpf-ipam) || log "cannot build commit $c: its tests skip"
	else
		log "no commit $c in this checkout: its tests skip"
	fi
	rm -rf "$src"
done
CGO_ENABLED=0 go build -o "$run/ebpf-cni/test2json" cmd/test2json
for p in $TESTS; do
	mkdir -p "$run/ebpf-cni/$p"
	# pkg/hugeheap is a module of its own: its tests build in its directory.
	if [ -f "$p/go.mod" ]; then
		(cd "$p" && CGO_ENABLED=0 go test -c -o "$run/ebpf-cni/$p/test.bin" .)
	else
		CGO_ENABLED=0 go test -c -o "$run/ebpf-cni/$p/test.bin" "./$p"
	fi
done
cp test/kernel/init.sh "$run/init"
chmod 755 "$run/init"
{
	printf 'TESTS=%q\n' "$TESTS"
	printf 'RUN=%q\n' "$RUN"
	printf 'SKIP=%q\n' "$SKIP"
	printf 'BENCH=%q\n' "$BENCH"
	printf 'TEST_TIMEOUT=%q\n' "$TEST_TIMEOUT"
	printf 'KERNEL=%q\n' "$KERNEL"
} >"$run/ebpf-cni/vm.env"
(cd "$run" && find . | cpio -o -H newc --quiet) >"$tmp/run.cpio"
# An initramfs may be several cpio archives back to back: the cached root
# filesystem, the kernel's modules, then this run's files (its /init).
cat "$rootfs" "$kdir/modules.cpio" "$tmp/run.cpio" >"$tmp/initrd"
rm -rf "$run" "$tmp/run.cpio"

# --- boot ---
console=$tmp/console.log
: >"$console"
log "booting $KERNEL under TCG ($SMP CPUs, $MEM), timeout $TIMEOUT"
start=$(date +%s)
nice -n 10 timeout "$TIMEOUT" qemu-system-x86_64 \
	-accel tcg,thread=multi -cpu max -smp "$SMP" -m "$MEM" \
	-nodefaults -no-user-config -nic none -display none -vga none -monitor none \
	-chardev file,id=con,path="$console" -serial chardev:con \
	-kernel "$kdir/vmlinuz" -initrd "$tmp/initrd" -no-reboot \
	-append "console=ttyS0 rdinit=/init panic=-1 loglevel=${VM_LOGLEVEL:-4} net.ifnames=0 mitigations=off" \
	</dev/null >"$tmp/qemu.out" 2>&1 &
qpid=$!
# Stream the console while qemu runs; the summary reads the test events.
tail -n +1 -f --pid="$qpid" "$console" | go run ./test/kernel/summary -kernel "$KERNEL" &
tailpid=$!
qrc=0
wait "$qpid" || qrc=$?
qpid=
wait "$tailpid" || true
tailpid=
secs=$(($(date +%s) - start))
log "guest ran $((secs / 60))m$((secs % 60))s"
if [ "$qrc" = 124 ]; then
	die "guest timed out after $TIMEOUT"
elif [ "$qrc" != 0 ]; then
	cat "$tmp/qemu.out" >&2
	die "qemu exited with $qrc"
fi
result=$(sed -n 's/^EBPF-CNI-VM-RESULT \([0-9]*\).*/\1/p' "$console" | tail -1)
[ -n "$result" ] || die "the guest did not report a result (crashed?): see the console above"
exit "$result"
