package bench

import (
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
)

func TestHistogram_Quantiles(t *testing.T) {
	for name, tc := range map[string]struct {
		values []time.Duration
	}{
		"one value":   {values: []time.Duration{3 * time.Millisecond}},
		"small exact": {values: []time.Duration{0, 1, 2, 3, 63}},
		"uniform": {values: func() []time.Duration {
			var v []time.Duration
			for i := range 10000 {
				v = append(v, time.Duration(i+1)*time.Microsecond)
			}
			return v
		}()},
		"skewed": {values: func() []time.Duration {
			r := rand.New(rand.NewPCG(1, 2))
			var v []time.Duration
			for range 5000 {
				v = append(v, time.Duration(r.ExpFloat64()*float64(2*time.Millisecond)))
			}
			return append(v, 2*time.Second)
		}()},
	} {
		t.Run(name, func(t *testing.T) {
			h := NewHistogram()
			for _, v := range tc.values {
				h.Record(v)
			}
			sorted := slices.Clone(tc.values)
			slices.Sort(sorted)
			if got := h.Count(); got != uint64(len(sorted)) {
				t.Fatalf("Count = %d, want %d", got, len(sorted))
			}
			if h.Min() != sorted[0] || h.Max() != sorted[len(sorted)-1] {
				t.Fatalf("Min, Max = %v, %v; want %v, %v", h.Min(), h.Max(), sorted[0], sorted[len(sorted)-1])
			}
			for _, q := range []float64{0, 0.5, 0.9, 0.99, 1} {
				rank := max(1, int(float64(len(sorted))*q+0.999999))
				want := sorted[rank-1]
				got := h.Quantile(q)
				if diff := (got - want).Abs(); float64(diff) > float64(want)/50+1 {
					t.Errorf("Quantile(%v) = %v, want %v within 2%%", q, got, want)
				}
			}
		})
	}
}

func TestHistogram_Empty(t *testing.T) {
	h := NewHistogram()
	if h.Quantile(0.99) != 0 || h.Mean() != 0 || h.Min() != 0 || h.Max() != 0 {
		t.Fatalf("empty histogram: q99 %v mean %v min %v max %v, want zeros", h.Quantile(0.99), h.Mean(), h.Min(), h.Max())
	}
	h.Record(-time.Second)
	if h.Count() != 1 || h.Max() != 0 {
		t.Fatalf("negative record: count %d max %v, want 1 and 0", h.Count(), h.Max())
	}
}

func TestHistogram_Concurrent(t *testing.T) {
	h := NewHistogram()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 1000 {
				h.Record(time.Duration(g*1000+i) * time.Microsecond)
			}
		})
	}
	wg.Wait()
	if h.Count() != 8000 || h.Max() != 7999*time.Microsecond || h.Min() != 0 {
		t.Fatalf("count %d min %v max %v", h.Count(), h.Min(), h.Max())
	}
	if m := h.Quantile(0.5); m < 3900*time.Microsecond || m > 4100*time.Microsecond {
		t.Fatalf("median %v, want about 4ms", m)
	}
}

func TestHistIndex_Monotonic(t *testing.T) {
	prev := -1
	for _, v := range []uint64{0, 1, 63, 64, 65, 127, 128, 129, 1000, 1 << 20, 1<<20 + 1, 1 << 40, 1<<63 - 1} {
		i := histIndex(v)
		if i < prev || i >= histBuckets {
			t.Fatalf("histIndex(%d) = %d after %d (buckets %d)", v, i, prev, histBuckets)
		}
		lo := histValue(i)
		if v >= 64 && (lo > v+v/64 || lo+lo/64 < v) {
			t.Fatalf("histValue(histIndex(%d)) = %d, more than 1/64 away", v, lo)
		}
		prev = i
	}
}
