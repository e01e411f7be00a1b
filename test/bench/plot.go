package main

// PNG plots drawn with the standard library and a bitmap font: a line chart
// on a log-N axis for the scale sweeps, and a bar chart of how many times
// better EBPF is than REF on every row.

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

var (
	white     = color.RGBA{255, 255, 255, 255}
	black     = color.RGBA{30, 30, 30, 255}
	grid      = color.RGBA{225, 225, 225, 255}
	setupCols = map[string]color.RGBA{REF: {214, 96, 77, 255}, EBPF: {33, 102, 172, 255}, RAW: {120, 120, 120, 255}}
	setupName = map[string]string{REF: "REF", EBPF: "EBPF", RAW: "RAW"}
	winCol    = color.RGBA{77, 146, 33, 255}
	loseCol   = color.RGBA{197, 27, 125, 255}
)

type canvas struct{ *image.RGBA }

func newCanvas(w, h int) canvas {
	c := canvas{image.NewRGBA(image.Rect(0, 0, w, h))}
	draw.Draw(c, c.Bounds(), &image.Uniform{white}, image.Point{}, draw.Src)
	return c
}

// text draws s with its baseline at y; align -1 left, 0 centre, 1 right of x.
func (c canvas) text(x, y int, s string, col color.Color, align int) {
	d := &font.Drawer{Dst: c, Src: image.NewUniform(col), Face: basicfont.Face7x13}
	w := d.MeasureString(s).Round()
	x -= (align + 1) * w / 2
	d.Dot = fixed.P(x, y)
	d.DrawString(s)
}

func (c canvas) rect(x0, y0, x1, y1 int, col color.Color) {
	draw.Draw(c, image.Rect(x0, y0, x1, y1), &image.Uniform{col}, image.Point{}, draw.Src)
}

// line draws a segment of the given width; dash > 0 leaves gaps of that length.
func (c canvas) line(x0, y0, x1, y1 float64, width int, dash float64, col color.Color) {
	n := math.Max(math.Abs(x1-x0), math.Abs(y1-y0))
	for i := 0.0; i <= n; i++ {
		if dash > 0 && math.Mod(i, 2*dash) >= dash {
			continue
		}
		x := int(math.Round(x0 + (x1-x0)*i/math.Max(n, 1)))
		y := int(math.Round(y0 + (y1-y0)*i/math.Max(n, 1)))
		c.rect(x-width/2, y-width/2, x-width/2+width, y-width/2+width, col)
	}
}

// series is one setup's points of a sweep.
type series struct {
	setup string
	x, y  []float64
}

// sweepPlot draws y against x on a log x axis, y from zero.
// note, if set, is written under the legend (e.g. why a setup is missing).
func sweepPlot(path, title, ylabel, note string, ss []series) error {
	const w, h, left, right, top, bottom = 720, 420, 80, 130, 40, 60
	c := newCanvas(w, h)
	var xs, ys []float64
	for _, s := range ss {
		xs, ys = append(xs, s.x...), append(ys, s.y...)
	}
	if len(xs) == 0 {
		return fmt.Errorf("nothing to plot in %s", path)
	}
	lx0, lx1 := math.Floor(math.Log10(slices.Min(xs))), math.Ceil(math.Log10(slices.Max(xs)))
	if lx1 == lx0 {
		lx1++
	}
	ymax := niceCeil(slices.Max(ys) * 1.1)
	px := func(x float64) float64 { return left + (math.Log10(x)-lx0)/(lx1-lx0)*(w-left-right) }
	py := func(y float64) float64 { return h - bottom - y/ymax*(h-top-bottom) }
	for e := lx0; e <= lx1; e++ {
		x := px(math.Pow(10, e))
		c.line(x, top, x, h-bottom, 1, 0, grid)
		c.text(int(x), h-bottom+16, fmtInt(math.Pow(10, e)), black, 0)
		for k := 2.0; k < 10 && e < lx1; k++ {
			c.line(px(k*math.Pow(10, e)), h-bottom, px(k*math.Pow(10, e)), h-bottom+4, 1, 0, black)
		}
	}
	for i := 0; i <= 5; i++ {
		y := ymax * float64(i) / 5
		c.line(left, py(y), w-right, py(y), 1, 0, grid)
		c.text(left-6, int(py(y))+4, fmtTick(y), black, 1)
	}
	c.line(left, top, left, h-bottom, 1, 0, black)
	c.line(left, h-bottom, w-right, h-bottom, 1, 0, black)
	c.text((left+w-right)/2, 22, title, black, 0)
	c.text((left+w-right)/2, h-bottom+38, "mappings installed (log scale)", black, 0)
	c.text(8, top-12, ylabel, black, -1)
	for i, s := range ss {
		col := setupCols[s.setup]
		dash := 0.0
		if s.setup == RAW {
			dash = 6
		}
		for j := range s.x {
			x, y := px(s.x[j]), py(s.y[j])
			c.rect(int(x)-4, int(y)-4, int(x)+4, int(y)+4, col)
			if j > 0 {
				c.line(px(s.x[j-1]), py(s.y[j-1]), x, y, 3, dash, col)
			}
		}
		ly := top + 20 + i*20
		c.line(w-right+12, float64(ly-4), w-right+40, float64(ly-4), 3, dash, col)
		c.text(w-right+46, ly, setupName[s.setup], black, -1)
	}
	for i, l := range strings.Split(note, "\n") {
		c.text(w-right+8, top+30+len(ss)*20+i*16, l, setupCols[EBPF], -1)
	}
	return savePNG(path, c)
}

