package agent

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	cnpclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"

	"github.com/ebpf-cni/ebpf-cni/pkg/buildinfo"
	"github.com/ebpf-cni/ebpf-cni/pkg/config"
	"github.com/ebpf-cni/ebpf-cni/pkg/conflist"
	"github.com/ebpf-cni/ebpf-cni/pkg/features"
	nodestate "github.com/ebpf-cni/ebpf-cni/pkg/node"
)

const usage = `ebpf-cni-agent: the node agent of ebpf-cni on Kubernetes.

Usage:
  ebpf-cni-agent run [flags]      watch Node objects and keep, for every other node's
                                  pod ranges, a route (mode direct) or a tunnel
                                  endpoint (mode vxlan); compile the NetworkPolicies
                                  for this node's pods into the plugin's maps; keep
                                  the destinations kube-proxy translates there, so
                                  that the pods' flows to others skip netfilter
                                  (the DaemonSet's container)
  ebpf-cni-agent install [flags]  put the plugins into the node's CNI directory and
                                  write its conflist from the Node's spec.podCIDRs
                                  (the DaemonSet's init container)
  ebpf-cni-agent uninstall [flags]
                                  take ebpf-cni off the node: refuse while pods are
                                  on it (or the agent runs) unless -force; remove the
                                  conflist, the agent's routes and tunnel endpoints,
                                  every endpoint and the plugin's node-wide state, its
                                  pins and state dir, then the binaries install
                                  recorded; nothing else (the uninstall DaemonSet's
                                  init container, deploy/kubernetes/ebpf-cni-uninstall.yaml)
  ebpf-cni-agent pause            do nothing until SIGTERM (the uninstall DaemonSet's
                                  container: the rollout is done when every node is)
  ebpf-cni-agent version          this build's version (also --version, -version):
                                  git describe of the tree it was built from

Flags default to environment variables, which the DaemonSet sets from the
Node (NODE_NAME) and the ebpf-cni ConfigMap (EBPF_CNI_*).
Run 'ebpf-cni-agent <command> -h' for a command's flags.
`

// Where the DaemonSet's image and mounts put things (deploy/kubernetes).
const (
	DefaultSrcDir     = "/opt/ebpf-cni/bin"
	DefaultCNIBinDir  = "/host/opt/cni/bin"
	DefaultCNIConfDir = "/host/etc/cni/net.d"
	// BPFRootMount is where both containers mount the plugin's bpfRoot:
	// not at its path on the node, under /sys, where a runtime mounts a
	// read-only sysfs and cannot make the mount point.
	BPFRootMount = "/bpf-root"
)

// The environment variables the agent reads (the DaemonSet sets them from
// the Node and the ebpf-cni ConfigMap).
const (
	EnvNodeName     = "NODE_NAME"
	EnvKubeconfig   = "KUBECONFIG"
	EnvMode         = "EBPF_CNI_MODE"
	EnvHealthAddr   = "EBPF_CNI_HEALTH_ADDR"
	EnvMetricsAddr  = "EBPF_CNI_METRICS_ADDR"
	EnvNetworkName  = "EBPF_CNI_NETWORK_NAME"
	EnvCNIVersion   = "EBPF_CNI_CNI_VERSION"
	EnvClusterCIDRs = "EBPF_CNI_CLUSTER_CIDRS"
	EnvServiceCIDRs = "EBPF_CNI_SERVICE_CIDRS"
	EnvMasquerade   = "EBPF_CNI_MASQUERADE"
	EnvMTU          = "EBPF_CNI_MTU"
	EnvDeviceType   = "EBPF_CNI_DEVICE_TYPE"
	EnvVXLANPort    = "EBPF_CNI_VXLAN_PORT"
	EnvVXLANVNI     = "EBPF_CNI_VXLAN_VNI"
	EnvNetPolicy    = "EBPF_CNI_NETWORK_POLICY"
	EnvXlat         = "EBPF_CNI_TRANSLATED_DESTINATIONS"
)

