package gateway

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// paceServer returns the least of a Server that topic.broadcast uses: its
// metrics and a hub paced at pace.
func paceServer(t *testing.T, pace time.Duration) *Server {
	t.Helper()
	s := &Server{}
	m, err := newMetrics(s, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	s.metrics = m
	s.hub = &hub{s: s, pace: pace}
	return s
}

// woken reports whether w's writer was signalled, taking the signal.
func woken(w *watcher) bool {
	select {
	case <-w.q.wake:
		return true
	default:
		return false
	}
}

// TestTopic_PacedBroadcast: with 1,000 watchers and a 20 ms pace, the first
// broadcast wakes every writer at once; broadcasts within the next 20 ms are
// queued without waking anyone, and every writer is woken once when the 20
// ms are up, to find all of them queued in order; after a quiet period the
// next broadcast wakes at once again. A topic of 100 watchers is paced at 2
// ms, and a hub without pacing wakes at every broadcast.
func TestTopic_PacedBroadcast(t *testing.T) {
	const pace = 20 * time.Millisecond
	newTopic := func(s *Server, n int) (*topic, []*watcher) {
		tp := &topic{id: "s_pace", watchers: make(map[*watcher]struct{})}
		ws := make([]*watcher, n)
		for i := range ws {
			ws[i] = &watcher{}
			ws[i].q.init(DefaultSendQueue)
			tp.watchers[ws[i]] = struct{}{}
		}
		return tp, ws
	}
	frame := func(i int) out { return out{frame: []byte{byte('a' + i)}} }
	countWoken := func(ws []*watcher) int {
		n := 0
		for _, w := range ws {
			if woken(w) {
				n++
			}
		}
		return n
	}

	t.Run("1000 watchers", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := paceServer(t, pace)
			tp, ws := newTopic(s, 1000)
			tp.broadcast(s, frame(0))
			if n := countWoken(ws); n != len(ws) {
				t.Fatalf("first broadcast woke %d of %d writers, want all at once", n, len(ws))
			}
			time.Sleep(5 * time.Millisecond)
			tp.broadcast(s, frame(1))
			time.Sleep(5 * time.Millisecond)
			tp.broadcast(s, frame(2))
			if n := countWoken(ws); n != 0 {
				t.Fatalf("broadcasts 5 and 10 ms after a wake woke %d writers, want none before 20 ms", n)
			}
			time.Sleep(9 * time.Millisecond) // 19 ms after the wake
			synctest.Wait()
			if n := countWoken(ws); n != 0 {
				t.Fatalf("%d writers woken 19 ms after the last wake", n)
			}
			time.Sleep(time.Millisecond) // 20 ms: the timer fires
			synctest.Wait()
			if n := countWoken(ws); n != len(ws) {
				t.Fatalf("at the end of the period %d of %d writers were woken", n, len(ws))
			}
			for _, w := range ws[:3] {
				items, _, _ := w.q.take(nil)
				if len(items) != 3 || items[0].frame[0] != 'a' || items[1].frame[0] != 'b' || items[2].frame[0] != 'c' {
					t.Fatalf("writer took %d items %v, want the three broadcasts in order", len(items), items)
				}
			}
			// Within the period that the timer's wake began: paced again.
			time.Sleep(time.Millisecond)
			tp.broadcast(s, frame(3))
			if n := countWoken(ws); n != 0 {
				t.Fatalf("a broadcast 1 ms after the timer's wake woke %d writers", n)
			}
			time.Sleep(pace)
			synctest.Wait()
			if n := countWoken(ws); n != len(ws) {
				t.Fatalf("second period: %d of %d writers woken", n, len(ws))
			}
			// A quiet period: the next broadcast goes at once.
			time.Sleep(time.Second)
			synctest.Wait()
			if n := countWoken(ws); n != 0 {
				t.Fatalf("%d writers woken with nothing broadcast", n)
			}
			tp.broadcast(s, frame(4))
			if n := countWoken(ws); n != len(ws) {
				t.Fatalf("broadcast after a quiet second woke %d of %d writers, want all at once", n, len(ws))
			}
		})
	})

	t.Run("100 watchers", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := paceServer(t, pace)
			tp, ws := newTopic(s, 100)
			tp.broadcast(s, frame(0))
			countWoken(ws)
			time.Sleep(time.Millisecond)
			tp.broadcast(s, frame(1))
			if n := countWoken(ws); n != 0 {
				t.Fatalf("broadcast 1 ms after a wake woke %d writers, want none (pace 2 ms)", n)
			}
			time.Sleep(time.Millisecond)
			synctest.Wait()
			if n := countWoken(ws); n != len(ws) {
				t.Fatalf("after 2 ms %d of %d writers woken", n, len(ws))
			}
		})
	})

	t.Run("no pacing", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := paceServer(t, 0)
			tp, ws := newTopic(s, 1000)
			for i := range 3 {
				tp.broadcast(s, frame(i))
				if n := countWoken(ws); n != len(ws) {
					t.Fatalf("broadcast %d woke %d of %d writers", i, n, len(ws))
				}
			}
		})
	})

	t.Run("slow consumer", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := paceServer(t, pace)
			tp, ws := newTopic(s, 1000)
			ws[0].q.limit = 2
			for i := range 3 {
				tp.broadcast(s, frame(i))
			}
			if !ws[0].q.ended() {
				t.Fatal("a watcher whose queue filled within a period is not closed as a slow consumer")
			}
			if ws[1].q.ended() {
				t.Fatal("a watcher with room was closed")
			}
			time.Sleep(pace)
			synctest.Wait()
		})
	})
}
