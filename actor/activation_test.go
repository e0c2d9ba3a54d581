package actor

import (
	"testing"
)

func TestActivation_Moves(t *testing.T) {
	// Every move the session actor makes, with the message that causes it.
	allowed := []struct {
		name     string
		from, to phase
	}{
		{"place request opens", phaseNew, phaseOpening},
		{"idle before any place request", phaseNew, phasePassivating},
		{"history opened", phaseOpening, phaseActive},
		{"history failed to open", phaseOpening, phasePassivating},
		{"idle: hibernate", phaseActive, phaseDraining},
		{"delete", phaseActive, phaseDeleting},
		{"lease lost while active", phaseActive, phasePassivating},
		{"work arrived while draining", phaseDraining, phaseWaking},
		{"drained and idle", phaseDraining, phaseClosing},
		{"delete while draining", phaseDraining, phaseDeleting},
		{"re-subscribed", phaseWaking, phaseActive},
		{"delete while waking", phaseWaking, phaseDeleting},
		{"history closed", phaseClosing, phasePassivating},
		{"lease lost while passivating", phasePassivating, phasePassivating},
		{"deleted", phaseDeleting, phasePassivating},
	}
	for _, tc := range allowed {
		t.Run(tc.name, func(t *testing.T) {
			if !canMove(tc.from, tc.to) {
				t.Fatalf("canMove(%v, %v) = false, want true", tc.from, tc.to)
			}
		})
	}
	refused := []struct{ from, to phase }{
		{phaseNew, phaseActive},         // never serves before opening
		{phaseOpening, phaseDraining},   // nothing to drain yet
		{phaseActive, phaseClosing},     // closes only after the subscription drained
		{phaseClosing, phaseActive},     // a closing session never serves again
		{phasePassivating, phaseActive}, // nor a passivating one
		{phaseDeleting, phaseActive},    // nor one being deleted
		{phaseDeleting, phaseDraining},  // a deleted session's drain keeps it deleting
		{phase(-1), phaseActive},
		{phase(99), phaseActive},
	}
	for _, tc := range refused {
		if canMove(tc.from, tc.to) {
			t.Errorf("canMove(%v, %v) = true, want false", tc.from, tc.to)
		}
	}
	// Passivating is reachable from everywhere (a lost lease).
	for p := phaseNew; p <= phaseDeleting; p++ {
		if !canMove(p, phasePassivating) {
			t.Errorf("canMove(%v, passivating) = false", p)
		}
	}
}

func TestActivation_Lifecycle(t *testing.T) {
	var bad [][2]phase
	a := activation{illegal: func(from, to phase) { bad = append(bad, [2]phase{from, to}) }}
	// Open, serve, hibernate with work arriving while draining, serve again,
	// then hibernate for good.
	steps := []struct {
		do      func()
		want    phase
		serving bool
	}{
		{a.toOpening, phaseOpening, false},
		{a.toActive, phaseActive, true},
		{a.toDraining, phaseDraining, true},
		{a.toWaking, phaseWaking, true},
		{a.toActive, phaseActive, true},
		{a.toDraining, phaseDraining, true},
		{a.toClosing, phaseClosing, false},
		{a.toPassivating, phasePassivating, false},
	}
	for i, st := range steps {
		st.do()
		if a.phase != st.want {
			t.Fatalf("step %d: phase %v, want %v", i, a.phase, st.want)
		}
		if a.serving() != st.serving {
			t.Fatalf("step %d (%v): serving %v, want %v", i, a.phase, a.serving(), st.serving)
		}
	}
	if len(bad) != 0 {
		t.Fatalf("illegal moves reported: %v", bad)
	}
}

func TestActivation_DeleteKeepsDeletingWhileDraining(t *testing.T) {
	var bad [][2]phase
	a := activation{phase: phaseActive, illegal: func(from, to phase) { bad = append(bad, [2]phase{from, to}) }}
	a.toDeleting(nil)
	a.toDraining()
	if a.phase != phaseDeleting {
		t.Fatalf("phase %v after draining a deleted session, want deleting", a.phase)
	}
	a.toPassivating()
	if a.phase != phasePassivating || len(bad) != 0 {
		t.Fatalf("phase %v, illegal %v", a.phase, bad)
	}
}

func TestActivation_IllegalMoveReportedAndMade(t *testing.T) {
	var bad [][2]phase
	a := activation{phase: phaseClosing, illegal: func(from, to phase) { bad = append(bad, [2]phase{from, to}) }}
	a.toActive()
	if len(bad) != 1 || bad[0] != [2]phase{phaseClosing, phaseActive} {
		t.Fatalf("illegal moves %v, want [closing active]", bad)
	}
	// Made anyway: the table documents the actor; it does not change what
	// the actor does.
	if a.phase != phaseActive {
		t.Fatalf("phase %v, want active", a.phase)
	}
}

func TestActivation_TakeWaitingAndEarly(t *testing.T) {
	var a activation
	p1, p2 := &placeMsg{}, &placeMsg{}
	c1 := &cmdMsg{}
	a.waiting = append(a.waiting, p1, p2)
	a.early = append(a.early, c1)
	if w := a.takeWaiting(); len(w) != 2 || w[0] != p1 || w[1] != p2 {
		t.Fatalf("takeWaiting = %v", w)
	}
	if a.waiting != nil {
		t.Fatalf("waiting not cleared: %v", a.waiting)
	}
	if e := a.takeEarly(); len(e) != 1 || e[0] != c1 {
		t.Fatalf("takeEarly = %v", e)
	}
	if a.early != nil || a.takeEarly() != nil || a.takeWaiting() != nil {
		t.Fatal("early or waiting not cleared")
	}
}

func TestPhase_String(t *testing.T) {
	for p, want := range map[phase]string{phaseNew: "new", phaseWaking: "waking", phaseDeleting: "deleting", phase(42): "phase(42)"} {
		if got := p.String(); got != want {
			t.Errorf("phase %d: %q, want %q", int(p), got, want)
		}
	}
}
