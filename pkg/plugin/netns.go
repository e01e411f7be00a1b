package plugin

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
)

// ownNetNS is the network namespace the plugin runs in: the node's. The
// calling thread's: every thread a goroutine runs on unlocked is in it
// (only a Do's goroutine, on a thread it locks, enters a pod's).
const ownNetNS = "/proc/thread-self/ns/net"

// refuseNodeNetNS refuses a CNI_NETNS that names the plugin's own network
// namespace (code 4, before anything is made): ADD would configure the node
// itself as a pod, its addresses, routes and anti-spoofing on the node's
// interfaces. Two paths name one namespace when they are the same nsfs
// inode.
//
// skel makes the same comparison, but only after ADD has printed its
// result, and then prints an error too (two JSON documents, code 8): once
// this check has passed, args.NetnsOverride tells skel not to repeat it, so
// no ADD prints a result and then an error.
func refuseNodeNetNS(args *skel.CmdArgs) error {
	if args.Netns == "" {
		return nil // openNetNS says it is empty
	}
	var pod, own unix.Stat_t
	if err := unix.Stat(args.Netns, &pod); err != nil {
		return nil // openNetNS says why it cannot be opened
	}
	if err := unix.Stat(ownNetNS, &own); err != nil {
		return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("invalid CNI_NETNS %q: cannot tell it from the plugin's own network namespace: %v", args.Netns, err), "")
	}
	if pod.Dev == own.Dev && pod.Ino == own.Ino {
		return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("invalid CNI_NETNS %q: it is the node's own network namespace (the plugin's), not a pod's", args.Netns), "")
	}
	args.NetnsOverride = "1"
	return nil
}

// noSkelNetNSCheck turns skel's comparison of CNI_NETNS with the plugin's
// own namespace off for DEL: skel makes it after DEL succeeded and then
// fails the call with code 8, so a runtime cleaning up after an ADD that
// was refused for that very reason would see its DEL fail, for ever. DEL
// never enters CNI_NETNS: what it removes is the same either way.
func noSkelNetNSCheck(args *skel.CmdArgs) { args.NetnsOverride = "1" }

// podNetNS is a pod's network namespace whose Do enters it from the node's
// and comes back with a handle on the node's taken once, when the pod's is
// opened: ns.NetNS's own Do opens the calling thread's namespace twice per
// call (/proc/<pid>/task/<tid>/ns/net, stat'ed and opened, with the
// poller's registration tried and undone), about twenty system calls, and
// an ADD enters the pod two or three times (its interface, the pacing
// cookie). What it keeps of the library's Do: the callback runs on a
// goroutine of its own, locked to its thread, and a thread that cannot be
// switched back stays locked, so the runtime ends it rather than run
// anything else in the pod's namespace. Unlike the library's, Do always
// returns to the node's namespace: a callback must not call Do again.
type podNetNS struct {
	ns.NetNS
	node ns.NetNS // the node's (the plugin's own)
}

// newPodNetNS wraps pod; it is called from the node's namespace (a verb's
// goroutine, never inside a Do), whose handle it takes.
func newPodNetNS(pod ns.NetNS) (*podNetNS, error) {
	node, err := ns.GetNS(ownNetNS)
	if err != nil {
		return nil, fmt.Errorf("opening the node's netns: %w", err)
	}
	return &podNetNS{NetNS: pod, node: node}, nil
}

// Do runs toRun in the pod's namespace with the node's as its argument,
// as ns.NetNS's does.
func (p *podNetNS) Do(toRun func(ns.NetNS) error) error {
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		if serr := unix.Setns(int(p.Fd()), unix.CLONE_NEWNET); serr != nil {
			runtime.UnlockOSThread() // still in the node's
			err = fmt.Errorf("entering netns %s: %w", p.Path(), serr)
			return
		}
		err = toRun(p.node)
		if serr := unix.Setns(int(p.node.Fd()), unix.CLONE_NEWNET); serr != nil {
			err = errors.Join(err, fmt.Errorf("returning to the node's netns from %s: %w", p.Path(), serr))
			return // locked: the thread ends with this goroutine
		}
		runtime.UnlockOSThread()
	}()
	<-done
	return err
}

// Close closes the pod's handle and the node's.
func (p *podNetNS) Close() error {
	_ = p.node.Close()
	return p.NetNS.Close()
}
