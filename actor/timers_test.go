package actor

import (
	"testing"
	"testing/synctest"
	"time"
)

func TestTimers_Idle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var tm timers
		fired := make(chan uint64, 8)
		const after = 30 * time.Second
		arm := func(idle bool) {
			if gen, start := tm.rearmIdle(idle); start {
				tm.startIdle(after, func() { fired <- gen })
			}
		}

		arm(true)
		first := tm.idleGen
		time.Sleep(after / 2)
		// Re-armed without a request: the timer keeps running.
		arm(true)
		if tm.idleGen != first {
			t.Fatal("re-armed without a request")
		}
		// A request restarts it.
		tm.touch()
		arm(true)
		second := tm.idleGen
		if second == first {
			t.Fatal("a request did not restart the timer")
		}
		time.Sleep(after/2 + time.Second)
		synctest.Wait()
		if len(fired) != 0 {
			t.Fatalf("the stopped first timer fired (gen %d)", <-fired)
		}
		time.Sleep(after / 2)
		synctest.Wait()
		gen := <-fired
		if gen != second || !tm.idleFired(gen) {
			t.Fatalf("fired gen %d, want %d accepted", gen, second)
		}
		if tm.idleFired(gen) {
			t.Fatal("one tick accepted twice")
		}
		if tm.idleFired(first) {
			t.Fatal("a stale tick accepted")
		}
	})
}

func TestTimers_IdleStopsWhenBusy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var tm timers
		fired := make(chan uint64, 8)
		arm := func(idle bool) {
			if gen, start := tm.rearmIdle(idle); start {
				tm.startIdle(time.Second, func() { fired <- gen })
			}
		}
		arm(true)
		gen := tm.idleGen
		arm(false)
		if tm.idleTimer != nil {
			t.Fatal("the timer runs while busy")
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if len(fired) != 0 {
			t.Fatal("the stopped timer fired")
		}
		// A tick that raced with the stop is stale.
		if tm.idleFired(gen) {
			t.Fatal("a tick of a stopped timer accepted")
		}
	})
}

func TestTimers_Drain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var tm timers
		n := 0
		tm.armDrain(time.Minute, func() { n++ })
		tm.armDrain(time.Second, func() { n += 100 }) // already running: kept
		time.Sleep(time.Minute + time.Second)
		synctest.Wait()
		if n != 1 {
			t.Fatalf("drain fired %d", n)
		}
		tm.stopDrain()
		tm.armDrain(time.Minute, func() { n++ })
		tm.stopDrain()
		tm.stopDrain()
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		if n != 1 || tm.drainTimer != nil {
			t.Fatalf("a stopped drain timer fired (%d)", n)
		}
	})
}
