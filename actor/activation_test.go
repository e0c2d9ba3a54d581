package actor

import (
	"context"
	"log/slog"
	"sync"
	"testing"
)

// moveLog records the illegal moves an activation reports.
type moveLog struct {
	mu    sync.Mutex
	moves [][2]string
}

func (*moveLog) Enabled(context.Context, slog.Level) bool { return true }
func (*moveLog) WithAttrs([]slog.Attr) slog.Handler       { panic("unused") }
func (*moveLog) WithGroup(string) slog.Handler            { panic("unused") }

func (l *moveLog) Handle(_ context.Context, r slog.Record) error {
	var m [2]string
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "from":
			m[0] = a.Value.String()
		case "to":
			m[1] = a.Value.String()
		}
		return true
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	l.moves = append(l.moves, m)
	return nil
}

func (l *moveLog) got() [][2]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.moves
}

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
	bad := &moveLog{}
	a := activation{log: slog.New(bad)}
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
	if got := bad.got(); len(got) != 0 {
		t.Fatalf("illegal moves reported: %v", got)
	}
}

func TestActivation_DeleteKeepsDeletingWhileDraining(t *testing.T) {
	bad := &moveLog{}
	a := activation{phase: phaseActive, log: slog.New(bad)}
	a.toDeleting(nil)
	a.toDraining()
	if a.phase != phaseDeleting {
		t.Fatalf("phase %v after draining a deleted session, want deleting", a.phase)
	}
	a.toPassivating()
	if got := bad.got(); a.phase != phasePassivating || len(got) != 0 {
		t.Fatalf("phase %v, illegal %v", a.phase, got)
	}
}

func TestActivation_IllegalMoveReportedAndMade(t *testing.T) {
	bad := &moveLog{}
	a := activation{phase: phaseClosing, log: slog.New(bad)}
	a.toActive()
	if got := bad.got(); len(got) != 1 || got[0] != [2]string{"closing", "active"} {
		t.Fatalf("illegal moves %v, want [closing active]", got)
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
