package cli

import (
	"errors"
	"flag"
	"fmt"
	"slices"

	"github.com/ebpf-cni/ebpf-cni/pkg/features"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/repair"
)

func init() {
	register(&Command{
		Name:    "repair",
		Summary: "mend the node's state from the kernel now, as the next CNI STATUS would (--dry-run lists it)",
		Help: `Compares what the kernel holds with the plugin's records and mends the
records, as every CNI STATUS does (containerd 2.x calls it every 5 s) and
an ADD does when no STATUS ran for 5 s:

  - programs missing from bpfRoot (a remounted bpffs) are loaded and pinned
    again, and the recorded attachments moved to them;
  - a host veth of ebpf-cni without a record (a wiped or remounted
    stateDir, a call killed half-way) gets its record rebuilt from the
    kernel: its alias, the endpoint maps, its routes and programs, the
    ports published to it;
  - a pair whose owner nothing tells (a call killed before naming it: its
    ADD never succeeded) is removed;
  - an attachment whose host veth is gone (its pod's netns was destroyed
    without a DEL) is reclaimed: map entries, links, record, and its
    ebpf-ipam addresses; the node's last one takes the node-wide programs
    with it. One whose pod interface is alive in its netns is kept (run
    ebpf-cni in the node's network namespace);
  - endpoint entries with neither a record nor a host veth (pods gone
    without DEL while the stateDir was lost) are reclaimed with their
    pods' state and ebpf-ipam addresses, in the node's network namespace
    only (the one every ADD records in node_info), with the node lock held
    exclusively;
  - what the features keep for each live endpoint and a bpffs loss took
    is restored (a limited pod's buckets, its netns entry in local_netns
    and the pacing hook; published ports; masquerade settings): a CNI
    STATUS does this after it loaded the programs again, repair always.

It holds the node lock shared (exclusively to reclaim endpoints without a
record) and each attachment's lock, skipping an attachment a call is
working on. Run it in the node's network namespace.

JSON: {"dryRun", "programsLoaded", "rebuilt": [], "reclaimed": [],
"removed": [], "restored": [], "ipamReleased": [], "problems": [], "notes": []}. Exit status 1 if
something could not be mended, 3 when problems remain.`,
		Flags: func(fs *flag.FlagSet) func(*Context) error {
			dry := fs.Bool("dry-run", false, "list what would be mended, change nothing")
			confDir := fs.String("cni-conf-dir", "/etc/cni/net.d", "where the runtime's network configurations are: each ebpf-cni network found there (with this --bpf-root and --state-dir) is mended as its CNI STATUS would")
			accept := fs.Bool("accept-loss", false, "keep the pods whose published ports and limits were lost with both the stateDir and the bpffs as they are (CNI STATUS fails until then)")
			return func(ctx *Context) error {
				return runRepair(ctx, repairOptions{dryRun: *dry, confDir: *confDir, acceptLoss: *accept})
			}
		},
	})
}

type repairOutput struct {
	DryRun         bool     `json:"dryRun"`
	ProgramsLoaded bool     `json:"programsLoaded"`
	Rebuilt        []string `json:"rebuilt"`
	Reclaimed      []string `json:"reclaimed"`
	Removed        []string `json:"removed"`
	Restored       []string `json:"restored"`
	IPAMReleased   []string `json:"ipamReleased"`
	Problems       []string `json:"problems"`
	Notes          []string `json:"notes"`
}

// repairNetworks runs the repair as each ebpf-cni network's CNI STATUS
// would (found under --cni-conf-dir: what only a network's configuration
// tells, its masquerade settings, its IPAM plugin for the addresses of its
// gone pods), then once more for what no configuration names (ebpf-ipam's
// addresses by the network's name). What each run found is added up.
func repairNetworks(ctx *Context, nd *node.Node, ro repairOptions, out *repairOutput) (*repair.Report, []error) {
	var failed []error
	confs, notes := networkConfigs(ro.confDir, ctx)
	runs := make([]repair.Options, 0, len(confs)+1)
	for _, c := range confs {
		runs = append(runs, repair.Options{Network: c.Network(), DryRun: ro.dryRun, Restore: true})
	}
	runs = append(runs, repair.Options{DryRun: ro.dryRun, Restore: true})
	all := &repair.Report{}
	for _, o := range runs {
		h, err := repair.Run(nd, o)
		if err != nil && o.Network != nil {
			err = fmt.Errorf("network %s: %w", o.Network.Name, err)
		}
		if err != nil {
			failed = append(failed, err)
		}
		all.Rebuilt = append(all.Rebuilt, h.Rebuilt...)
		all.Reclaimed = append(all.Reclaimed, h.Reclaimed...)
		all.Removed = append(all.Removed, h.Removed...)
		all.Restored = append(all.Restored, h.Restored...)
		all.Released = append(all.Released, h.Released...)
		all.Problems = append(all.Problems, h.Problems...)
		all.Lost = h.Lost // every run reads the same marks
		if !o.DryRun && len(h.Rebuilt) > 0 && o.Network == nil {
			out.Notes = append(out.Notes, notes...) // rebuilt records no configuration completed
		}
	}
	slices.Sort(all.Problems)
	all.Problems = slices.Compact(all.Problems) // every run sees the same
	return all, failed
}

