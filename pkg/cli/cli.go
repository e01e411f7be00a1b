// Package cli is the operator CLI of ebpf-cni: what `ebpf-cni` does when a
// person runs it (no CNI_COMMAND in the environment). With no daemon to ask,
// it reads what the kernel and the state directory hold for the node:
// pinned maps and programs under bpfRoot, endpoint records under stateDir.
// Every command only reads, except gc.
//
// A command is one file that registers itself (name, help, flags, run).
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/ebpf-cni/ebpf-cni/pkg/config"
	"github.com/ebpf-cni/ebpf-cni/pkg/features"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/view"
)

// Exit codes of the CLI.
const (
	ExitOK       = view.ExitOK
	ExitError    = view.ExitError    // the command failed; the message says what to do
	ExitUsage    = view.ExitUsage    // unknown command or flag
	ExitProblems = view.ExitProblems // status found problems (listed in its output)
)

// Command is one subcommand (pkg/view: the features write theirs).
type Command = view.Command

// Context is what a command runs with.
type Context = view.Context

var commands = map[string]*Command{}

// register adds a command; each command's file calls it from init, and
// the features' commands come from the registry.
func register(c *Command) {
	if _, dup := commands[c.Name]; dup {
		panic("cli: command registered twice: " + c.Name)
	}
	commands[c.Name] = c
}

func init() {
	for _, c := range features.Commands() {
		register(c)
	}
}

// errProblems makes status exit with ExitProblems after printing them.
var errProblems = &view.Exit{Code: ExitProblems, Err: errors.New("problems found")}

const intro = `ebpf-cni: the operator CLI of the ebpf-cni CNI plugin.

There is no daemon: the node's network lives in pinned eBPF maps and
programs (--bpf-root) and small records (--state-dir). These commands read
them and the kernel directly. Run them as root in the network namespace the
plugin runs in (the node's). Three change the node's state: gc (removes
what gone pods left), repair (mends the state from the kernel) and
tunnels --add or --del (writes tunnel endpoints); each of the first two
lists instead with --dry-run. monitor holds the event stream while it
runs; every other command only reads.
With CNI_COMMAND set, ebpf-cni is the CNI plugin instead.
`

func usage(w io.Writer) {
	fmt.Fprint(w, intro)
	fmt.Fprint(w, "\nUsage: ebpf-cni <command> [flags]\n\nCommands:\n")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	t := &view.Table{}
	for _, n := range names {
		t.Row("  "+n, commands[n].Summary)
	}
	_ = t.Write(w)
	fmt.Fprint(w, `
Flags of every command:
  --bpf-root DIR    bpffs directory of the plugin's maps and programs (default `+config.DefaultBPFRoot+`)
  --state-dir DIR   the plugin's state directory, with its endpoint records (default `+config.DefaultStateDir+`)
  -o table|json     output: an aligned table with human-sized numbers, or JSON
                    with exact numbers and stable field names (default table)

Exit status: 0 ok, 1 error (the message says what to do), 2 bad usage,
3 status found problems.
Run 'ebpf-cni <command> --help' for what a command shows.
`)
}

// Main runs the CLI with args (without the program name) and returns the
// exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stdout)
		return ExitOK
	}
	name := args[0]
	switch name {
	case "--version", "-version": // what every other tool answers to
		name, args = "version", append([]string{"version"}, args[1:]...)
	case "-h", "-help", "--help", "help":
		if len(args) > 1 && name == "help" {
			if c, ok := commands[args[1]]; ok {
				fs := newFlagSet(c, &Context{}, new(string))
				c.Flags(fs)
				commandHelp(stdout, c, fs)
				return ExitOK
			}
			fmt.Fprintf(stderr, "ebpf-cni: unknown command %q\n", args[1])
			return ExitUsage
		}
		usage(stdout)
		return ExitOK
	}
	c, ok := commands[name]
	if !ok {
		fmt.Fprintf(stderr, "ebpf-cni: unknown command %q (commands: %s)\nRun 'ebpf-cni --help' for usage.\n", name, strings.Join(commandNames(), ", "))
		return ExitUsage
	}
	ctx := &Context{Stdout: stdout, Stderr: stderr}
	ctx.Endpoints = func() ([]view.EndpointRef, error) { return endpointRefs(ctx) }
	var output string
	fs := newFlagSet(c, ctx, &output)
	run := c.Flags(fs)
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			commandHelp(stdout, c, fs)
			return ExitOK
		}
		fmt.Fprintf(stderr, "ebpf-cni %s: %v\nRun 'ebpf-cni %s --help' for usage.\n", name, err, name)
		return ExitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "ebpf-cni %s: unexpected argument %q\nRun 'ebpf-cni %s --help' for usage.\n", name, fs.Arg(0), name)
		return ExitUsage
	}
	switch output {
	case "table":
	case "json":
		ctx.JSON = true
	default:
		fmt.Fprintf(stderr, "ebpf-cni %s: -o %q: want table or json\n", name, output)
		return ExitUsage
	}
	// The node as the views see it: no lock (a view never waits for a
	// plugin call), maps opened read-only through it. Opening it reads
	// nothing.
	nd, err := node.Open(node.Options{BPFRoot: ctx.BPFRoot, StateDir: ctx.StateDir, Objects: features.Objects(), Tag: features.Tag(), Lock: node.Unlocked})
	if err != nil {
		fmt.Fprintf(stderr, "ebpf-cni %s: %v\n", name, err)
		return ExitError
	}
	defer nd.Close()
	ctx.Node = nd
	if err := run(ctx); err != nil {
		var ee *view.Exit
		if errors.As(err, &ee) {
			if ee != errProblems {
				fmt.Fprintf(stderr, "ebpf-cni %s: %v\n", name, ee.Err)
			}
			return ee.Code
		}
		fmt.Fprintf(stderr, "ebpf-cni %s: %v\n", name, err)
		return ExitError
	}
	return ExitOK
}

func commandNames() []string {
	var out []string
	for n := range commands {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// newFlagSet declares the flags every command has, then the command's own.
func newFlagSet(c *Command, ctx *Context, output *string) *flag.FlagSet {
	fs := flag.NewFlagSet("ebpf-cni "+c.Name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // Main prints errors and help itself
	fs.StringVar(&ctx.BPFRoot, "bpf-root", config.DefaultBPFRoot, "bpffs `DIR` of the plugin's maps and programs (its bpfRoot)")
	fs.StringVar(&ctx.StateDir, "state-dir", config.DefaultStateDir, "`DIR` of the plugin's state: endpoint records, locks (its stateDir)")
	fs.StringVar(output, "o", "table", "`table|json`: an aligned table, or JSON with exact numbers")
	return fs
}

func commandHelp(w io.Writer, c *Command, fs *flag.FlagSet) {
	fmt.Fprintf(w, "Usage: ebpf-cni %s [flags]\n\n%s\n\n%s\nFlags:\n", c.Name, c.Summary, strings.TrimSpace(c.Help)+"\n")
	t := &view.Table{}
	fs.VisitAll(func(f *flag.Flag) {
		dash := "--"
		if len(f.Name) == 1 {
			dash = "-"
		}
		arg, text := flag.UnquoteUsage(f)
		if arg != "" {
			arg = " " + arg
		}
		if f.DefValue != "" && f.DefValue != "false" {
			text += " (default " + f.DefValue + ")"
		}
		t.Row("  "+dash+f.Name+arg, text)
	})
	_ = t.Write(w)
}
