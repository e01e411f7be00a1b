// Package netpol runs the upstream Kubernetes NetworkPolicy e2e tests
// (k8s.io/kubernetes/test/e2e/network/netpol) and nothing else: only that
// suite and the e2e framework are compiled, not all of test/e2e. make e2e
// builds it with E2E_NETPOL=1 (test/e2e/build.sh netpol) and runs it against
// its cluster (test/e2e/run.sh); its own module, at the cluster's Kubernetes
// version, keeps k8s.io/kubernetes out of ebpf-cni's go.mod.
package netpol

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	"k8s.io/klog/v2"
	"k8s.io/kubernetes/test/e2e/framework"
	"k8s.io/kubernetes/test/e2e/framework/config"

	// The features the suite's labels name, then the suite itself.
	_ "k8s.io/kubernetes/test/e2e/feature"
	_ "k8s.io/kubernetes/test/e2e/network/netpol"

	// What test/e2e's own main links in for the framework: the dumps on a
	// failure (events, pods, nodes) and the node helpers.
	_ "k8s.io/kubernetes/test/e2e/framework/debug/init"
	_ "k8s.io/kubernetes/test/e2e/framework/node/init"
)

func TestMain(m *testing.M) {
	config.CopyFlags(config.Flags, flag.CommandLine)
	framework.RegisterCommonFlags(flag.CommandLine)
	framework.RegisterClusterFlags(flag.CommandLine)
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "unknown arguments: %v\n", flag.Args())
		os.Exit(2)
	}
	framework.AfterReadingAllFlags(&framework.TestContext)
	os.Exit(m.Run())
}

// TestNetpol runs the specs the -ginkgo.focus, -ginkgo.skip and
// -ginkgo.label-filter flags select, as test/e2e's RunE2ETests does.
func TestNetpol(t *testing.T) {
	klog.EnableContextualLogging(true)
	gomega.RegisterFailHandler(framework.Fail)
	suiteConfig, reporterConfig := framework.CreateGinkgoConfig()
	ginkgo.RunSpecs(t, "Kubernetes NetworkPolicy e2e (netpol)", suiteConfig, reporterConfig)
}
