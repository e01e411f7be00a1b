// Package view is what an operator CLI command is made of: its
// declaration, the context it runs in, and how it prints (aligned tables
// with human-sized numbers, or stable JSON). The CLI's own commands and
// the features' commands (feature.Feature.Commands) are written with it;
// pkg/cli runs them.
package view

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
)

// Exit codes of the CLI.
const (
	ExitOK       = 0
	ExitError    = 1 // the command failed; the message says what to do
	ExitUsage    = 2 // unknown command or flag
	ExitProblems = 3 // status found problems (listed in its output)
)

// Command is one subcommand.
type Command struct {
	Name    string
	Summary string // one line for the command list
	Help    string // what it shows; printed by --help
	// Flags declares the command's own flags, if any, and returns its run
	// function; flag values live in the closure, fresh for every call.
	Flags func(fs *flag.FlagSet) func(*Context) error
}

// EndpointRef names one endpoint of the node.
type EndpointRef struct {
	ContainerID, IfName, HostVeth string
	HostIfIndex                   int
	// The pod's Kubernetes identity (endpoint_pods, else the record):
	// empty when the runtime passed no K8S_POD_* in CNI_ARGS.
	PodNamespace, PodName, PodUID string
	// IPs are the endpoint's addresses as the datapath enforces them
	// (endpoint_devs), else as recorded.
	IPs []string
}

// Name is how tables name an endpoint: containerID/ifname (the ID cut to
// 12 characters, as container runtimes show it).
func Name(containerID, ifName string) string {
	id := containerID
	if len(id) > 12 {
		id = id[:12]
	}
	if id == "" {
		id = "?"
	}
	return id + "/" + OrDash(ifName)
}

// Context is what a command runs with.
type Context struct {
	// BPFRoot and StateDir are the flags (--bpf-root, --state-dir) Node
	// was opened from: for messages; what lives there, ask Node.
	BPFRoot  string
	StateDir string
	// Node is the plugin's node as the CLI sees it, opened without the
	// node lock: views read maps through it (OpenMap: read-only, never
	// created); a command that changes the node opens its own handle
	// with the lock it needs.
	Node   *node.Node
	JSON   bool // -o json
	Stdout io.Writer
	Stderr io.Writer
	// Endpoints lists the node's endpoints (their records joined with the
	// endpoint maps), for commands that name them.
	Endpoints func() ([]EndpointRef, error)
}

// Exit carries an exit code other than ExitError.
type Exit struct {
	Code int
	Err  error
}

func (e *Exit) Error() string { return e.Err.Error() }
func (e *Exit) Unwrap() error { return e.Err }

// Usage is a bad argument: the command exits with ExitUsage.
func Usage(format string, a ...any) error {
	return &Exit{Code: ExitUsage, Err: fmt.Errorf(format, a...)}
}

// ErrNoMap means a map is not pinned (yet): no pod was ever added, or it
// belongs to a feature an older build did not have. Commands show it empty.
var ErrNoMap = maps.ErrNotPinned

// BPFFSMount finds the directory whose file system holds path (path
// itself or its nearest existing ancestor) and whether it is bpffs.
func BPFFSMount(path string) (dir string, ok bool, err error) {
	p := filepath.Clean(path)
	for {
		var st unix.Statfs_t
		err := unix.Statfs(p, &st)
		if err == nil {
			return p, st.Type == unix.BPF_FS_MAGIC, nil
		}
		if !errors.Is(err, unix.ENOENT) || p == "/" {
			return p, false, fmt.Errorf("statfs %s: %w", p, err)
		}
		p = filepath.Dir(p)
	}
}

// CheckRoot says what to do when bpfRoot cannot hold the plugin's state:
// bpffs not mounted, or nothing there yet.
func (ctx *Context) CheckRoot() error {
	dir, ok, err := BPFFSMount(ctx.BPFRoot)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("bpffs not mounted at %s: mount -t bpf bpf %s (or point --bpf-root at the plugin's bpfRoot)", dir, dir)
	}
	if dir != filepath.Clean(ctx.BPFRoot) {
		return fmt.Errorf("no ebpf-cni state at %s: no pod was added on this node yet, or --bpf-root is not the plugin's bpfRoot", ctx.BPFRoot)
	}
	return nil
}

// OpenMap opens a pinned map read-only through the node handle, checked
// as the plugin's calls check it; ErrNoMap when it is not pinned. It never
// creates anything.
func (ctx *Context) OpenMap(name string) (*ebpf.Map, error) {
	return ctx.Node.ReadMap(name)
}

// OpenMapWritable is OpenMap for the one command that writes a map it
// reads: monitor (its lease, the ring buffer's consumer position).
func (ctx *Context) OpenMapWritable(name string) (*ebpf.Map, error) {
	if err := ctx.Node.CheckBPFFS(); err != nil {
		return nil, err
	}
	m, err := ctx.Node.PinnedMap(name)
	if err == nil && m == nil {
		return nil, fmt.Errorf("%s: %w", name, ErrNoMap)
	}
	if err != nil {
		return nil, err
	}
	return m.Clone() // the caller closes its own; the handle keeps its copy
}

// OpenMaps opens several maps; missing ones are nil. close releases them.
func (ctx *Context) OpenMaps(names ...string) (ms map[string]*ebpf.Map, close func(), err error) {
	ms = map[string]*ebpf.Map{}
	close = func() {
		for _, m := range ms {
			if m != nil {
				m.Close()
			}
		}
	}
	for _, n := range names {
		m, err := ctx.OpenMap(n)
		if err != nil && !errors.Is(err, ErrNoMap) {
			close()
			return nil, func() {}, err
		}
		ms[n] = m
	}
	return ms, close, nil
}