// advantagePlot draws, for every row with REF and EBPF figures, how many
// times better EBPF is than REF (and RAW, the limit), on a log axis: the
// pooled ratios where the rounds gave them, else the medians'.
func advantagePlot(path string, rows []Row) (bool, error) {
	type bar struct {
		label    string
		adv, raw float64
	}
	var bars []bar
	for _, r := range rows {
		a := advantage(r)
		if a == nil || *a <= 0 || strings.HasPrefix(r.Metric, "bpf_") {
			continue
		}
		b := bar{label: r.Path + "  " + r.Metric, adv: *a}
		// RAW against REF is EBPF's advantage over REF less its
		// advantage over RAW: both pooled where the rounds gave them.
		if ar := advantageOf(r, ebpfRaw, r.Raw); ar != nil && *ar > 0 {
			b.raw = *a / *ar
		}
		bars = append(bars, b)
	}
	if len(bars) == 0 {
		return false, nil
	}
	// The bitmap font is 7 px a character: the labels set the left margin.
	left := 0
	for _, b := range bars {
		left = max(left, 7*len(b.label)+16)
	}
	const right, top, rowH = 40, 56, 18
	w := left + 530
	h := top + rowH*len(bars) + 50
	c := newCanvas(w, h)
	lo, hi := 0.25, 4.0
	for _, b := range bars {
		lo, hi = math.Min(lo, b.adv/1.2), math.Max(hi, b.adv*1.2)
		if b.raw > 0 {
			lo, hi = math.Min(lo, b.raw/1.2), math.Max(hi, b.raw*1.2)
		}
	}
	lo, hi = math.Pow(2, math.Floor(math.Log2(lo))), math.Pow(2, math.Ceil(math.Log2(hi)))
	px := func(v float64) float64 {
		return float64(left) + (math.Log2(v)-math.Log2(lo))/(math.Log2(hi)-math.Log2(lo))*float64(w-left-right)
	}
	for v := lo; v <= hi*1.001; v *= 2 {
		col := grid
		if v == 1 {
			col = black
		}
		c.line(px(v), top-6, px(v), float64(h-44), 1, 0, col)
		c.text(int(px(v)), h-28, strconv.FormatFloat(v, 'g', 3, 64)+"x", black, 0)
	}
	c.text(w/2, 18, "EBPF vs REF: times better (right of 1x: EBPF wins)", black, 0)
	c.text(w/2, 36, "bar: EBPF, grey tick: RAW (the limit)", black, 0)
	for i, b := range bars {
		y := top + i*rowH
		c.text(left-8, y+12, b.label, black, 1)
		col := winCol
		if b.adv < 1 {
			col = loseCol
		}
		x0, x1 := px(1), px(b.adv)
		if x1 < x0 {
			x0, x1 = x1, x0
		}
		c.rect(int(x0), y+3, int(x1)+1, y+rowH-3, col)
		if b.raw > 0 {
			c.rect(int(px(b.raw))-1, y+1, int(px(b.raw))+2, y+rowH-1, setupCols[RAW])
		}
	}
	return true, savePNG(path, c)
}

