package actor

import (
	"testing"
)

func TestSandboxUse_SleepDue(t *testing.T) {
	t.Run("kept until active", func(t *testing.T) {
		var u sandboxUse
		u.sleepFired(3, phaseOpening)
		if u.idle() {
			t.Fatal("idle with a sleep timer due")
		}
		for _, p := range []phase{phaseNew, phaseOpening, phaseDraining, phaseWaking} {
			if _, ok := u.takeSleep(p); ok || u.sleepDue != 3 {
				t.Fatalf("taken in phase %v (due %d)", p, u.sleepDue)
			}
		}
		gen, ok := u.takeSleep(phaseActive)
		if !ok || gen != 3 || u.sleepDue != 0 || !u.idle() {
			t.Fatalf("takeSleep(active) = %d %v, due %d", gen, ok, u.sleepDue)
		}
		if _, ok := u.takeSleep(phaseActive); ok {
			t.Fatal("taken twice")
		}
	})
	t.Run("forgotten when going away", func(t *testing.T) {
		for _, p := range []phase{phaseClosing, phasePassivating, phaseDeleting} {
			u := sandboxUse{sleepDue: 7}
			if _, ok := u.takeSleep(p); ok || u.sleepDue != 0 {
				t.Fatalf("phase %v: taken %v, due %d", p, ok, u.sleepDue)
			}
		}
	})
	t.Run("not recorded while passivating", func(t *testing.T) {
		var u sandboxUse
		u.sleepFired(4, phasePassivating)
		u.sleepFired(0, phaseActive)
		if u.sleepDue != 0 {
			t.Fatalf("due %d", u.sleepDue)
		}
	})
}

func TestSandboxUse_Op(t *testing.T) {
	var u sandboxUse
	cancelled := 0
	op := u.startOp(func() { cancelled++ })
	if u.idle() || u.op != op {
		t.Fatal("op not recorded")
	}
	if u.opDone(&boxOp{}) {
		t.Fatal("another op's end taken for the current one")
	}
	if !u.opDone(op) || !u.idle() {
		t.Fatal("op end not recorded")
	}
	if u.opDone(op) {
		t.Fatal("op ended twice")
	}
	op = u.startOp(func() { cancelled++ })
	u.cancelOp()
	u.cancelOp()
	if cancelled != 1 || u.op != nil {
		t.Fatalf("cancelled %d times, op %v", cancelled, u.op)
	}
	// The end of a cancelled op is stale.
	if u.opDone(op) {
		t.Fatal("a cancelled op's end accepted")
	}
}
