package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"golang.org/x/sys/unix"
)

// cniPlugin runs e2ebox as the CNI plugin e2e-record, the call in the
// environment (CNI_COMMAND...) and on stdin: make e2e copies e2ebox onto each node as
// /opt/cni/bin/e2e-record to see what reaches the plugins of a conflist
// that other installers share with ebpf-cni (issue 56). One binary, two
// roles, told apart by the "delegate" key:
//
//   - recorder: chained after ebpf-cni in its conflist (istio-cni's way),
//     it logs each call and hands the prevResult on unchanged;
//   - delegator: alone in a conflist that sorts before ebpf-cni's (Multus's
//     way), it logs each call and runs the conflist named by "delegate"
//     through libcni, as a runtime would.
//
// Configuration keys besides type ("e2e-record"), name and cniVersion:
//
//	log       the file each call appends one JSON line (record) to; required
//	delegate  the conflist to run: makes it a delegator
//	cacheDir  the delegator's libcni cache; libcni's default (/var/lib/cni) when empty
//
// A delegator passes its runtimeConfig (the capability arguments the
// runtime gave it: portMappings, bandwidth, mac...) on as the delegate's
// capability arguments: declare them under "capabilities" for the runtime
// to send them.
func cniPlugin() {
	call := func(command string) func(*skel.CmdArgs) error {
		return func(args *skel.CmdArgs) error { return recordCall(command, args) }
	}
	skel.PluginMainFuncs(skel.CNIFuncs{Add: call("ADD"), Check: call("CHECK"), Del: call("DEL"), Status: call("STATUS"), GC: call("GC")},
		version.PluginSupports("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"), "e2ebox as the CNI plugin e2e-record (test/e2e)")
}

// recordConf is e2e-record's configuration.
type recordConf struct {
	types.PluginConf
	Log           string         `json:"log"`
	Delegate      string         `json:"delegate"`
	CacheDir      string         `json:"cacheDir"`
	RuntimeConfig map[string]any `json:"runtimeConfig"`
}

// record is one line of the log: one call.
type record struct {
	Time        string `json:"time"`    // when the call started, RFC 3339 UTC
	Command     string `json:"command"` // ADD, CHECK, DEL, STATUS, GC
	ContainerID string `json:"containerID"`
	NetNS       string `json:"netns"`
	IfName      string `json:"ifName"`
	Name        string `json:"name"` // the conflist's
	CNIVersion  string `json:"cniVersion"`
	// IPs are the prevResult's addresses (CIDR), PrevResult the
	// prevResult as the runtime passed it: whenever the call has one
	// (ADD and CHECK of a chained recorder; DEL from 0.4.0).
	IPs        []string        `json:"ips,omitempty"`
	PrevResult json.RawMessage `json:"prevResult,omitempty"`
	// ResultIPs are the addresses of the result a delegator's ADD
	// returns (its delegate conflist's).
	ResultIPs        []string             `json:"resultIPs,omitempty"`
	Delegate         string               `json:"delegate,omitempty"`         // a delegator's conflist
	ValidAttachments []types.GCAttachment `json:"validAttachments,omitempty"` // GC's
	Error            string               `json:"error,omitempty"`            // what the call answered, when it failed
}

func recordCall(command string, args *skel.CmdArgs) error {
	start := time.Now()
	conf, rawPrev, err := parseRecordConf(args.StdinData)
	if err != nil {
		return err // no log to write to
	}
	rec := record{Time: start.UTC().Format(time.RFC3339Nano), Command: command, ContainerID: args.ContainerID,
		NetNS: args.Netns, IfName: args.IfName, Name: conf.Name, CNIVersion: conf.CNIVersion,
		PrevResult: rawPrev, Delegate: conf.Delegate, ValidAttachments: conf.ValidAttachments}
	if conf.PrevResult != nil {
		if rec.IPs, err = resultIPs(conf.PrevResult); err != nil {
			return types.NewError(types.ErrDecodingFailure, "e2e-record: reading prevResult: "+err.Error(), "")
		}
	}
	var res types.Result
	if conf.Delegate != "" {
		res, err = delegate(command, conf, args)
	} else if command == "ADD" {
		res, err = conf.PrevResult, nil
		if res == nil {
			// 7, "invalid network config": the runtime puts prevResult into
			// the configuration, and only leaves it out for the first
			// plugin of a list; a recorder there is a conflist written
			// wrong (2, "unsupported field", is for a key present).
			err = types.NewError(types.ErrInvalidNetworkConfig,
				"e2e-record: ADD without prevResult: a recorder must follow the interface plugin in the conflist's plugins (or set \"delegate\")", "")
		}
	}
	if err != nil {
		rec.Error = err.Error()
	} else if res != nil && conf.Delegate != "" {
		rec.ResultIPs, _ = resultIPs(res)
	}
	if werr := appendRecord(conf.Log, rec); werr != nil {
		return types.NewError(types.ErrIOFailure, "e2e-record: writing the log (key \"log\"): "+werr.Error(), rec.Error)
	}
	if err != nil || res == nil {
		return err
	}
	return types.PrintResult(res, conf.CNIVersion)
}