// EnvVars are all of them.
var EnvVars = []string{EnvNodeName, EnvKubeconfig, EnvMode, EnvHealthAddr, EnvMetricsAddr, EnvNetworkName, EnvCNIVersion, EnvClusterCIDRs, EnvServiceCIDRs, EnvMasquerade, EnvMTU, EnvDeviceType, EnvVXLANPort, EnvVXLANVNI, EnvNetPolicy, EnvXlat}

// env is an environment variable or def.
func env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok && v != "" {
		return v
	}
	return def
}

// envBool is a boolean environment variable or def; a value that is not
// one is an error naming the variable (a ConfigMap typo must not flip it).
func envBool(name string, def bool) (bool, error) {
	v := env(name, strconv.FormatBool(def))
	b, err := strconv.ParseBool(v)
	if err != nil {
		return def, &usageError{fmt.Errorf("%s: %q is not true or false", name, v)}
	}
	return b, nil
}

// envInt is an integer environment variable, 0 when unset; a value that is
// not one is an error naming the variable.
func envInt(name string) (int, error) {
	v := env(name, "")
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, &usageError{fmt.Errorf("%s: %q is not a number", name, v)}
	}
	return n, nil
}

// Main runs the agent's command line and returns the exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var err error
	switch args[0] {
	case "run":
		err = runCmd(ctx, args[1:], stderr, log)
	case "install":
		err = installCmd(ctx, args[1:], stderr, log)
	case "uninstall":
		err = uninstallCmd(args[1:], stderr, log)
	case "pause":
		err = pauseCmd(ctx, args[1:], stderr, log)
	case "version", "--version", "-version":
		fmt.Fprintf(stdout, "ebpf-cni-agent %s\n", buildinfo.Version)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
	default:
		fmt.Fprintf(stderr, "ebpf-cni-agent: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	var usageErr *usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &usageErr):
		fmt.Fprintf(stderr, "ebpf-cni-agent %s: %v\n", args[0], err)
		return 2
	}
	fmt.Fprintf(stderr, "ebpf-cni-agent %s: %v\n", args[0], err)
	return 1
}

type usageError struct{ error }

type common struct {
	node, kubeconfig string
}

func (c *common) flags(fs *flag.FlagSet) {
	fs.StringVar(&c.node, "node", env(EnvNodeName, ""), "this node's `NAME` (NODE_NAME)")
	fs.StringVar(&c.kubeconfig, "kubeconfig", env(EnvKubeconfig, ""), "kubeconfig `FILE` (KUBECONFIG); empty: the in-cluster service account")
}

func (c *common) client() (kubernetes.Interface, error) {
	cfg, err := c.restConfig()
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}

func (c *common) restConfig() (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if c.kubeconfig == "" {
		if cfg, err = rest.InClusterConfig(); err != nil {
			return nil, fmt.Errorf("API server configuration: %w (outside a pod, give -kubeconfig)", err)
		}
	} else if cfg, err = clientcmd.BuildConfigFromFlags("", c.kubeconfig); err != nil {
		return nil, fmt.Errorf("API server configuration from %s: %w", c.kubeconfig, err)
	}
	cfg.UserAgent = "ebpf-cni-agent/" + buildinfo.Version
	return cfg, nil
}

func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &usageError{err}
	}
	if fs.NArg() > 0 {
		return &usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	return nil
}

func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

