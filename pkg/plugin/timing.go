package plugin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/ebpf-cni/ebpf-cni/pkg/calls"
	"github.com/ebpf-cni/ebpf-cni/pkg/config"
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
	fmt.Fprintf(&b, "ebpf-cni %s %s/%s total=%.3f", verb, args.ContainerID, args.IfName, calls.Ms(time.Since(processStart)))
	for _, p := range n.Phases() {
		fmt.Fprintf(&b, " %s=%.3f", p.Name, calls.Ms(p.Took))
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

// call is one verb's run, written to the call record (pkg/calls) when it
// ends, whatever EBPF_CNI_TIMING says: the node agent's metrics count the
// calls, their outcomes and their phases from it.
type call struct {
	verb   string
	args   *skel.CmdArgs
	w      *watch
	n      *node.Node
	healed int // what healing mended (healNode)
}

func startCall(verb string, args *skel.CmdArgs, w *watch) *call {
	return &call{verb: verb, args: args, w: w}
}

// opened gives the call its node handle: its phases and stateDir.
func (c *call) opened(n *node.Node) { c.n = n }

// end appends the call's record; it never fails the call.
func (c *call) end(err error) {
	r := calls.Record{Verb: c.verb, Code: codeOf(err), Total: calls.Ms(time.Since(processStart)), Healed: c.healed}
	r.Time = time.Now().UnixMilli()
	var phases []node.Phase
	stateDir := ""
	if c.n != nil {
		phases, stateDir = c.n.Phases(), c.n.StateDir()
	} else {
		if c.w != nil {
			phases = c.w.phases
		}
		stateDir = stateDirOf(c.args.StdinData)
	}
	if len(phases) > 0 {
		r.Phases = make(map[string]float64, len(phases))
		for _, p := range phases {
			r.Phases[p.Name] += calls.Ms(p.Took)
		}
	}
	_ = calls.Append(stateDir, r)
}

// codeOf is the CNI error code the runtime gets for err: skel answers an
// error that is no *types.Error with ErrInternal.
func codeOf(err error) uint {
	if err == nil {
		return 0
	}
	var e *types.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return types.ErrInternal
}

// stateDirOf is the stateDir of a configuration ParseConfig refused (or
// that was never parsed), so that the refusal is recorded where the
// node's other calls are; the default when it names none.
func stateDirOf(conf []byte) string {
	var c struct {
		StateDir string `json:"stateDir"`
	}
	if json.Unmarshal(conf, &c) == nil && filepath.IsAbs(c.StateDir) {
		return c.StateDir
	}
	return config.DefaultStateDir
}
