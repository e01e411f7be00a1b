package deploy_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
)

// cnpCRD is the ClusterNetworkPolicy CRD the chart installs (helm install
// applies crds/; kubectl users apply the file: docs/deploy.md).
const cnpCRD = "deploy/helm/ebpf-cni/crds/policy.networking.k8s.io_clusternetworkpolicies.yaml"

// TestClusterNetworkPolicyCRD: the chart's CRD is the standard channel's
// of the sigs.k8s.io/network-policy-api version in go.mod, byte for byte
// (an upgrade of the module brings its CRD along), and it serves the
// version the agent watches.
func TestClusterNetworkPolicyCRD(t *testing.T) {
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Version}} {{.Dir}}", "sigs.k8s.io/network-policy-api")
	cmd.Dir = testutil.ModuleRoot()
	out, err := cmd.Output()
	require.NoError(t, err)
	version, dir, ok := strings.Cut(strings.TrimSpace(string(out)), " ")
	require.True(t, ok, "%s", out)
	want, err := os.ReadFile(filepath.Join(dir, "config/crd/standard", filepath.Base(cnpCRD)))
	require.NoError(t, err)
	got, err := os.ReadFile(filepath.Join(testutil.ModuleRoot(), cnpCRD))
	require.NoError(t, err)
	require.True(t, bytes.Equal(want, got), "%s is not the CRD of sigs.k8s.io/network-policy-api %s: copy its config/crd/standard file", cnpCRD, version)

	var crd struct {
		Metadata struct {
			Annotations map[string]string `json:"annotations"`
		} `json:"metadata"`
		Spec struct {
			Names    struct{ Plural string } `json:"names"`
			Versions []struct {
				Name   string `json:"name"`
				Served bool   `json:"served"`
			} `json:"versions"`
		} `json:"spec"`
	}
	require.NoError(t, yaml.Unmarshal(got, &crd))
	require.Equal(t, version, crd.Metadata.Annotations["policy.networking.k8s.io/bundle-version"])
	served := map[string]bool{}
	for _, v := range crd.Spec.Versions {
		served[v.Name] = v.Served
	}
	require.True(t, served["v1beta1"], "the agent watches policy.networking.k8s.io/v1beta1")
	require.Equal(t, "clusternetworkpolicies", crd.Spec.Names.Plural)

	// helm template (the manifest's comparison) renders no CRD: the
	// chart's defaults stay the manifest.
	require.NotContains(t, render(t), "CustomResourceDefinition/clusternetworkpolicies.policy.networking.k8s.io")
}
