package cli

import (
	"fmt"
	"strings"

	"github.com/ebpf-cni/ebpf-cni/pkg/ipam"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
)

// IPAMLeak is an ebpf-ipam attachment with no endpoint of ebpf-cni: the
// pod of another interface plugin that uses ebpf-ipam (bridge, macvlan),
// or addresses a runtime never DELeted. It is gone, and gc releases it,
// when the network namespace its ADD was given is gone, or when the
// operator names the live containers (--live-containers) and its
// container is not among them.
type IPAMLeak struct {
	Network     string   `json:"network"`
	ContainerID string   `json:"containerID"`
	IfName      string   `json:"ifname"`
	NetNS       string   `json:"netns"`
	IPs         []string `json:"ips"`
	// Gone says why it is gone; empty when it may be alive.
	Gone     string   `json:"gone,omitempty"`
	Released []string `json:"released"`
	Error    string   `json:"error,omitempty"`
}

// ipamLeaks lists the ebpf-ipam attachments under the state dir that no
// endpoint of n accounts for. live, when not nil, is the set of container
// IDs the operator says are alive.
func ipamLeaks(ctx *Context, n *snapshot, live map[string]bool) ([]*IPAMLeak, error) {
	held, err := ipam.ListHeld(ctx.StateDir)
	if err != nil {
		return nil, fmt.Errorf("reading ebpf-ipam's records (--state-dir): %w", err)
	}
	eps := map[string]bool{}
	for _, e := range n.Endpoints {
		eps[e.ContainerID+"\x00"+e.IfName] = true
	}
	out := []*IPAMLeak{}
	for _, h := range held {
		if eps[h.ContainerID+"\x00"+h.IfName] {
			continue
		}
		l := &IPAMLeak{Network: h.Network, ContainerID: h.ContainerID, IfName: h.IfName, NetNS: h.NetNS, IPs: []string{}, Released: []string{}}
		for _, a := range h.IPs {
			l.IPs = append(l.IPs, a.Address.String())
		}
		switch {
		case h.NetNS != "" && !node.IsNetNS(h.NetNS):
			l.Gone = fmt.Sprintf("netns %s gone", h.NetNS)
		case live != nil && !live[h.ContainerID]:
			l.Gone = "container not among --live-containers"
		}
		out = append(out, l)
	}
	return out, nil
}

// describe is one line for status and gc's notes.
func (l *IPAMLeak) describe() string {
	return fmt.Sprintf("ebpf-ipam holds %s in network %s for %s/%s, which has no endpoint",
		strings.Join(l.IPs, ","), l.Network, l.ContainerID, l.IfName)
}

// parseLive reads --live-containers: container IDs separated by commas or
// white space; nil when the flag was not given.
func parseLive(s string, given bool) map[string]bool {
	if !given {
		return nil
	}
	live := map[string]bool{}
	for _, id := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' || r == '\n' || r == '\t' }) {
		live[id] = true
	}
	return live
}

// gcIPAMLeaks is gc's part for ebpf-ipam attachments without an endpoint:
// those gone are listed and, unless a dry run, released; the others are
// kept, and said so.
func gcIPAMLeaks(ctx *Context, n *snapshot, live map[string]bool, out *gcOutput) []error {
	leaks, err := ipamLeaks(ctx, n, live)
	if err != nil {
		return []error{err}
	}
	var failed []error
	for _, l := range leaks {
		if l.Gone == "" {
			why := "its netns " + l.NetNS + " exists"
			if l.NetNS == "" {
				why = "no netns recorded"
			}
			out.Skipped = append(out.Skipped, fmt.Sprintf("%s (%s): --live-containers without its container releases it", l.describe(), why))
			continue
		}
		out.IPAMLeaks = append(out.IPAMLeaks, l)
		if out.DryRun {
			continue
		}
		ips, err := ipam.ReleaseHeld(ctx.BPFRoot, ctx.StateDir, l.Network, l.ContainerID, l.IfName)
		for _, ip := range ips {
			l.Released = append(l.Released, ip.String())
		}
		if err != nil {
			l.Error = err.Error()
			failed = append(failed, fmt.Errorf("releasing %s/%s in %s: %w", l.ContainerID, l.IfName, l.Network, err))
		}
	}
	return failed
}

func leakLines(leaks []*IPAMLeak) []string {
	var out []string
	for _, l := range leaks {
		line := fmt.Sprintf("%s: %s", l.describe(), l.Gone)
		if l.Error != "" {
			line += ": " + l.Error
		}
		out = append(out, line)
	}
	return out
}

// statusIPAMLeaks is status's part: an ebpf-ipam attachment without an
// endpoint whose netns is gone is a problem gc fixes; one whose netns is
// there (or unknown) is a note.
func statusIPAMLeaks(ctx *Context, n *snapshot, problem, note func(string, ...any)) {
	leaks, err := ipamLeaks(ctx, n, nil)
	if err != nil {
		problem("%v", err)
		return
	}
	for _, l := range leaks {
		if l.Gone != "" {
			problem("%s and whose %s: ebpf-cni gc releases them", l.describe(), l.Gone)
		} else {
			note("%s (another interface plugin's pod, or a leak: ebpf-cni gc --live-containers releases it when its container is not named)", l.describe())
		}
	}
}