type repairOptions struct {
	dryRun, acceptLoss bool
	confDir            string
}

func runRepair(ctx *Context, ro repairOptions) error {
	dryRun := ro.dryRun
	// A remounted bpffs has no bpfRoot any more: repair makes it again.
	dir, mounted, err := bpffsMount(ctx.BPFRoot)
	if err != nil {
		return err
	}
	if !mounted {
		return fmt.Errorf("bpffs not mounted at %s: mount -t bpf bpf %s, then run ebpf-cni repair again", dir, dir)
	}
	nd, err := node.Open(node.Options{BPFRoot: ctx.BPFRoot, StateDir: ctx.StateDir, Objects: features.Objects(), Tag: features.Tag(), Lock: node.Shared})
	if err != nil {
		return fmt.Errorf("taking the node lock (--state-dir): %w", err)
	}
	defer nd.Close()
	out := &repairOutput{DryRun: dryRun, IPAMReleased: []string{}, Notes: []string{}}
	var failed []error
	if !dryRun {
		if _, err := nd.Programs(); err != nil {
			failed = append(failed, fmt.Errorf("loading the programs: %w", err))
		}
		out.ProgramsLoaded = nd.Loaded()
	}
	h, failedRuns := repairNetworks(ctx, nd, ro, out)
	failed = append(failed, failedRuns...)
	if ro.acceptLoss && !dryRun {
		for _, name := range h.Lost {
			if err := nd.Unmark(node.MarkLossy, name); err != nil {
				failed = append(failed, err)
			}
		}
		h.Lost = nil
	}
	for _, name := range h.Lost {
		h.Problems = append(h.Problems, fmt.Sprintf("host veth %s: its record was rebuilt with neither the stateDir nor the bpffs: published ports and bandwidth limits it had are lost; delete and recreate its pod, or ebpf-cni repair --accept-loss", name))
	}
	out.Rebuilt, out.Reclaimed, out.Removed, out.Restored, out.IPAMReleased = h.Rebuilt, h.Reclaimed, h.Removed, h.Restored, h.Released
	out.Problems = append(out.Problems, h.Problems...)
	if len(h.Reclaimed) > 0 && !dryRun {
		nd.ReleaseIfEmpty(func() { failed = append(failed, repair.Release(nd)) })
	}
	if ctx.JSON {
		if err := writeJSON(ctx.Stdout, out); err != nil {
			return err
		}
	} else {
		printRepair(ctx, out)
	}
	if err := errors.Join(failed...); err != nil {
		return fmt.Errorf("some state could not be mended: %w", err)
	}
	if len(out.Problems) > 0 {
		return errProblems
	}
	return nil
}

func printRepair(ctx *Context, out *repairOutput) {
	w := ctx.Stdout
	verb := ""
	if out.DryRun {
		verb = " (dry run: nothing changed)"
	}
	if out.ProgramsLoaded {
		fmt.Fprintln(w, "programs loaded and pinned again; recorded attachments moved to them")
	}
	n := 0
	for _, s := range []struct {
		title string
		lines []string
	}{{"rebuilt", out.Rebuilt}, {"reclaimed", out.Reclaimed}, {"removed", out.Removed}, {"restored", out.Restored}, {"ebpf-ipam addresses released", out.IPAMReleased}, {"problems", out.Problems}, {"notes", out.Notes}} {
		if len(s.lines) > 0 {
			n += len(s.lines)
			fmt.Fprintf(w, "%s%s:\n", s.title, verb)
			for _, l := range s.lines {
				fmt.Fprintf(w, "  - %s\n", l)
			}
		}
	}
	if n == 0 && !out.ProgramsLoaded {
		fmt.Fprintln(w, "nothing to mend: every host veth has its record and every record its host veth")
	}
}
