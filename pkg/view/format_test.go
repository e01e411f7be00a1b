package view

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestHumanCount(t *testing.T) {
	for _, tc := range []struct {
		n    uint64
		want string
	}{
		{0, "0"}, {999, "999"}, {1000, "1.0k"}, {1234, "1.2k"}, {9949, "9.9k"}, {9950, "10k"}, {12345, "12k"},
		{999_499, "999k"}, {999_999, "1.0M"}, {3_400_000, "3.4M"}, {7_800_000_000, "7.8G"}, {1<<64 - 1, "18E"},
	} {
		require.Equal(t, tc.want, HumanCount(tc.n), "%d", tc.n)
	}
}

func TestHumanBytes(t *testing.T) {
	for _, tc := range []struct {
		n    uint64
		want string
	}{
		{0, "0 B"}, {512, "512 B"}, {1023, "1023 B"}, {1024, "1.0 KiB"}, {1536, "1.5 KiB"},
		{3_565_158, "3.4 MiB"}, {1<<20 - 1, "1.0 MiB"}, {12 << 30, "12 GiB"},
	} {
		require.Equal(t, tc.want, HumanBytes(tc.n), "%d", tc.n)
	}
}

func TestHumanAge(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{-time.Second, "0s"}, {45 * time.Second, "45s"}, {192 * time.Second, "3m12s"},
		{2*time.Hour + 5*time.Minute, "2h05m"}, {76 * time.Hour, "3d04h"},
	} {
		require.Equal(t, tc.want, HumanAge(tc.d), "%s", tc.d)
	}
}

// TestTableAlignment: every column starts at the same offset on every line,
// right-aligned columns end at the same offset, and no line has trailing
// blanks (also with multi-byte characters).
func TestTableAlignment(t *testing.T) {
	tb := &Table{Header: []string{"NAME", "COUNT", "NOTE"}, Right: map[int]bool{1: true}}
	tb.Row("a", "1", "short")
	tb.Row("longer-name", "12.3k", "")
	tb.Row("µs", "999", "last")
	var b bytes.Buffer
	require.NoError(t, tb.Write(&b))
	want := "" +
		"NAME         COUNT  NOTE\n" +
		"a                1  short\n" +
		"longer-name  12.3k\n" +
		"µs             999  last\n"
	require.Equal(t, want, b.String())
	for _, l := range strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n") {
		require.Equal(t, strings.TrimRight(l, " "), l)
	}
}
