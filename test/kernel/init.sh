#!/bin/sh
# PID 1 of the make test-kernel guest: mounts what the tests expect (bpffs,
# cgroup v2), runs every test binary as root, prints their go test events
# (test2json) on the serial console, reports the status and powers off.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root CI=true
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
mount -t bpf bpf /sys/fs/bpf
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
echo 1 >/proc/sys/kernel/sysrq
hostname ebpf-cni-vm
ip link set lo up

. /ebpf-cni/vm.env
# The tests use the binaries compiled on the host (no Go toolchain here).
export EBPF_CNI_TEST_BIN=/ebpf-cni/bin EBPF_CNI_TEST_VERSIONS=/ebpf-cni/versions
# Rate assertions skip under emulation (testutil.SkipRateUnderEmulation).
export EBPF_CNI_TEST_EMULATED=tcg

echo "EBPF-CNI-VM-BOOTED $(uname -r) $(nproc) CPUs, $(awk '/MemTotal/ {print $2 / 1024 " MiB"}' /proc/meminfo)"
status=0
for p in $TESTS; do
	cd "/ebpf-cni/$p" || { status=1; continue; }
	start=$(date +%s)
	set -- -test.v=test2json -test.count=1 -test.timeout="$TEST_TIMEOUT"
	[ -n "$RUN" ] && set -- "$@" -test.run "$RUN"
	[ -n "$SKIP" ] && set -- "$@" -test.skip "$SKIP"
	[ -n "${BENCH:-}" ] && set -- "$@" -test.bench "$BENCH" -test.benchtime 1x
	# test2json reads the binary's output and writes one JSON event a line.
	{ ./test.bin "$@" 2>&1; echo $? >/tmp/rc; } | /ebpf-cni/test2json -t -p "$p"
	rc=$(cat /tmp/rc)
	echo "EBPF-CNI-VM-PACKAGE $p exit $rc in $(($(date +%s) - start))s"
	[ "$rc" = 0 ] || status=1
done
echo "EBPF-CNI-VM-RESULT $status"
sync
echo o >/proc/sysrq-trigger
sleep 5
echo b >/proc/sysrq-trigger
