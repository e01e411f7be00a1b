// Command ociimage writes a container image as an OCI image archive (an
// OCI image layout in one tar file) that `ctr -n k8s.io images import` and
// `podman load -i` take: no registry, no container engine. make image
// writes the DaemonSet's image with it, test/e2e/run.sh its test images.
//
//	ociimage -o OUT.tar -name REF [-entrypoint A,B] [-cmd A,B] [-label K=V ...]
//	    [-arch amd64] DEST=SRC ...
//
// The image has one uncompressed layer holding each file SRC at DEST (mode
// 0755, owner root, time 0) and the directories above them, in a fixed
// order: the same binaries make the same archive, byte for byte. The
// index names the image twice: io.containerd.image.name (REF, which ctr
// and podman 4 name the image by) and org.opencontainers.image.ref.name
// (its tag, which oci-archive:OUT.tar:TAG selects).
package main

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"
)

// image is what goes into the archive.
type image struct {
	Name       string            // reference, e.g. localhost/ebpf-cni:v0.2.0
	Arch       string            // GOARCH of the binaries
	Entrypoint []string          // config.Entrypoint
	Cmd        []string          // config.Cmd
	Labels     map[string]string // config.Labels
	Files      map[string]string // path in the image -> file to copy there
}

// The media types of the archive's blobs.
const (
	mediaIndex    = "application/vnd.oci.image.index.v1+json"
	mediaManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaConfig   = "application/vnd.oci.image.config.v1+json"
	mediaLayer    = "application/vnd.oci.image.layer.v1.tar"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "ociimage:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("ociimage", flag.ExitOnError)
	out := fs.String("o", "", "the archive to write")
	img := image{Labels: map[string]string{}, Files: map[string]string{}}
	fs.StringVar(&img.Name, "name", "", "the image's reference, e.g. localhost/ebpf-cni:v0.2.0")
	fs.StringVar(&img.Arch, "arch", runtime.GOARCH, "the binaries' architecture (GOARCH)")
	entry := fs.String("entrypoint", "", "comma-separated entrypoint")
	cmd := fs.String("cmd", "", "comma-separated command (the entrypoint's arguments)")
	fs.Func("label", "`KEY=VALUE` label of the image (repeatable)", func(s string) error {
		k, v, ok := strings.Cut(s, "=")
		if !ok || k == "" {
			return fmt.Errorf("%q is not KEY=VALUE", s)
		}
		img.Labels[k] = v
		return nil
	})
	fs.Parse(args)
	if *out == "" || img.Name == "" {
		return errors.New("-o and -name are required")
	}
	if !strings.Contains(path.Base(img.Name), ":") {
		return fmt.Errorf("-name %q has no tag (e.g. %s:v0.2.0)", img.Name, img.Name)
	}
	img.Entrypoint, img.Cmd = split(*entry), split(*cmd)
	for _, a := range fs.Args() {
		dest, src, ok := strings.Cut(a, "=")
		if !ok || dest == "" || src == "" {
			return fmt.Errorf("%q is not DEST=SRC", a)
		}
		img.Files[path.Clean("/"+dest)] = src
	}
	if len(img.Files) == 0 {
		return errors.New("no DEST=SRC: an image of nothing")
	}
	return write(*out, img)
}

func split(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// write writes img as an OCI image archive to out, through a temporary
// file renamed into place: out is whole or absent. The layer goes to a
// second temporary file first (its digest comes before it in the archive's
// index), so neither is held in memory.
func write(out string, img image) (err error) {
	dir := filepath.Dir(out)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	layer, err := os.CreateTemp(dir, ".layer-*")
	if err != nil {
		return err
	}
	defer func() { layer.Close(); os.Remove(layer.Name()) }()
	h := sha256.New()
	if err := writeLayer(io.MultiWriter(layer, h), img.Files); err != nil {
		return fmt.Errorf("writing the layer: %w", err)
	}
	layerSize, err := layer.Seek(0, io.SeekCurrent)
	if err != nil {
		return err
	}
	layerDigest := sum(h)

	run := map[string]any{}
	if len(img.Entrypoint) > 0 {
		run["Entrypoint"] = img.Entrypoint
	}
	if len(img.Cmd) > 0 {
		run["Cmd"] = img.Cmd
	}
	if len(img.Labels) > 0 {
		run["Labels"] = img.Labels
	}
	cfg, err := json.Marshal(map[string]any{
		"architecture": img.Arch,
		"os":           "linux",
		"config":       run,
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{layerDigest}},
	})
	if err != nil {
		return err
	}
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaManifest,
		"config":        desc(mediaConfig, digest(cfg), len(cfg)),
		"layers":        []any{desc(mediaLayer, layerDigest, layerSize)},
	})
	if err != nil {
		return err
	}
	md := desc(mediaManifest, digest(manifest), len(manifest))
	md["platform"] = map[string]string{"architecture": img.Arch, "os": "linux"}
	md["annotations"] = map[string]string{
		"io.containerd.image.name":          img.Name,
		"org.opencontainers.image.ref.name": img.Name[strings.LastIndex(img.Name, ":")+1:],
	}
	index, err := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": mediaIndex, "manifests": []any{md}})
	if err != nil {
		return err
	}

	f, err := os.CreateTemp(dir, ".archive-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	tw := tar.NewWriter(f)
	for _, b := range []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
		{blob(digest(cfg)), cfg},
		{blob(digest(manifest)), manifest},
	} {
		if err := writeFile(tw, b.name, 0o644, int64(len(b.data)), strings.NewReader(string(b.data))); err != nil {
			return err
		}
	}
	if _, err := layer.Seek(0, io.SeekStart); err != nil {
		return err
	}
	if err := writeFile(tw, blob(layerDigest), 0o644, layerSize, layer); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := f.Chmod(0o644); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), out)
}

// writeLayer writes the layer's tar: every file with its parent
// directories, sorted by path.
func writeLayer(w io.Writer, files map[string]string) error {
	var names []string
	dirs := map[string]bool{}
	for dest := range files {
		names = append(names, dest)
		for d := path.Dir(dest); d != "/"; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	for d := range dirs {
		names = append(names, d+"/")
	}
	sort.Strings(names)
	tw := tar.NewWriter(w)
	for _, n := range names {
		name := strings.TrimPrefix(n, "/")
		if strings.HasSuffix(n, "/") {
			if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Typeflag: tar.TypeDir, ModTime: time.Unix(0, 0)}); err != nil {
				return err
			}
			continue
		}
		if err := copyFile(tw, name, files[n]); err != nil {
			return err
		}
	}
	return tw.Close()
}

func copyFile(tw *tar.Writer, name, src string) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", src)
	}
	return writeFile(tw, name, 0o755, st.Size(), f)
}

// writeFile writes one regular file of size bytes from r, at time 0.
func writeFile(tw *tar.Writer, name string, mode, size int64, r io.Reader) error {
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: mode, Size: size, Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0)}); err != nil {
		return err
	}
	n, err := io.Copy(tw, r)
	if err == nil && n != size {
		err = fmt.Errorf("%s: %d bytes, not %d (changed while read)", name, n, size)
	}
	return err
}

func blob(digest string) string { return "blobs/sha256/" + strings.TrimPrefix(digest, "sha256:") }

func sum(h hash.Hash) string { return "sha256:" + hex.EncodeToString(h.Sum(nil)) }

func digest(b []byte) string {
	h := sha256.New()
	h.Write(b)
	return sum(h)
}

func desc[N int | int64](mediaType, digest string, size N) map[string]any {
	return map[string]any{"mediaType": mediaType, "digest": digest, "size": size}
}