func savePNG(path string, c canvas) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, c); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

// fmtTick prints an axis value without a needless fraction.
func fmtTick(v float64) string {
	if v == math.Trunc(v) {
		return fmtInt(v)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

func fmtInt(v float64) string {
	s := strconv.FormatFloat(v, 'f', 0, 64)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// sweeps are the scale sweeps plotted: path prefix, metric, title, label.
var sweeps = []struct{ prefix, metric, title, ylabel string }{
	{"hostport-", "crr_cps", "hostPort: new connections per second", "conn/s"},
	{"hostport-", "rr_p99_us", "hostPort: request/response p99", "us"}, // the bitmap font has no µ
	{"hostport-", "rr_tps", "hostPort: request/response per second", "tx/s"},
	{"hostport-", "add_p50_ms", "ADD of a pod with one more mapping (p50)", "ms"},
}

// headline are the rows of summary.png, the plot README.md shows: one or
// a few per path, what a person running pods feels.
var headline = [][2]string{
	{"cni", "add_p50_ms"}, {"cni", "del_p50_ms"}, {"cni", "pods_per_s_c8"}, {"cni", "add_cold_ms"},
	{"pod-to-pod", "rr_tps"}, {"pod-to-pod", "tcp_gbps"}, {"pod-to-pod", "crr_cps"},
	{"masquerade", "rr_tps"}, {"masquerade", "tcp_gbps"}, {"masquerade", "crr_cps"},
	{"hostport-10", "crr_cps"}, {"hostport-10000", "crr_cps"}, {"hostport-10000", "add_p50_ms"},
	{"bandwidth", "first_s_err_100mbit_pct"}, {"bandwidth", "sat_rtt_100mbit_ms"}, {"bandwidth", "in_first_s_err_100mbit_pct"},
}

// writePlots draws every plot the rows allow and returns the file names.
func writePlots(dir string, rows []Row) ([]string, error) {
	var out []string
	if ok, err := advantagePlot(filepath.Join(dir, "ratios.png"), rows); err != nil {
		return nil, err
	} else if ok {
		out = append(out, "ratios.png")
	}
	var head []Row
	for _, pm := range headline {
		if i := slices.IndexFunc(rows, func(r Row) bool { return r.Path == pm[0] && r.Metric == pm[1] }); i >= 0 {
			head = append(head, rows[i])
		}
	}
	if ok, err := advantagePlot(filepath.Join(dir, "summary.png"), head); err != nil {
		return nil, err
	} else if ok {
		out = append(out, "summary.png")
	}
	for _, sw := range sweeps {
		var ss []series
		note := ""
		for _, s := range setups {
			se := series{setup: s}
			for _, r := range rows {
				n, err := strconv.Atoi(strings.TrimPrefix(r.Path, sw.prefix))
				if !strings.HasPrefix(r.Path, sw.prefix) || err != nil || r.Metric != sw.metric {
					continue
				}
				if v := r.value(s); v != nil {
					se.x, se.y = append(se.x, float64(n)), append(se.y, *v)
				} else if s == EBPF && r.Null[EBPF] == notImplemented {
					note = "EBPF: not\nimplemented\nin ebpf-cni\nyet"
				}
			}
			if len(se.x) > 0 {
				ss = append(ss, se)
			}
		}
		if len(ss) == 0 {
			continue
		}
		name := strings.TrimSuffix(sw.prefix, "-") + "_" + sw.metric + ".png"
		if err := sweepPlot(filepath.Join(dir, name), sw.title, sw.ylabel, note, ss); err != nil {
			return nil, err
		}
		out = append(out, name)
	}
	return out, nil
}
