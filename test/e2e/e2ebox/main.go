// Command e2ebox is the one static binary behind make e2e's test images and
// clients (test/e2e/run.sh): no registry is reachable there, and Debian's
// busybox-static wget segfaults. internal/ociimage writes the images.
//
//	e2ebox pause                        the pod sandbox's process: waits for SIGTERM
//	e2ebox serve [-tcp :8080] [-udp :8081]  answers every TCP connection and UDP datagram with the hostname and the sender's address
//	e2ebox get [-udp] [-timeout 2s] HOST:PORT  prints the answer of a serve
//	e2ebox udpwait [-timeout 60s] HOST:PORT   one UDP socket sending every 100 ms until
//	    the first answer; prints the answer's time (Unix seconds) and the count sent
//	e2ebox sink [-tcp :9000]    receives TCP streams; when one ends, answers with
//	    the Mbit/s it received in each full second
//	e2ebox blast [-duration 5s] HOST:PORT   sends to a sink as fast as it can, prints its answer
//	CNI_COMMAND=... e2ebox       no arguments: the CNI plugin e2e-record, which logs
//	    every call, chained after ebpf-cni or delegating to its conflist (cniplugin.go)
package main

import (
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/ebpf-cni/ebpf-cni/internal/meter"
)

func main() {
	if len(os.Args) < 2 {
		// A runtime execs a plugin so; a person gets the usage.
		if os.Getenv("CNI_COMMAND") != "" {
			cniPlugin()
			return
		}
		fmt.Fprintln(os.Stderr, "usage: e2ebox pause|serve|get|udpwait|sink|blast ...\n"+
			"   or: CNI_COMMAND=... e2ebox (no arguments): the CNI plugin e2e-record (a copy named e2e-record in CNI_PATH)")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "pause":
		c := make(chan os.Signal, 1)
		signal.Notify(c, syscall.SIGTERM, syscall.SIGINT)
		<-c
	case "serve":
		err = serve(os.Args[2:])
	case "get":
		err = get(os.Args[2:])
	case "udpwait":
		err = udpwait(os.Args[2:])
	case "sink":
		err = sink(os.Args[2:])
	case "blast":
		err = blast(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2ebox:", err)
		os.Exit(1)
	}
}

func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	tcpAddr := fs.String("tcp", ":8080", "TCP listen address")
	udpAddr := fs.String("udp", ":8081", "UDP listen address")
	fs.Parse(args)
	name, err := os.Hostname()
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *tcpAddr)
	if err != nil {
		return err
	}
	pc, err := net.ListenPacket("udp", *udpAddr)
	if err != nil {
		return err
	}
	go func() {
		buf := make([]byte, 2048)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				continue
			}
			pc.WriteTo([]byte(answer(name, from)), from)
		}
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			c.Write([]byte(answer(name, c.RemoteAddr())))
			c.Close()
		}()
	}
}

// answer is what serve sends: its name and the address the request came
// from, so a check sees whether the client's address survived the path
// (pods of another node: no masquerade) or what replaced it.
func answer(name string, from net.Addr) string {
	host, _, err := net.SplitHostPort(from.String())
	if err != nil {
		host = from.String()
	}
	return name + " " + host + "\n"
}

func get(args []string) error {
	fs := flag.NewFlagSet("get", flag.ExitOnError)
	udp := fs.Bool("udp", false, "UDP instead of TCP")
	timeout := fs.Duration("timeout", 2*time.Second, "limit")
	fs.Parse(args)
	if fs.NArg() != 1 {
		return fmt.Errorf("get: one HOST:PORT")
	}
	network := "tcp"
	if *udp {
		network = "udp"
	}
	c, err := net.DialTimeout(network, fs.Arg(0), *timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(*timeout))
	if *udp {
		if _, err := c.Write([]byte("hello\n")); err != nil {
			return err
		}
	}
	buf := make([]byte, 2048)
	n, err := c.Read(buf)
	if err != nil {
		return err
	}
	fmt.Print(string(buf[:n]))
	return nil
}

// udpwait is a UDP client started before its Service can answer: one
// socket, so one flow, as a DNS forwarder or a statsd client keeps.
func udpwait(args []string) error {
	fs := flag.NewFlagSet("udpwait", flag.ExitOnError)
	timeout := fs.Duration("timeout", 60*time.Second, "limit")
	fs.Parse(args)
	if fs.NArg() != 1 {
		return fmt.Errorf("udpwait: one HOST:PORT")
	}
	c, err := net.Dial("udp", fs.Arg(0))
	if err != nil {
		return err
	}
	defer c.Close()
	limit := time.Now().Add(*timeout)
	buf := make([]byte, 2048)
	for sent := 1; time.Now().Before(limit); sent++ {
		if _, err := c.Write([]byte("hello\n")); err != nil {
			// ICMP unreachable while the Service has no endpoint.
			time.Sleep(100 * time.Millisecond)
			continue
		}
		c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		n, err := c.Read(buf)
		if err != nil {
			continue
		}
		fmt.Printf("answered %.3f sent %d from %s", float64(time.Now().UnixMilli())/1000, sent, buf[:n])
		// Keep the flow open: the pod stays Running, its log says when.
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
		<-sig
		return nil
	}
	return fmt.Errorf("udpwait: no answer within %s", *timeout)
}

// sink measures rate limits at the receiver, per second from the first
// byte: a limit must hold from the first second, not only on average.
func sink(args []string) error {
	fs := flag.NewFlagSet("sink", flag.ExitOnError)
	addr := fs.String("tcp", ":9000", "TCP listen address")
	fs.Parse(args)
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			bits, _ := meter.PerSecond(c) // a broken stream: what it carried
			var out []string
			for _, b := range bits {
				out = append(out, fmt.Sprintf("%.1f", b/1e6))
			}
			fmt.Fprintln(c, strings.Join(out, " "))
		}()
	}
}

func blast(args []string) error {
	fs := flag.NewFlagSet("blast", flag.ExitOnError)
	duration := fs.Duration("duration", 5*time.Second, "how long to send")
	fs.Parse(args)
	if fs.NArg() != 1 {
		return fmt.Errorf("blast: one HOST:PORT")
	}
	c, err := net.DialTimeout("tcp", fs.Arg(0), 2*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	buf := make([]byte, 64<<10)
	end := time.Now().Add(*duration)
	for time.Now().Before(end) {
		c.SetWriteDeadline(end)
		if _, err := c.Write(buf); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				break
			}
			return err
		}
	}
	c.SetWriteDeadline(time.Time{})
	c.(*net.TCPConn).CloseWrite()
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	answer, err := io.ReadAll(c)
	if err != nil {
		return err
	}
	fmt.Print(string(answer))
	return nil
}
