package client

import (
	"testing"
	"time"
)

func TestBackoff(t *testing.T) {
	const lo, hi = 100 * time.Millisecond, 3 * time.Second
	for n := 1; n <= 70; n++ {
		want := hi
		if n <= 5 {
			want = lo << (n - 1) // 100ms, 200ms, 400ms, 800ms, 1.6s
		}
		for range 50 {
			d := backoff(n, lo, hi)
			if d < want/2 || d > want {
				t.Fatalf("backoff(%d) = %s, want within [%s, %s]", n, d, want/2, want)
			}
		}
	}
}

func TestWatchOptions_Defaults(t *testing.T) {
	o := WatchOptions{MinBackoff: time.Second, MaxBackoff: time.Millisecond}.withDefaults()
	if o.MaxBackoff != time.Second || o.Buffer != DefaultBuffer || o.HelloTimeout != DefaultHelloTimeout ||
		o.WriteTimeout != DefaultWriteTimeout || o.ReadLimit != DefaultReadLimit {
		t.Fatalf("withDefaults = %+v", o)
	}
}
