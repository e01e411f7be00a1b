package meter

import (
	"errors"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// reads hands out one read of n bytes per step and moves the clock by
// step's offset before it: the stream as a receiver's clock sees it.
type reads struct {
	steps []step
	clock time.Time
	end   error
}

type step struct {
	at time.Duration // since the first read
	n  int
}

func (r *reads) now() time.Time { return r.clock }

func (r *reads) Read(p []byte) (int, error) {
	if len(r.steps) == 0 {
		return 0, r.end
	}
	s := r.steps[0]
	r.steps = r.steps[1:]
	r.clock = time.Unix(1000, 0).Add(s.at)
	return s.n, nil
}

func TestPerSecond(t *testing.T) {
	cases := []struct {
		name  string
		steps []step
		end   error
		want  []float64
		err   error
	}{
		{"nothing", nil, io.EOF, nil, nil},
		{"less than a second", []step{{0, 100}, {900 * time.Millisecond, 100}}, io.EOF, nil, nil},
		{"seconds from the first byte, the partial last one left out", []step{
			{0, 1000}, {500 * time.Millisecond, 1000}, {999 * time.Millisecond, 500},
			{time.Second, 2000}, {1900 * time.Millisecond, 1000},
			{3500 * time.Millisecond, 10}, {3600 * time.Millisecond, 7}}, io.EOF,
			[]float64{2500 * 8, 3000 * 8, 0}, nil},
		{"a read error ends it and is returned", []step{{0, 10}, {1200 * time.Millisecond, 10}}, io.ErrUnexpectedEOF,
			[]float64{80}, io.ErrUnexpectedEOF},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := &reads{steps: c.steps, end: c.end}
			got, err := perSecond(r, r.now)
			require.True(t, errors.Is(err, c.err), "error %v, want %v", err, c.err)
			require.Equal(t, c.want, got)
		})
	}
}
