package bench

import (
	"math"
	"math/bits"
	"sync/atomic"
	"time"
)

// histSubBits sets the precision of a Histogram: each power of two is split
// into 2^histSubBits buckets, so a recorded value is known to within 1/64
// (about 1.6%).
const histSubBits = 6

const (
	histSub     = 1 << histSubBits
	histBuckets = histSub + (64-histSubBits-1)*histSub + histSub
)

// Histogram counts durations in log-linear buckets. Record is lock-free and
// allocation-free, so thousands of watcher goroutines can share one; reading
// quantiles while records continue gives an approximate answer.
type Histogram struct {
	counts [histBuckets]atomic.Uint64
	n      atomic.Uint64
	sum    atomic.Int64
	min    atomic.Int64 // 0 until the first record; stored as value+1
	max    atomic.Int64
}

// NewHistogram returns an empty histogram.
func NewHistogram() *Histogram { return &Histogram{} }

func histIndex(v uint64) int {
	if v < histSub {
		return int(v)
	}
	e := bits.Len64(v) - histSubBits - 1 // v>>e is in [histSub, 2*histSub)
	return histSub + e*histSub + int(v>>e) - histSub
}

// histValue returns the middle of bucket i.
func histValue(i int) uint64 {
	if i < histSub {
		return uint64(i)
	}
	e := (i - histSub) / histSub
	m := uint64((i-histSub)%histSub + histSub)
	lo := m << e
	return lo + (uint64(1)<<e)/2
}

// Record adds one duration; negative durations count as zero.
func (h *Histogram) Record(d time.Duration) {
	v := int64(d)
	if v < 0 {
		v = 0
	}
	h.counts[histIndex(uint64(v))].Add(1)
	h.n.Add(1)
	h.sum.Add(v)
	for {
		cur := h.max.Load()
		if v <= cur || h.max.CompareAndSwap(cur, v) {
			break
		}
	}
	for {
		cur := h.min.Load()
		if (cur != 0 && v+1 >= cur) || h.min.CompareAndSwap(cur, v+1) {
			break
		}
	}
}

// Count returns the number of recorded values.
func (h *Histogram) Count() uint64 { return h.n.Load() }

// Max returns the largest recorded value.
func (h *Histogram) Max() time.Duration { return time.Duration(h.max.Load()) }

// Min returns the smallest recorded value.
func (h *Histogram) Min() time.Duration {
	m := h.min.Load()
	if m == 0 {
		return 0
	}
	return time.Duration(m - 1)
}

// Mean returns the average of the recorded values.
func (h *Histogram) Mean() time.Duration {
	n := h.n.Load()
	if n == 0 {
		return 0
	}
	return time.Duration(h.sum.Load() / int64(n))
}

// Quantile returns the value below which a fraction q of the records lie
// (q=0.5 is the median), to within the bucket precision and clamped to the
// recorded minimum and maximum. It returns 0 for an empty histogram.
func (h *Histogram) Quantile(q float64) time.Duration {
	n := h.n.Load()
	if n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(n)))
	if rank < 1 {
		rank = 1
	}
	var cum uint64
	for i := range h.counts {
		cum += h.counts[i].Load()
		if cum >= rank {
			v := time.Duration(histValue(i))
			return min(max(v, h.Min()), h.Max())
		}
	}
	return h.Max()
}

// histSnapshot is a Histogram in transit (JSON) between processes.
type histSnapshot struct {
	Counts map[int]uint64 `json:"counts"` // bucket index → count, non-zero only
	N      uint64         `json:"n"`
	Sum    int64          `json:"sum"`
	Min    int64          `json:"min"` // as stored: value+1, 0 when empty
	Max    int64          `json:"max"`
}

func (h *Histogram) snapshot() histSnapshot {
	s := histSnapshot{Counts: map[int]uint64{}, N: h.n.Load(), Sum: h.sum.Load(), Min: h.min.Load(), Max: h.max.Load()}
	for i := range h.counts {
		if c := h.counts[i].Load(); c > 0 {
			s.Counts[i] = c
		}
	}
	return s
}

func (s histSnapshot) histogram() *Histogram {
	h := NewHistogram()
	for i, c := range s.Counts {
		if i >= 0 && i < histBuckets {
			h.counts[i].Store(c)
		}
	}
	h.n.Store(s.N)
	h.sum.Store(s.Sum)
	h.min.Store(s.Min)
	h.max.Store(s.Max)
	return h
}
