package nettest

import (
	"encoding/json"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// IperfResult is what an iperf3 TCP run achieved, as its receiver saw it.
type IperfResult struct {
	BitsPerSecond float64   // over the whole run
	PerSecond     []float64 // each second, the first included
	Retransmits   int
}

// Iperf runs an iperf3 server in `to` (one test, then it exits) and a TCP
// client in `from` sending to ip for secs seconds.
func Iperf(from, to ns.NetNS, ip net.IP, port, secs int, extra ...string) (*IperfResult, error) {
	var srv *exec.Cmd
	if err := to.Do(func(ns.NetNS) error {
		srv = exec.Command("iperf3", "-s", "-1", "-J", "-B", ip.String(), "-p", fmt.Sprint(port))
		return srv.Start()
	}); err != nil {
		return nil, fmt.Errorf("starting iperf3 server: %w", err)
	}
	defer func() {
		_ = srv.Process.Kill()
		_ = srv.Wait()
	}()
	for i := 0; ; i++ {
		out, _ := Run(to, "ss", "-Hltn", fmt.Sprintf("sport = :%d", port))
		if strings.TrimSpace(out) != "" {
			break
		}
		if i == 100 {
			return nil, fmt.Errorf("iperf3 server not listening on %d after 5 s", port)
		}
		time.Sleep(50 * time.Millisecond)
	}
	args := append([]string{"-c", ip.String(), "-p", fmt.Sprint(port), "-t", fmt.Sprint(secs), "-J", "--get-server-output"}, extra...)
	out, err := Run(from, "iperf3", args...)
	var r struct {
		Error string `json:"error"`
		End   struct {
			SumSent struct {
				Retransmits int `json:"retransmits"`
			} `json:"sum_sent"`
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
		Server struct {
			Intervals []struct {
				Sum struct {
					BitsPerSecond float64 `json:"bits_per_second"`
					Seconds       float64 `json:"seconds"`
				} `json:"sum"`
			} `json:"intervals"`
		} `json:"server_output_json"`
	}
	if jerr := json.Unmarshal([]byte(out), &r); jerr != nil {
		if err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("decoding iperf3 output: %w", jerr)
	}
	if r.Error != "" {
		return nil, fmt.Errorf("iperf3 to %s: %s", ip, r.Error)
	}
	if err != nil {
		return nil, err
	}
	res := &IperfResult{BitsPerSecond: r.End.SumReceived.BitsPerSecond, Retransmits: r.End.SumSent.Retransmits}
	for _, iv := range r.Server.Intervals {
		if iv.Sum.Seconds >= 0.5 { // a trailing sliver says little
			res.PerSecond = append(res.PerSecond, iv.Sum.BitsPerSecond)
		}
	}
	return res, nil
}
