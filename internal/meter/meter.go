// Package meter measures a stream the way its receiver sees it: make
// e2e's sink (test/e2e/e2ebox) and the datapath tests that repeat its
// bandwidth check count the same way.
package meter

import (
	"errors"
	"io"
	"time"
)

// PerSecond reads r to its end and returns the bits it carried in each
// full second, counted from the first byte: a rate limit must hold from
// the first second, not only on average. A last, partial second is left
// out. The error is the read's that ended the stream, nil for EOF.
func PerSecond(r io.Reader) ([]float64, error) { return perSecond(r, time.Now) }

func perSecond(r io.Reader, now func() time.Time) ([]float64, error) {
	var bytes []int64
	var start time.Time
	buf := make([]byte, 64<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if start.IsZero() {
				start = now()
			}
			i := int(now().Sub(start) / time.Second)
			for len(bytes) <= i {
				bytes = append(bytes, 0)
			}
			bytes[i] += int64(n)
		}
		if err == nil {
			continue
		}
		var bits []float64
		if !start.IsZero() {
			full := int(now().Sub(start) / time.Second)
			for i := 0; i < full && i < len(bytes); i++ {
				bits = append(bits, float64(bytes[i])*8)
			}
		}
		if errors.Is(err, io.EOF) {
			err = nil
		}
		return bits, err
	}
}
