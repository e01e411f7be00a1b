package plugin

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/ebpf-cni/ebpf-cni/pkg/node"
)

// TimingEnv switches the phase timings on: "stderr" (or "1") writes one
// line per call to stderr, any other value is a file the line is appended
// to. Never stdout: that is the CNI result. Runtimes pass their own
// environment on to plugins, so setting it for containerd, CRI-O or podman
// times every call they make.
const TimingEnv = "EBPF_CNI_TIMING"

// processStart is as close to the exec as Go code gets: package variables
// are set before main runs. What comes before (exec, the Go runtime's own
// start) is the caller's wall time less the line's total.
var processStart = time.Now()

// watch times a call's phases until the node handle takes over.
type watch struct {
	at     time.Time
	phases []node.Phase
}

// newWatch starts at the process start; its first phase, "start", ends
// now: the Go runtime and skel reading the environment and stdin.
func newWatch() *watch {
	w := &watch{at: processStart}
	w.lap("start")
	return w
}

// lap ends the running phase as name.
func (w *watch) lap(name string) {
	if w == nil {
		return
	}
	now := time.Now()
	w.phases = append(w.phases, node.Phase{Name: name, Took: now.Sub(w.at)})
	w.at = now
}

// logTiming writes the call's phases where TimingEnv says, one line:
// "ebpf-cni ADD <container>/<ifname> total=<ms> <phase>=<ms>... outcome=ok".
func logTiming(verb string, args *skel.CmdArgs, n *node.Node, err error) {
	dest := os.Getenv(TimingEnv)
	if dest == "" || n == nil {
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "ebpf-cni %s %s/%s total=%.3f", verb, args.ContainerID, args.IfName, ms(time.Since(processStart)))
	for _, p := range n.Phases() {
		fmt.Fprintf(&b, " %s=%.3f", p.Name, ms(p.Took))
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	fmt.Fprintf(&b, " outcome=%s\n", result)
	var w io.Writer = os.Stderr
	if dest != "1" && dest != "stderr" {
		f, ferr := os.OpenFile(dest, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if ferr != nil {
			return // timings are never worth failing a call
		}
		defer f.Close()
		w = f
	}
	_, _ = io.WriteString(w, b.String())
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
