package view

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// Table is an aligned text table: a header and rows of cells, columns two
// spaces apart, numeric columns right-aligned, no trailing blanks.
type Table struct {
	Header []string
	Right  map[int]bool // columns aligned right (numbers)
	rows   [][]string
}

// Row adds a row; missing cells are empty.
func (t *Table) Row(cells ...string) { t.rows = append(t.rows, cells) }

// Len is the number of rows.
func (t *Table) Len() int { return len(t.rows) }

// Write prints the table.
func (t *Table) Write(w io.Writer) error {
	widths := make([]int, len(t.Header))
	all := t.rows
	if t.Header != nil {
		all = append([][]string{t.Header}, t.rows...)
	}
	for _, r := range all {
		for i, c := range r {
			if i >= len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], utf8.RuneCountInString(c))
		}
	}
	var b strings.Builder
	for _, r := range all {
		var line strings.Builder
		for i := range widths {
			c := ""
			if i < len(r) {
				c = r[i]
			}
			pad := strings.Repeat(" ", widths[i]-utf8.RuneCountInString(c))
			if i > 0 {
				line.WriteString("  ")
			}
			if t.Right[i] {
				line.WriteString(pad + c)
			} else {
				line.WriteString(c + pad)
			}
		}
		b.WriteString(strings.TrimRight(line.String(), " "))
		b.WriteByte('\n')
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteJSON prints v indented. Output is stable: structs keep their field
// order, maps are sorted by key, and every list is sorted by the commands.
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// WriteJSONLine prints v on one line: for streams of objects (monitor).
func WriteJSONLine(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// Scaled formats n in units of base with one decimal below 10 ("1.2k",
// "12k", "340"); units[0] is the unit of n itself.
func Scaled(n uint64, base float64, units []string, sep string) string {
	v := float64(n)
	i := 0
	for v >= base && i < len(units)-1 {
		v /= base
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%d%s%s", n, sep, units[0])
	}
	s := fmt.Sprintf("%.1f", v)
	if v >= 9.95 {
		s = fmt.Sprintf("%.0f", v)
	}
	// Rounding up can reach the next unit: 999_999 is 1.0M, not 1000k.
	if s == fmt.Sprintf("%.0f", base) && i < len(units)-1 {
		return "1.0" + sep + units[i+1]
	}
	return s + sep + units[i]
}

// HumanCount is a count for a table: 999, 1.2k, 34k, 5.6M, 7.8G.
func HumanCount(n uint64) string {
	return Scaled(n, 1000, []string{"", "k", "M", "G", "T", "P", "E"}, "")
}

// HumanBytes is a byte count for a table: 512 B, 1.5 KiB, 3.4 MiB.
func HumanBytes(n uint64) string {
	return Scaled(n, 1024, []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}, " ")
}

// HumanAge is a duration for a table, in its two largest units: 45s,
// 3m12s, 2h05m, 3d04h.
func HumanAge(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	s := int64(d / time.Second)
	switch {
	case s < 60:
		return fmt.Sprintf("%ds", s)
	case s < 3600:
		return fmt.Sprintf("%dm%02ds", s/60, s%60)
	case s < 86400:
		return fmt.Sprintf("%dh%02dm", s/3600, s%3600/60)
	}
	return fmt.Sprintf("%dd%02dh", s/86400, s%86400/3600)
}

// OrDash shows an empty cell as "-".
func OrDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// ProtoNames name the IP protocols the flow tables hold.
var ProtoNames = map[uint8]string{unix.IPPROTO_TCP: "tcp", unix.IPPROTO_UDP: "udp", unix.IPPROTO_ICMP: "icmp", unix.IPPROTO_ICMPV6: "icmpv6"}

// ProtoName is the name of an IP protocol the flow tables hold, or its
// number.
func ProtoName(p uint8) string {
	if n := ProtoNames[p]; n != "" {
		return n
	}
	return strconv.Itoa(int(p))
}

// AddrPort is ip:port as people and scripts read it ([ip]:port for IPv6).
func AddrPort(ip net.IP, port uint16) string {
	return net.JoinHostPort(ip.String(), strconv.Itoa(int(port)))
}

// FlowLess orders flows by pod, protocol, remote and the pod's port (the
// nat and flows commands list theirs so).
func FlowLess(podA, podB net.IP, protoA, protoB string, remoteA, remoteB net.IP, portA, portB uint16) bool {
	if c := bytes.Compare(podA.To16(), podB.To16()); c != 0 {
		return c < 0
	}
	if protoA != protoB {
		return protoA < protoB
	}
	if c := bytes.Compare(remoteA.To16(), remoteB.To16()); c != 0 {
		return c < 0
	}
	return portA < portB
}