func runCmd(ctx context.Context, args []string, stderr io.Writer, log *slog.Logger) error {
	o, err := parseRun(args, stderr)
	if err != nil {
		return err
	}
	m, err := conflist.ParseMode(o.mode)
	if err != nil {
		return &usageError{fmt.Errorf("-mode: %w", err)}
	}
	// The agent's handle on the plugin's node: no lock (the plugin's
	// calls hold it); each component reopens it for its work.
	nd, err := nodestate.Open(nodestate.Options{BPFRoot: o.bpfRoot, StateDir: o.stateDir, Objects: features.Objects(), Tag: features.Tag(), Lock: nodestate.Unlocked})
	if err != nil {
		return err
	}
	defer nd.Close()
	if !o.netpol {
		// Before the capabilities go: BPF may be among them.
		if err := ClearPolicies(nd); err != nil {
			log.Warn("network policies off, but the policies an earlier agent wrote could not be removed: pods of namespaces that had policies may start closed", "err", err)
		}
	}
	if o.dropCaps {
		if err := keepOnlyCaps(runCaps(m, o.metrics != "", o.netpol || o.xlat)); err != nil {
			return err
		}
	}
	routes, done, err := nodeRoutes(m, o.proto, nd, log)
	if err != nil {
		return err
	}
	defer done()
	cfg, err := o.restConfig()
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	var pc *PolicyController
	if o.netpol {
		cnp, err := cnpclient.NewForConfig(cfg)
		if err != nil {
			return err
		}
		pc = NewPolicyController(client, PolicyConfig{Node: nd, ClusterPolicies: cnp, Logger: log.With("controller", "networkpolicy")})
	}
	a, err := New(client, routes, Config{NodeName: o.node, Resync: o.resync, HealthAddr: o.health, Policy: pc, Logger: log})
	if err != nil {
		return &usageError{err}
	}
	var xc *XlatController
	if o.xlat {
		// The agent's Node watch: one per agent, not one per controller.
		xc = NewXlatController(client, XlatConfig{Node: nd, ServiceCIDRs: o.serviceCIDRs, Nodes: a.Nodes(), Logger: log.With("controller", "translated-destinations")})
	}
	if o.metrics != "" {
		mt := NewMetrics(nd, a, log)
		if pc != nil {
			mt.AddPolicy(pc)
		}
		stop, err := serveMetrics(o.metrics, mt)
		if err != nil {
			return err
		}
		defer stop()
	}
	log.Info("ebpf-cni-agent starting", "version", buildinfo.Version, "node", o.node, "mode", m, "routeProtocol", o.proto, "bpfRoot", o.bpfRoot, "stateDir", o.stateDir, "metrics", o.metrics, "networkPolicy", o.netpol, "translatedDestinations", o.xlat, "serviceCIDRs", o.serviceCIDRs)
	err = runSideBySide(ctx, a, pc, xc)
	if ctx.Err() != nil {
		log.Info("ebpf-cni-agent stopping; its routes or tunnel endpoints and the policies it wrote stay")
		return nil
	}
	return err
}

// runOptions are run's flags.
type runOptions struct {
	common
	mode              string
	proto             int
	bpfRoot, stateDir string
	dropCaps, netpol  bool
	xlat              bool           // keep the translated destinations (XlatController)
	serviceCIDRs      []netip.Prefix // the Service ranges, for the translated destinations
	health, metrics   string         // metrics: "" for none
	resync            time.Duration
}

// parseRun reads run's flags from args, their defaults from the
// environment.
func parseRun(args []string, stderr io.Writer) (*runOptions, error) {
	fs := flag.NewFlagSet("ebpf-cni-agent run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o runOptions
	o.flags(fs)
	fs.StringVar(&o.mode, "mode", env(EnvMode, string(conflist.ModeDirect)), "`direct|vxlan`: how pods reach other nodes' pods (EBPF_CNI_MODE)")
	fs.IntVar(&o.proto, "route-protocol", DefaultRouteProtocol, "route protocol `N` that tags the agent's routes (mode direct)")
	fs.StringVar(&o.bpfRoot, "bpf-root", config.DefaultBPFRoot, "the plugin's bpfRoot `DIR` (mode vxlan: its tunnel endpoints; the network policy maps; the metrics' maps)")
	fs.StringVar(&o.stateDir, "state-dir", config.DefaultStateDir, "the plugin's stateDir `DIR` (mode vxlan: its lock, and the agent's record; the metrics' call record)")
	fs.BoolVar(&o.dropCaps, "drop-caps", true, "drop every capability the mode does not use (direct: all but NET_ADMIN; vxlan: all but BPF; BPF kept for the metrics, network policies and translated destinations)")
	policyOn, policyErr := envBool(EnvNetPolicy, true)
	fs.BoolVar(&o.netpol, "network-policy", policyOn, "enforce the cluster's NetworkPolicies on this node's pods: write them into the plugin's maps (EBPF_CNI_NETWORK_POLICY)")
	xlatOn, xlatErr := envBool(EnvXlat, true)
	fs.BoolVar(&o.xlat, "translated-destinations", xlatOn, "keep the set of destinations kube-proxy translates (Services, nodes) in the plugin's maps, with a lease: the pods' new flows to anything else are set up in BPF, their first packet skipping the node's netfilter (EBPF_CNI_TRANSLATED_DESTINATIONS)")
	svcCIDRs := fs.String("service-cidrs", env(EnvServiceCIDRs, ""), "the cluster's Service `RANGES`, comma-separated (EBPF_CNI_SERVICE_CIDRS): with -translated-destinations, in the set from the start")
	fs.StringVar(&o.health, "health-addr", env(EnvHealthAddr, DefaultHealthAddr), "`ADDR` of /healthz and /readyz; empty: none")
	fs.StringVar(&o.metrics, "metrics-addr", env(EnvMetricsAddr, DefaultMetricsAddr), "`ADDR` of the Prometheus /metrics (EBPF_CNI_METRICS_ADDR); empty or off: none")
	fs.DurationVar(&o.resync, "resync", time.Minute, "how often everything is compared with the Node objects")
	if err := parse(fs, args); err != nil {
		return nil, err
	}
	if policyErr != nil && !flagSet(fs, "network-policy") {
		return nil, policyErr
	}
	if xlatErr != nil && !flagSet(fs, "translated-destinations") {
		return nil, xlatErr
	}
	for _, f := range strings.Split(*svcCIDRs, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return nil, &usageError{fmt.Errorf("-service-cidrs: %q: %w", f, err)}
		}
		o.serviceCIDRs = append(o.serviceCIDRs, p.Masked())
	}
	if o.metrics == "off" {
		o.metrics = ""
	}
	return &o, nil
}

