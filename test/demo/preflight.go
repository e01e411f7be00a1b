package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/ebpf-cni/ebpf-cni/pkg/cgroup"
)

// preflight says in one line what this machine lacks for the demo, before
// anything is made. sysroot prefixes the /proc and /sys files read (the
// test points it at a fake root).
func preflight(sysroot, bin, ref string) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root: sudo make demo")
	}
	fs, err := os.ReadFile(filepath.Join(sysroot, "proc/filesystems"))
	if err != nil {
		return fmt.Errorf("reading the kernel's filesystems: %w", err)
	}
	if !hasFilesystem(string(fs), "bpf") {
		return errors.New("this kernel has no bpf filesystem (CONFIG_BPF_SYSCALL): ebpf-cni pins its maps and programs in bpffs")
	}
	if _, err := os.Stat(filepath.Join(sysroot, "sys/kernel/btf/vmlinux")); err != nil {
		return errors.New("this kernel has no BTF (/sys/kernel/btf/vmlinux; CONFIG_DEBUG_INFO_BTF=y): ebpf-cni's programs are built with CO-RE")
	}
	if !hasFilesystem(string(fs), "cgroup2") {
		return errors.New("this kernel has no cgroup v2: hostPort from the node and bandwidth pacing attach to a cgroup v2")
	}
	if sysroot == "/" {
		if _, err := cgroup.V2Root(); err != nil {
			return fmt.Errorf("cgroup v2 is not mounted (mount -t cgroup2 none /sys/fs/cgroup/unified): %w", err)
		}
	}
	for _, tool := range []string{"ip", "ss", "ping", "iperf3", "iptables"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s is missing: run sudo make deps (make demo does)", tool)
		}
	}
	for _, p := range []string{filepath.Join(bin, "ebpf-cni"), filepath.Join(bin, "ebpf-ipam"), filepath.Join(ref, "bridge")} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("%s is missing: run make build and sudo make deps (make demo does)", p)
		}
	}
	return nil
}

// hasFilesystem: /proc/filesystems lists name ("nodev\tbpf").
func hasFilesystem(list, name string) bool {
	for _, l := range strings.Split(list, "\n") {
		f := strings.Fields(l)
		if len(f) > 0 && f[len(f)-1] == name {
			return true
		}
	}
	return false
}
