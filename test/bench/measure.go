package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// Ports the servers listen on, in pods and in the world.
const (
	echoPort  = 7000
	iperfPort = 5201
)

// cpuTicks is the busy time of one CPU from /proc/stat, in USER_HZ ticks.
func cpuTicks(cpu int) (float64, error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	name := fmt.Sprintf("cpu%d", cpu)
	var fields []string
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) > 0 && f[0] == name {
			fields = f // cpuN user nice system idle iowait irq softirq steal ...
			break
		}
	}
	if len(fields) < 9 {
		return 0, fmt.Errorf("no %s line in /proc/stat", name)
	}
	busy := 0.0
	for i, f := range fields[1:9] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		v, err := strconv.ParseFloat(f, 64)
		if err != nil {
			return 0, err
		}
		busy += v
	}
	return busy, nil
}

const userHZ = 100 // /proc/stat's unit; 100 on every Linux architecture Go builds for here

// loadResult is a client run and the CPU it cost the machine per operation.
type loadResult struct {
	toolResult
	cpuUsPerOp float64
}

// load runs the project's RR or CRR client (mode "rr" or "crr") inside
// client against addr for d, pinned to clientCPU. Client, echo server and
// the packets' softirq work all run on that CPU, so its busy time is the
// cost of the transactions (plus whatever else the machine ran there).
func (b *bench) load(mode string, client ns.NetNS, addr string, d time.Duration) (loadResult, error) {
	c0, err := cpuTicks(clientCPU)
	if err != nil {
		return loadResult{}, err
	}
	out, err := b.runCmd(client, clientCPU, d+30*time.Second, []string{fmt.Sprintf("%s=%s %s %s", toolEnv, mode, addr, d)}, b.exe)
	if err != nil {
		return loadResult{}, err
	}
	c1, err := cpuTicks(clientCPU)
	if err != nil {
		return loadResult{}, err
	}
	var r loadResult
	if err := json.Unmarshal(out, &r.toolResult); err != nil {
		return r, fmt.Errorf("decoding %s client output %q: %w", mode, out, err)
	}
	if r.Count == 0 {
		return r, fmt.Errorf("%s client to %s made no transaction", mode, addr)
	}
	// The warm-up before the clock adds a few ticks at most; the run's
	// setup (fork, exec) is part of what every setup pays alike.
	r.cpuUsPerOp = (c1 - c0) / userHZ * 1e6 / float64(r.Count)
	return r, nil
}

// iperfResult is what the bench reads from iperf3 -J --get-server-output.
type iperfResult struct {
	Error string `json:"error"`
	End   struct {
		SumReceived struct {
			BitsPerSecond float64 `json:"bits_per_second"`
		} `json:"sum_received"`
	} `json:"end"`
	Intervals []iperfInterval `json:"intervals"` // the client's
	Server    struct {
		Intervals []iperfInterval `json:"intervals"`
	} `json:"server_output_json"`
}

type iperfInterval struct {
	Sum struct {
		Seconds       float64 `json:"seconds"`
		BitsPerSecond float64 `json:"bits_per_second"`
	} `json:"sum"`
}

// iperf runs an iperf3 client inside client to ip for secs seconds with
// streams parallel streams, pinned to clientCPU.
func (b *bench) iperf(client ns.NetNS, ip net.IP, streams, secs int, extra ...string) (iperfResult, error) {
	var r iperfResult
	args := append([]string{"-c", ip.String(), "-p", fmt.Sprint(iperfPort), "-t", fmt.Sprint(secs), "-P", fmt.Sprint(streams),
		"-A", fmt.Sprint(clientCPU), "-J", "--get-server-output"}, extra...)
	out, err := b.runCmd(client, -1, time.Duration(secs)*time.Second+30*time.Second, nil, "iperf3", args...)
	if jerr := json.Unmarshal(out, &r); jerr != nil && err == nil {
		return r, fmt.Errorf("decoding iperf3 output: %w", jerr)
	}
	if err != nil {
		return r, fmt.Errorf("iperf3 to %s: %w (%s)", ip, err, r.Error)
	}
	if r.Error != "" {
		return r, fmt.Errorf("iperf3 to %s: %s", ip, r.Error)
	}
	return r, nil
}

func secsOf(d time.Duration) int {
	s := int(d.Round(time.Second) / time.Second)
	return max(s, 1)
}

func addr(ip net.IP, port int) string { return net.JoinHostPort(ip.String(), fmt.Sprint(port)) }

// durMs is a duration in milliseconds.
func durMs(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

// holdForProfiling prints, for each setup of a path, the commands that drive
// the load the bench would measure (to run under perf or bpftool prog
// profile), and waits for ^C, which removes everything as after a run.
func (b *bench) holdForProfiling(path string, cs []clientServer) {
	b.logf("%s: set up; holding for profiling (^C removes everything)", path)
	for _, c := range cs {
		b.logf("  %s: nsenter --net=%s taskset -c %d env %s='rr %s 10s' %s", c.setup, c.client.Path(), clientCPU, toolEnv, addr(c.target, c.echoPort), b.exe)
		b.logf("  %s: nsenter --net=%s taskset -c %d iperf3 -c %s -t 10", c.setup, c.client.Path(), clientCPU, c.target)
	}
	select {}
}