// runCaps are the capabilities the agent keeps in mode m, with the metrics
// and the plugin's maps it writes (network policies, translated
// destinations) on or off.
func runCaps(m conflist.Mode, metrics, netpol bool) []int {
	caps := CapsOf[m]
	if metrics {
		caps = append(slices.Clone(caps), MetricsCaps...)
	}
	if netpol {
		caps = append(slices.Clone(caps), PolicyCaps...)
	}
	return caps
}

// serveMetrics serves mt's /metrics on addr until stop.
func serveMetrics(addr string, mt *Metrics) (stop func(), err error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening for metrics on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: mt.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	return func() { _ = srv.Close() }, nil
}

// runSideBySide runs the routes of a, the policies of pc and the translated
// destinations of xc (each if any) until ctx ends or the routes fail, and
// returns the routes' error.
//
// The routes, the policies and the translated destinations run side by
// side. The policies never stop
// the routes: what keeps them from starting (no bpffs, maps that cannot
// be opened) is retried and reported while the routes go on. The routes
// failing (the health port taken, nodes that cannot be watched) stops
// both, and the DaemonSet restarts the agent.
func runSideBySide(ctx context.Context, a *Agent, pc *PolicyController, xc *XlatController) error {
	run, cancel := context.WithCancel(ctx)
	defer cancel()
	policyDone, xlatDone := make(chan struct{}), make(chan struct{})
	go func() {
		if pc != nil {
			_ = pc.Run(run) // returns only when run ends
		}
		close(policyDone)
	}()
	go func() {
		if xc != nil {
			_ = xc.Run(run) // likewise
		}
		close(xlatDone)
	}()
	err := a.Run(run)
	cancel()
	<-policyDone
	<-xlatDone
	return err
}

// nodeRoutes is the mode's NodeRoutes, and what to close when the agent
// ends. In mode vxlan a bpfRoot that is not on a bpffs yet is no reason to
// stop: the mount can appear (mounted after the agent started, or a
// hand-run agent's node mounting it), and until then every tunnel endpoint
// fails, is retried with the reconciler's backoff (200 ms doubling to 30 s
// per node, and every full sync) and /readyz says why.
func nodeRoutes(m conflist.Mode, proto int, nd *nodestate.Node, log *slog.Logger) (NodeRoutes, func(), error) {
	switch m {
	case conflist.ModeDirect:
		h, err := netlinksafe.NewHandle()
		if err != nil {
			return nil, nil, fmt.Errorf("netlink: %w", err)
		}
		routes, err := NewDirect(h, proto)
		if err != nil {
			h.Close()
			return nil, nil, &usageError{err}
		}
		return routes, h.Close, nil
	case conflist.ModeVXLAN:
		if err := nd.Reopen().CheckBPFFS(); err != nil {
			log.Warn("tunnel endpoints cannot be written until the plugin's bpfRoot is on a bpffs: retrying", "err", err)
		}
		routes, err := NewVXLAN(nd, UnderlayFamily())
		if err != nil {
			return nil, nil, err
		}
		return routes, func() {}, nil
	}
	return nil, nil, &usageError{fmt.Errorf("mode %q: no routes for it", m)}
}

