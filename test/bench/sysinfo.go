package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/utils/sysctl"

	"github.com/ebpf-cni/ebpf-cni/pkg/attach"
)

// machineInfo says what the figures were measured on and with.
func machineInfo(cfg config) [][2]string {
	var uts [3]string
	for i, f := range []string{"sys/kernel/ostype", "sys/kernel/osrelease", "sys/kernel/version"} {
		b, _ := os.ReadFile(filepath.Join("/proc", f))
		uts[i] = strings.TrimSpace(string(b))
	}
	return [][2]string{
		{"cpu", cpuModel()},
		{"cpus", fmt.Sprint(runtime.NumCPU())},
		{"memory", memTotal()},
		{"kernel", uts[0] + " " + uts[1] + " " + uts[2]},
		{"iptables", firstLine("iptables", "--version")},
		{"iperf3", firstLine("iperf3", "--version")},
		{"go", runtime.Version()},
		{"ebpf-cni", firstLine(filepath.Join(cfg.bin, "ebpf-cni"), "version")},
		{"ebpf-ipam", firstLine(filepath.Join(cfg.bin, "ebpf-ipam"))},
		{"reference plugins", "containernetworking-plugins " + firstLine("dpkg-query", "-W", "-f", "${Version}", "containernetworking-plugins") + " (" + cfg.ref + ")"},
		{"ebpf-cni attachMode", "default (" + string(attach.DefaultMode) + ")"},
		{"rr/crr load generator", "this program (1-byte TCP over blocking sockets; sockperf's smallest message is 14 bytes)"},
	}
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

func memTotal() string {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return "unknown"
	}
	var kb int
	for _, l := range strings.Split(string(b), "\n") {
		if _, err := fmt.Sscanf(l, "MemTotal: %d kB", &kb); err == nil {
			return fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
		}
	}
	return "unknown"
}

// firstLine runs a command (ebpf-ipam prints its version on stderr when run
// with no CNI_COMMAND; ebpf-cni is the operator CLI then, whose version
// command says it) and returns the first line it printed.
func firstLine(name string, args ...string) string {
	var out bytes.Buffer
	c := exec.Command(name, args...)
	c.Env = []string{"PATH=" + os.Getenv("PATH")}
	c.Stdout, c.Stderr = &out, &out
	_ = c.Run()
	l, _, _ := strings.Cut(strings.TrimSpace(out.String()), "\n")
	if l == "" {
		return "unknown"
	}
	return l
}

// bridgeNF says whether bridged packets of REF traverse iptables.
func bridgeNF(n ns.NetNS) string {
	v := "unknown"
	_ = n.Do(func(ns.NetNS) error {
		if s, err := sysctl.Sysctl("net/bridge/bridge-nf-call-iptables"); err == nil {
			v = s
		}
		return nil
	})
	return v
}
