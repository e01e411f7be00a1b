module github.com/ebpf-cni/ebpf-cni

go 1.26

tool github.com/cilium/ebpf/cmd/bpf2go

require (
	github.com/cilium/ebpf v0.22.0
	github.com/containernetworking/cni v1.3.1
	github.com/containernetworking/plugins v1.9.1
	golang.org/x/sys v0.43.0
)

require github.com/vishvananda/netns v0.0.5 // indirect
