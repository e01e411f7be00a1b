package deploy_test

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
)

func podman(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("podman", args...).CombinedOutput()
	require.NoError(t, err, "podman %s: %s", strings.Join(args, " "), out)
	return strings.TrimSpace(string(out))
}

// TestMakeImage: make image, with no network at all (its own network
// namespace), writes an OCI archive of exactly the four static binaries
// (the agent, the two plugins, the reference loopback plugin) named with
// the build version (checkArchive), which podman loads: the binaries in it
// are the ones built, the agent reports that version, and the paths the
// DaemonSet uses are there. make image-archive writes the same archive of
// the same binaries, byte for byte. (ctr -n k8s.io images import takes it
// in make e2e.)
func TestMakeImage(t *testing.T) {
	testutil.RequireRoot(t)
	image, bin, archive := makeImage(t)
	version := strings.TrimPrefix(image, "localhost/ebpf-cni:")
	src := strings.TrimPrefix(agent.DefaultSrcDir, "/")
	binaries := map[string]string{"ebpf-cni-agent": "ebpf-cni-agent", src + "/ebpf-cni": "ebpf-cni", src + "/ebpf-ipam": "ebpf-ipam", src + "/loopback": "loopback"}
	checkArchive(t, archive, image, bin, binaries)

	again := filepath.Join(t.TempDir(), "again.oci.tar")
	out, err := exec.Command("unshare", "--net", "--", "make", "--no-print-directory", "-C", testutil.ModuleRoot(), "image-archive",
		"BIN="+bin, "VERSION="+version, "IMAGE_ARCHIVE="+again).CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Equal(t, fileDigest(t, archive), fileDigest(t, again), "make image-archive of the same binaries wrote another archive")

	var inspect []struct {
		Architecture string
		Config       struct {
			Entrypoint []string
			Cmd        []string
			Labels     map[string]string
		}
	}
	require.NoError(t, json.Unmarshal([]byte(podman(t, "image", "inspect", image)), &inspect))
	require.Len(t, inspect, 1)
	require.Equal(t, runtime.GOARCH, inspect[0].Architecture)
	require.Equal(t, []string{"/ebpf-cni-agent"}, inspect[0].Config.Entrypoint)
	require.Equal(t, []string{"run"}, inspect[0].Config.Cmd)
	require.Equal(t, version, inspect[0].Config.Labels["org.opencontainers.image.version"])
	require.Equal(t, "ebpf-cni", inspect[0].Config.Labels["org.opencontainers.image.title"])

	root := podman(t, "image", "mount", image)
	t.Cleanup(func() { _ = exec.Command("podman", "image", "unmount", image).Run() })
	files := tree(t, root)
	require.ElementsMatch(t, []string{"ebpf-cni-agent", "opt/", "opt/ebpf-cni/", src + "/", src + "/ebpf-cni", src + "/ebpf-ipam", src + "/loopback"}, files)
	for path, name := range binaries {
		want, err := os.ReadFile(filepath.Join(bin, name))
		require.NoError(t, err)
		got, err := os.ReadFile(filepath.Join(root, path))
		require.NoError(t, err)
		require.Equal(t, want, got, path)
	}
	for _, arg := range []string{"version", "--version"} {
		v, err := exec.Command(filepath.Join(root, "ebpf-cni-agent"), arg).CombinedOutput()
		require.NoError(t, err)
		require.Equal(t, "ebpf-cni-agent "+version+"\n", string(v), arg)
	}
	v, err := exec.Command(filepath.Join(root, src, "ebpf-cni"), "--version").CombinedOutput()
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(v), "ebpf-cni "+version+"\nprograms tag "+version+"-"), "%s", v)
}

func fileDigest(t *testing.T, name string) string {
	t.Helper()
	f, err := os.Open(name)
	require.NoError(t, err)
	defer f.Close()
	h := sha256.New()
	_, err = io.Copy(h, f)
	require.NoError(t, err)
	return hex.EncodeToString(h.Sum(nil))
}

// descriptor is an OCI content descriptor.
type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Platform    map[string]string `json:"platform"`
	Annotations map[string]string `json:"annotations"`
}

