// Package cnp runs the upstream ClusterNetworkPolicy conformance suite,
// sigs.k8s.io/network-policy-api/conformance (the ClusterNetworkPolicy
// profile), against make e2e's cluster (E2E_CNP=1: test/e2e/build.sh
// builds it, test/e2e/run.sh runs it and writes its ConformanceReport).
//
// This is the upstream suite's own profile entry
// (conformance/conformance_profile_test.go at the module's version) with
// one addition: -skip-tests, the suite's Options.SkipTests, which upstream
// exposes to Go callers only (a test skipped so is reported as SKIPPED; one
// skipped with go test's -test.skip would be reported as SUCCEEDED), and
// -base-manifests, to start the base pods without their SCTP servers on a
// kernel that has no SCTP (they would never be ready). Its own
// module keeps controller-runtime and the suite out of ebpf-cni's go.mod.
package cnp

import (
	"embed"
	"flag"
	"os"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/config"
	"sigs.k8s.io/yaml"

	api "sigs.k8s.io/network-policy-api/apis/v1beta1"
	"sigs.k8s.io/network-policy-api/conformance/tests"
	"sigs.k8s.io/network-policy-api/conformance/utils/flags"
	"sigs.k8s.io/network-policy-api/conformance/utils/suite"
)

var (
	skipTests     = flag.String("skip-tests", "", "comma-separated short names of tests not to run (reported as SKIPPED)")
	baseManifests = flag.String("base-manifests", "base/manifests.yaml", "the suite's base pods: base/manifests.yaml, or base/manifests-nosctp.yaml (without the SCTP servers, for a kernel without SCTP)")
)

// manifests is the suite's base/ as test/e2e/build.sh copied it from the
// module, with manifests-nosctp.yaml beside manifests.yaml.
//
//go:embed base
var manifests embed.FS

func TestConformanceProfiles(t *testing.T) {
	cfg, err := config.GetConfig()
	if err != nil {
		t.Fatalf("loading the Kubernetes config: %v", err)
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatalf("the Kubernetes client: %v", err)
	}
	kubeConfig, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(clientcmd.NewDefaultClientConfigLoadingRules(), &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		t.Fatalf("the client-go config: %v", err)
	}
	clientSet, err := kubernetes.NewForConfig(kubeConfig)
	if err != nil {
		t.Fatalf("the client-go clientset: %v", err)
	}
	if err := api.Install(c.Scheme()); err != nil {
		t.Fatalf("the API's scheme: %v", err)
	}
	if err := apiextensionsv1.AddToScheme(c.Scheme()); err != nil {
		t.Fatalf("the apiextensions scheme: %v", err)
	}
	profiles := suite.ParseConformanceProfiles(*flags.ConformanceProfiles)
	if profiles.Len() == 0 {
		t.Fatal("-conformance-profiles: none named (ClusterNetworkPolicy)")
	}
	impl, err := suite.ParseImplementation(*flags.ImplementationOrganization, *flags.ImplementationProject,
		*flags.ImplementationURL, *flags.ImplementationVersion, *flags.ImplementationContact,
		*flags.ImplementationAdditionalInformation)
	if err != nil {
		t.Fatalf("the implementation's details: %v", err)
	}
	var skip []string
	if *skipTests != "" {
		skip = strings.Split(*skipTests, ",")
	}
	s, err := suite.NewConformanceProfileTestSuite(suite.ConformanceProfileOptions{
		Options: suite.Options{
			Client:                     c,
			ClientSet:                  clientSet,
			KubeConfig:                 *cfg,
			Debug:                      *flags.ShowDebug,
			CleanupBaseResources:       *flags.CleanupBaseResources,
			SupportedFeatures:          suite.ParseSupportedFeatures(*flags.SupportedFeatures),
			ExemptFeatures:             suite.ParseSupportedFeatures(*flags.ExemptFeatures),
			EnableAllSupportedFeatures: *flags.EnableAllSupportedFeatures,
			SkipTests:                  skip,
			BaseManifests:              *baseManifests,
			FS:                         &manifests,
		},
		Implementation:      *impl,
		ConformanceProfiles: profiles,
	})
	if err != nil {
		t.Fatalf("the conformance suite: %v", err)
	}
	s.Setup(t)
	s.Run(t, tests.ConformanceTests)
	report, err := s.Report()
	if err != nil {
		t.Fatalf("the conformance report: %v", err)
	}
	raw, err := yaml.Marshal(report)
	if err != nil {
		t.Fatalf("the conformance report: %v", err)
	}
	if *flags.ReportOutput != "" {
		if err := os.WriteFile(*flags.ReportOutput, raw, 0o644); err != nil {
			t.Fatalf("writing the report: %v", err)
		}
	}
	t.Logf("Conformance report:\n%s", raw)
}