func parseRecordConf(stdin []byte) (*recordConf, json.RawMessage, error) {
	var conf recordConf
	var raw struct {
		PrevResult json.RawMessage `json:"prevResult"`
	}
	if err := json.Unmarshal(stdin, &conf); err != nil {
		return nil, nil, types.NewError(types.ErrDecodingFailure, "e2e-record: parsing the configuration: "+err.Error(), "")
	}
	if err := json.Unmarshal(stdin, &raw); err != nil {
		return nil, nil, types.NewError(types.ErrDecodingFailure, "e2e-record: parsing the configuration: "+err.Error(), "")
	}
	if conf.Log == "" {
		return nil, nil, types.NewError(types.ErrInvalidNetworkConfig, "e2e-record: key \"log\" missing: the file to record the calls in", "")
	}
	if err := version.ParsePrevResult(&conf.PluginConf); err != nil {
		return nil, nil, types.NewError(types.ErrDecodingFailure, "e2e-record: parsing prevResult: "+err.Error(), "")
	}
	return &conf, raw.PrevResult, nil
}

// resultIPs are a result's addresses in CIDR form.
func resultIPs(r types.Result) ([]string, error) {
	cur, err := current.NewResultFromResult(r)
	if err != nil {
		return nil, err
	}
	ips := []string{}
	for _, ip := range cur.IPs {
		ips = append(ips, ip.Address.String())
	}
	return ips, nil
}

// appendRecord adds rec as one line at the end of the log. O_APPEND puts
// each write at the end, and the lock keeps a line whole against
// concurrent calls where the kernel may write it in parts (a short write
// of a large prevResult, which os.File.Write continues).
func appendRecord(path string, rec record) error {
	line, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("locking %s: %w", path, err)
	}
	if _, err := f.Write(append(line, '\n')); err != nil {
		return err
	}
	return f.Close()
}

// delegate runs the call through the conflist conf.Delegate, as a runtime
// runs a conflist, from this call's environment.
func delegate(command string, conf *recordConf, args *skel.CmdArgs) (types.Result, error) {
	list, err := libcni.ConfListFromFile(conf.Delegate)
	if err != nil {
		// A node whose delegate conflist is gone cannot attach a pod:
		// STATUS says "not available" (50), the kubelet's node NotReady.
		code := types.ErrInvalidNetworkConfig
		if command == "STATUS" {
			code = types.ErrPluginNotAvailable
		}
		return nil, types.NewError(code, fmt.Sprintf("e2e-record: reading the delegate conflist (key \"delegate\"): %v", err), "")
	}
	cni := libcni.NewCNIConfigWithCacheDir(filepath.SplitList(args.Path), conf.CacheDir, nil)
	rt := &libcni.RuntimeConf{ContainerID: args.ContainerID, NetNS: args.Netns, IfName: args.IfName,
		Args: cniArgs(args.Args), CapabilityArgs: conf.RuntimeConfig}
	ctx := context.Background()
	var res types.Result
	switch command {
	case "ADD":
		res, err = cni.AddNetworkList(ctx, list, rt)
	case "CHECK":
		err = cni.CheckNetworkList(ctx, list, rt)
	case "DEL":
		err = cni.DelNetworkList(ctx, list, rt)
	case "STATUS":
		err = cni.GetStatusNetworkList(ctx, list)
	case "GC":
		err = cni.GCNetworkList(ctx, list, &libcni.GCArgs{ValidAttachments: conf.ValidAttachments})
	}
	if err != nil {
		// The delegate's code is the call's: a STATUS of ebpf-cni's 50
		// stays 50 for the runtime.
		msg := fmt.Sprintf("e2e-record: delegate %s (%s): %v", conf.Delegate, list.Name, err)
		var te *types.Error
		switch {
		case errors.As(err, &te):
			return nil, types.NewError(te.Code, msg, "")
		case command == "STATUS": // libcni's own: a plugin not found...
			return nil, types.NewError(types.ErrPluginNotAvailable, msg, "")
		}
		return nil, errors.New(msg)
	}
	return res, nil
}

// cniArgs splits CNI_ARGS ("K1=V1;K2=V2") into the pairs libcni joins
// back.
func cniArgs(s string) [][2]string {
	var out [][2]string
	for kv := range strings.SplitSeq(s, ";") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			out = append(out, [2]string{k, v})
		}
	}
	return out
}
