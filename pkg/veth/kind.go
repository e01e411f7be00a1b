package veth

import (
	"os"
	"path/filepath"
	"strings"
)

// kindFile keeps, in the stateDir, the device type deviceType auto chose
// for the node.
const kindFile = "device-type"

// AutoKind is the device type deviceType auto gives the node's new pods:
// netkit where the kernel has netkit devices (haveNetkit, asked only
// when needed), else veth. It is decided once per node: the first call
// asks the kernel and keeps the answer in stateDir (the file
// device-type), later calls read it. A reboot into
// another kernel starts with an empty stateDir (a tmpfs) and asks again;
// so does a lost file: the kernel's answer is the same.
func AutoKind(stateDir string, haveNetkit func() bool) Kind {
	if k, ok := RecordedAutoKind(stateDir); ok {
		return k
	}
	k := KindVeth
	if haveNetkit() {
		k = KindNetkit
	}
	p := filepath.Join(stateDir, kindFile)
	tmp := p + ".tmp"
	if os.WriteFile(tmp, []byte(string(k)+"\n"), 0o644) == nil {
		_ = os.Rename(tmp, p)
	}
	return k
}

// RecordedAutoKind is the node's decision, when it was made.
func RecordedAutoKind(stateDir string) (Kind, bool) {
	b, err := os.ReadFile(filepath.Join(stateDir, kindFile))
	if err != nil {
		return "", false
	}
	switch k := Kind(strings.TrimSpace(string(b))); k {
	case KindVeth, KindNetkit:
		return k, true
	}
	return "", false
}