// checkArchive reads the OCI image archive (an image layout in a tar)
// itself, as ctr and podman do: its layout version, every blob named by
// its digest, an index with one manifest for linux on this architecture
// named image (io.containerd.image.name: what ctr and podman name it by;
// org.opencontainers.image.ref.name: its tag), the manifest's config and
// single uncompressed layer, the config's entrypoint, command, labels and
// diff ID, and in the layer the binaries of bin at their paths (binaries:
// path in the image -> name in bin), executable and owned by root, and
// their directories, nothing else.
func checkArchive(t *testing.T, archive, image, bin string, binaries map[string]string) {
	t.Helper()
	f, err := os.Open(archive)
	require.NoError(t, err)
	defer f.Close()
	entries := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		require.Equal(t, byte(tar.TypeReg), h.Typeflag, h.Name)
		b, err := io.ReadAll(tr)
		require.NoError(t, err)
		entries[h.Name] = b
	}
	require.JSONEq(t, `{"imageLayoutVersion":"1.0.0"}`, string(entries["oci-layout"]))
	blob := func(d descriptor, mediaType string) []byte {
		t.Helper()
		require.Equal(t, mediaType, d.MediaType)
		b, ok := entries["blobs/sha256/"+strings.TrimPrefix(d.Digest, "sha256:")]
		require.True(t, ok, "no blob %s", d.Digest)
		require.EqualValues(t, d.Size, len(b), d.Digest)
		return b
	}
	for name, b := range entries {
		if hexDigest, ok := strings.CutPrefix(name, "blobs/sha256/"); ok {
			sum := sha256.Sum256(b)
			require.Equal(t, hexDigest, hex.EncodeToString(sum[:]), "blob %s is not what its name says", name)
		}
	}
	require.Len(t, entries, 5, "oci-layout, index.json, manifest, config, layer")

	var index struct {
		SchemaVersion int          `json:"schemaVersion"`
		MediaType     string       `json:"mediaType"`
		Manifests     []descriptor `json:"manifests"`
	}
	require.NoError(t, json.Unmarshal(entries["index.json"], &index))
	require.Equal(t, 2, index.SchemaVersion)
	require.Equal(t, "application/vnd.oci.image.index.v1+json", index.MediaType)
	require.Len(t, index.Manifests, 1)
	md := index.Manifests[0]
	require.Equal(t, map[string]string{"os": "linux", "architecture": runtime.GOARCH}, md.Platform)
	require.Equal(t, image, md.Annotations["io.containerd.image.name"])
	require.Equal(t, image[strings.LastIndex(image, ":")+1:], md.Annotations["org.opencontainers.image.ref.name"])

	var manifest struct {
		SchemaVersion int          `json:"schemaVersion"`
		Config        descriptor   `json:"config"`
		Layers        []descriptor `json:"layers"`
	}
	require.NoError(t, json.Unmarshal(blob(md, "application/vnd.oci.image.manifest.v1+json"), &manifest))
	require.Equal(t, 2, manifest.SchemaVersion)
	require.Len(t, manifest.Layers, 1)
	var config struct {
		Architecture string `json:"architecture"`
		OS           string `json:"os"`
		Config       struct {
			Entrypoint []string
			Cmd        []string
			Labels     map[string]string
		} `json:"config"`
		RootFS struct {
			Type    string   `json:"type"`
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	require.NoError(t, json.Unmarshal(blob(manifest.Config, "application/vnd.oci.image.config.v1+json"), &config))
	require.Equal(t, runtime.GOARCH, config.Architecture)
	require.Equal(t, "linux", config.OS)
	require.Equal(t, []string{"/ebpf-cni-agent"}, config.Config.Entrypoint)
	require.Equal(t, []string{"run"}, config.Config.Cmd)
	version := image[strings.LastIndex(image, ":")+1:]
	require.Equal(t, map[string]string{"org.opencontainers.image.title": "ebpf-cni", "org.opencontainers.image.version": version}, config.Config.Labels)
	require.Equal(t, "layers", config.RootFS.Type)
	require.Equal(t, []string{manifest.Layers[0].Digest}, config.RootFS.DiffIDs, "an uncompressed layer is its own diff ID")

	layer := tar.NewReader(bytes.NewReader(blob(manifest.Layers[0], "application/vnd.oci.image.layer.v1.tar")))
	var names []string
	for {
		h, err := layer.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		names = append(names, h.Name)
		require.Zero(t, h.Uid, h.Name)
		require.Zero(t, h.Gid, h.Name)
		require.EqualValues(t, 0o755, h.Mode, h.Name)
		if h.Typeflag == tar.TypeDir {
			continue
		}
		require.Equal(t, byte(tar.TypeReg), h.Typeflag, h.Name)
		name, ok := binaries[h.Name]
		require.True(t, ok, "%s in the layer", h.Name)
		got, err := io.ReadAll(layer)
		require.NoError(t, err)
		want, err := os.ReadFile(filepath.Join(bin, name))
		require.NoError(t, err)
		require.True(t, bytes.Equal(want, got), "%s in the layer is not %s of make build", h.Name, name)
	}
	src := strings.TrimPrefix(agent.DefaultSrcDir, "/")
	require.Equal(t, []string{"ebpf-cni-agent", "opt/", "opt/ebpf-cni/", src + "/", src + "/ebpf-cni", src + "/ebpf-ipam", src + "/loopback"}, names)
}
