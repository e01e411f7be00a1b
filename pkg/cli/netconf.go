package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/ebpf-cni/ebpf-cni/pkg/plugin"
)

// networkConfigs are the ebpf-cni networks configured in confDir (the
// runtime's *.conflist, *.conf and *.json, as libcni reads them) whose
// bpfRoot and stateDir are the CLI's, each as the plugin would get it on
// stdin: the plugin's object with the list's name and cniVersion. What
// cannot be read is a note.
func networkConfigs(confDir string, ctx *Context) (out []*plugin.Config, notes []string) {
	ents, err := os.ReadDir(confDir)
	if err != nil {
		return nil, []string{fmt.Sprintf("no network configuration read from %s (%v): what only a network's configuration tells (masquerade settings, ebpf-ipam's addresses of rebuilt records) waits for its next CNI STATUS or ADD", confDir, err)}
	}
	names := []string{}
	for _, e := range ents {
		if ext := filepath.Ext(e.Name()); !e.IsDir() && (ext == ".conflist" || ext == ".conf" || ext == ".json") {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	for _, name := range names {
		b, err := os.ReadFile(filepath.Join(confDir, name))
		if err != nil {
			notes = append(notes, fmt.Sprintf("%s: %v", name, err))
			continue
		}
		var list struct {
			Name       string           `json:"name"`
			CNIVersion string           `json:"cniVersion"`
			Type       string           `json:"type"`
			Plugins    []map[string]any `json:"plugins"`
		}
		if json.Unmarshal(b, &list) != nil {
			continue
		}
		var confs [][]byte
		if list.Type == "ebpf-cni" {
			confs = append(confs, b)
		}
		for _, p := range list.Plugins {
			if p["type"] != "ebpf-cni" {
				continue
			}
			p["name"], p["cniVersion"] = list.Name, list.CNIVersion
			if c, err := json.Marshal(p); err == nil {
				confs = append(confs, c)
			}
		}
		for _, conf := range confs {
			c, err := plugin.ParseConfig(conf, "", false)
			if err != nil {
				notes = append(notes, fmt.Sprintf("%s: %v", name, err))
				continue
			}
			if filepath.Clean(c.BPFRoot) == filepath.Clean(ctx.BPFRoot) && filepath.Clean(c.StateDir) == filepath.Clean(ctx.StateDir) &&
				!strings.ContainsAny(c.Name, "/\\") {
				out = append(out, c)
			}
		}
	}
	return out, notes
}