func installCmd(ctx context.Context, args []string, stderr io.Writer, log *slog.Logger) error {
	fs := flag.NewFlagSet("ebpf-cni-agent install", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c common
	c.flags(fs)
	cfg := InstallConfig{Logger: log}
	var cluster, service, mode string
	fs.StringVar(&cfg.SrcDir, "src", DefaultSrcDir, "`DIR` holding the plugin binaries to install")
	fs.StringVar(&cfg.CNIBinDir, "cni-bin-dir", DefaultCNIBinDir, "the node's CNI plugin `DIR` as mounted here")
	fs.StringVar(&cfg.CNIConfDir, "cni-conf-dir", DefaultCNIConfDir, "the node's CNI configuration `DIR` as mounted here")
	fs.StringVar(&cfg.ConfFile, "conf-file", conflist.DefaultFile, "conflist file `NAME`")
	fs.StringVar(&cfg.Conf.Name, "name", env(EnvNetworkName, conflist.DefaultName), "network `NAME` (EBPF_CNI_NETWORK_NAME)")
	fs.StringVar(&cfg.Conf.CNIVersion, "cni-version", env(EnvCNIVersion, conflist.DefaultVersion), "cniVersion `V` of the conflist (EBPF_CNI_CNI_VERSION)")
	fs.StringVar(&cluster, "cluster-cidrs", env(EnvClusterCIDRs, ""), "every node's pod `RANGES`, not masqueraded (EBPF_CNI_CLUSTER_CIDRS)")
	fs.StringVar(&service, "service-cidrs", env(EnvServiceCIDRs, ""), "the Service `RANGES` (EBPF_CNI_SERVICE_CIDRS)")
	masq, masqErr := envBool(EnvMasquerade, true)
	fs.BoolVar(&cfg.Conf.Masquerade, "masquerade", masq, "masquerade pod traffic leaving the cluster (EBPF_CNI_MASQUERADE)")
	fs.StringVar(&mode, "mode", env(EnvMode, string(conflist.ModeDirect)), "`direct|vxlan` (EBPF_CNI_MODE)")
	fs.IntVar(&cfg.Conf.MTU, "mtu", 0, "pod `MTU` (EBPF_CNI_MTU; default: the uplink's, less the overlay's overhead)")
	fs.StringVar(&cfg.Conf.DeviceType, "device-type", env(EnvDeviceType, ""), "the pods' device `TYPE`, auto|netkit|veth (EBPF_CNI_DEVICE_TYPE; default auto: netkit where the node's kernel has it, else veth)")
	fs.IntVar(&cfg.Conf.VXLANPort, "vxlan-port", 0, "UDP `PORT` of the overlay, mode vxlan (EBPF_CNI_VXLAN_PORT; default 4789)")
	fs.IntVar(&cfg.Conf.VXLANVNI, "vxlan-vni", 0, "`VNI` of the overlay, mode vxlan (EBPF_CNI_VXLAN_VNI; default 1)")
	fs.StringVar(&cfg.Conf.BPFRoot, "bpf-root", "", "the plugin's bpfRoot `DIR` on the node, written into the conflist (default: the plugin's)")
	fs.StringVar(&cfg.BPFRootMount, "bpf-root-mount", "", "where the plugin's bpfRoot is mounted here, for the warm-up STATUS (`DIR`; default: -bpf-root)")
	fs.StringVar(&cfg.Conf.StateDir, "state-dir", "", "the plugin's stateDir `DIR` (default: the plugin's)")
	fs.BoolVar(&cfg.WarmUp, "warm-up", true, "run the installed plugin's STATUS: load its programs now, fail here if it cannot")
	if err := parse(fs, args); err != nil {
		return err
	}
	if masqErr != nil && !flagSet(fs, "masquerade") {
		return masqErr
	}
	var err error
	if cfg.Conf.MTU == 0 {
		if cfg.Conf.MTU, err = envInt(EnvMTU); err != nil {
			return err
		}
	}
	// Named as the variable (the ConfigMap's key) or the flag that set it.
	var oe *conflist.OptionError
	if err := conflist.CheckDeviceType(cfg.Conf.DeviceType); errors.As(err, &oe) {
		from := EnvDeviceType
		if flagSet(fs, "device-type") {
			from = "-device-type"
		}
		return &usageError{fmt.Errorf("%s: %s", from, oe.Msg)}
	}
	if cfg.Conf.VXLANPort == 0 {
		if cfg.Conf.VXLANPort, err = envInt(EnvVXLANPort); err != nil {
			return err
		}
	}
	if cfg.Conf.VXLANVNI == 0 {
		if cfg.Conf.VXLANVNI, err = envInt(EnvVXLANVNI); err != nil {
			return err
		}
	}
	cfg.NodeName = c.node
	if cfg.Conf.ClusterCIDRs, err = conflist.ParseCIDRs("clusterCIDRs", cluster); err != nil {
		return &usageError{err}
	}
	if cfg.Conf.ServiceCIDRs, err = conflist.ParseCIDRs("serviceCIDRs", service); err != nil {
		return &usageError{err}
	}
	if cfg.Conf.Mode, err = conflist.ParseMode(mode); err != nil {
		return &usageError{fmt.Errorf("mode: %w", err)}
	}
	if err := cfg.check(); err != nil {
		return &usageError{err}
	}
	client, err := c.client()
	if err != nil {
		return err
	}
	return Install(ctx, client, cfg)
}

func uninstallCmd(args []string, stderr io.Writer, log *slog.Logger) error {
	fs := flag.NewFlagSet("ebpf-cni-agent uninstall", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg := UninstallConfig{Logger: log}
	fs.StringVar(&cfg.CNIBinDir, "cni-bin-dir", DefaultCNIBinDir, "the node's CNI plugin `DIR` as mounted here (install's record is there)")
	fs.StringVar(&cfg.CNIConfDir, "cni-conf-dir", DefaultCNIConfDir, "the node's CNI configuration `DIR` as mounted here")
	fs.StringVar(&cfg.NodeBPFRoot, "bpf-root", config.DefaultBPFRoot, "the plugin's bpfRoot `DIR` on the node")
	fs.StringVar(&cfg.BPFRoot, "bpf-root-mount", "", "where the plugin's bpfRoot is mounted here (`DIR`; default: -bpf-root)")
	fs.StringVar(&cfg.StateDir, "state-dir", config.DefaultStateDir, "the plugin's stateDir `DIR`")
	fs.IntVar(&cfg.RouteProtocol, "route-protocol", DefaultRouteProtocol, "route protocol `N` of the agent's routes")
	fs.StringVar(&cfg.AgentHealthAddr, "health-addr", env(EnvHealthAddr, DefaultHealthAddr), "`ADDR` where the node's agent answers /readyz: refused while it does (EBPF_CNI_HEALTH_ADDR); empty: not asked")
	fs.BoolVar(&cfg.Force, "force", false, "go on while pods are on ebpf-cni (they lose their network) or the agent answers")
	if err := parse(fs, args); err != nil {
		return err
	}
	if cfg.BPFRoot == "" {
		cfg.BPFRoot = cfg.NodeBPFRoot
	}
	if err := cfg.check(); err != nil {
		return &usageError{err}
	}
	return Uninstall(cfg)
}

// pauseCmd blocks until the agent is told to stop: the uninstall
// DaemonSet's container, which only has to be running once its init
// container has done the work (the image has no shell to sleep in).
func pauseCmd(ctx context.Context, args []string, stderr io.Writer, log *slog.Logger) error {
	fs := flag.NewFlagSet("ebpf-cni-agent pause", flag.ContinueOnError)
	fs.SetOutput(stderr)
	if err := parse(fs, args); err != nil {
		return err
	}
	log.Info("pausing until SIGTERM")
	<-ctx.Done()
	return nil
}
