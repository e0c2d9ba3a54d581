package actor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/mount"
	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/blob"
)

// EnvPreviousTurn is session.EnvPreviousTurn, kept for callers of this
// package.
const EnvPreviousTurn = session.EnvPreviousTurn

// box is one session's sandbox as this node holds it: the handle, the
// Volume that saves its workspace and what the node knows about both. It
// outlives the session actor's activations (the host keeps it in
// Host.boxes), so a sandbox stays awake, and its sleep timer runs, while
// the session hibernates.
//
// Only the session's actor uses its box, and it lends it to one goroutine
// at a time (the turn's runner, or one sandbox op), so the fields above the
// line need no lock.
type box struct {
	id session.ID

	sb        compute.Sandbox // nil: none open on this node (never opened, died, or replaced)
	ws        mount.Workspace // sb's workspace; nil without a store
	vol       *mount.Volume   // sb's saved copy: one Volume per sandbox, replaced with sb
	fence     int64           // the fence sb was opened with
	restored  bool            // the workspace holds the saved copy (or none existed): Save may write
	asleep    bool            // put to sleep by the node; the next turn wakes and restores it
	kept      bool            // asleep keeping its processes (an agent's, agenthome.go): the wake restores nothing
	dirty     bool            // a turn ran since the last successful save
	born      time.Time       // when sb was provisioned, for MaxLifetime
	machine   uint64          // Config.SandboxGeneration when sb was last made ready
	egress    []string        // the session's effective egress allowlist, set by its actor before each turn
	opened    []string        // the egress allowlist sb was opened with
	mounts    []compute.Mount // the agent's mounts, set by its actor before an agent turn (agent.go)
	mounted   []compute.Mount // the mounts sb was opened with
	limits    sandboxLimits   // the session's own memory and pids, set by its actor before each turn (settings.go)
	limited   sandboxLimits   // the limits sb was opened with
	setup     *setupStep      // the session's setup command, set by its actor before each turn (setup.go)
	setupDone setupMark       // what the last successful setup ran for (setup.go)
	agent     *agentProc      // the agent process running in sb, nil if none (agent.go)

	// ---
	awake bool        // guarded by sandboxes.mu: sb is open and not asleep
	timer *time.Timer // guarded by sandboxes.mu: the sleep timer
	gen   uint64      // guarded by sandboxes.mu: the sleep timer's generation
}

// drop forgets the sandbox handle (it died, was destroyed, or must be
// opened again); the next turn opens and restores a sandbox.
func (b *box) drop() {
	b.sb, b.ws, b.vol = nil, nil, nil
	b.fence, b.restored, b.asleep, b.kept = 0, false, false, false
}

// sandboxes is the node's registry of boxes, one per session that had a
// sandbox on this node.
type sandboxes struct {
	h *Host

	mu     sync.Mutex
	boxes  map[session.ID]*box // guarded by mu
	closed bool                // guarded by mu
}

// get returns id's box, making an empty one if there is none.
func (r *sandboxes) get(id session.ID) *box {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.boxes[id]
	if b == nil {
		b = &box{id: id}
		r.boxes[id] = b
	}
	return b
}

// remove forgets id's box and stops its timer.
func (r *sandboxes) remove(id session.ID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if b := r.boxes[id]; b != nil {
		r.disarmLocked(b)
		delete(r.boxes, id)
	}
}

// setAwake records whether b's sandbox is open and awake.
func (r *sandboxes) setAwake(b *box, awake bool) {
	r.mu.Lock()
	b.awake = awake
	if !awake {
		r.disarmLocked(b)
	}
	r.mu.Unlock()
}

// arm (re)starts b's sleep timer: after d without a turn, the session is
// told (activating it if it hibernated) to put its sandbox to sleep.
func (r *sandboxes) arm(b *box, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.disarmLocked(b)
	if r.closed || !b.awake {
		return
	}
	b.gen++
	gen, id := b.gen, b.id
	b.timer = time.AfterFunc(d, func() { r.fire(id, gen) })
}

// armed reports whether b's sleep timer runs.
func (r *sandboxes) armed(b *box) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return b.timer != nil
}

// disarm stops b's sleep timer (a turn starts).
func (r *sandboxes) disarm(b *box) {
	r.mu.Lock()
	r.disarmLocked(b)
	r.mu.Unlock()
}

func (r *sandboxes) disarmLocked(b *box) {
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	}
	b.gen++
}

// due reports whether gen is the generation of b's running sleep timer
// that fired: a turn since then made it stale.
func (r *sandboxes) due(b *box, gen uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if b.gen != gen || b.timer == nil {
		return false
	}
	b.timer = nil
	return true
}

// fire runs on the timer's goroutine: it asks the manager to deliver the
// news to the session, activating it if it hibernated, since only its actor
// may log events.
func (r *sandboxes) fire(id session.ID, gen uint64) {
	r.mu.Lock()
	b := r.boxes[id]
	ok := !r.closed && b != nil && b.gen == gen
	r.mu.Unlock()
	if ok {
		r.h.system.Root.Send(r.h.manager, &placeMsg{req: session.PlaceRequest{Op: session.PlaceActivate, Session: id}, sleep: gen})
	}
}

// awakeIDs returns the sessions whose sandbox is awake.
func (r *sandboxes) awakeIDs() []session.ID {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ids []session.ID
	for id, b := range r.boxes {
		if b.awake {
			ids = append(ids, id)
		}
	}
	return ids
}

// close stops every timer; later arms do nothing.
func (r *sandboxes) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	for _, b := range r.boxes {
		r.disarmLocked(b)
	}
}

// noteFunc reports a sandbox event (unless state is "") and, with err set,
// an error event to the session actor, which logs them.
type noteFunc func(state session.SandboxState, detail string, err *session.ErrorData)

// expired reports whether b's sandbox has outlived MaxLifetime.
func (h *Host) expired(b *box) bool {
	return b.sb != nil && h.now().Sub(b.born) >= h.cfg.SandboxMaxLifetime
}

// generation returns the provider's machine generation of id (0 when the
// provider does not say).
func (h *Host) generation(id session.ID) uint64 {
	if h.cfg.SandboxGeneration == nil {
		return 0
	}
	return h.cfg.SandboxGeneration(id)
}

// replaced reports whether b's machine changed under its handle since it
// was made ready (see Config.SandboxGeneration).
func (h *Host) replaced(b *box) bool {
	return b.sb != nil && h.cfg.SandboxGeneration != nil && h.generation(b.id) != b.machine
}

// readyBox makes b's sandbox ready for a turn with fence: it replaces a
// sandbox that outlived MaxLifetime (saving it first), opens one if b has
// none (provisioning), opens it again if b's handle carries an older fence,
// and restores the workspace when the sandbox is new or was asleep. Every
// step is reported through note. An error is said in a sentence a user can
// read; the box is then left without a handle, so the next turn opens and
// restores afresh, and nothing is saved over the good copy.
func (h *Host) readyBox(ctx context.Context, b *box, fence int64, note noteFunc) error {
	if err := h.nodeMayWrite(); err != nil {
		// A node paused past its lease starts nothing in the sandbox.
		msg := "the sandbox was not started: this node may no longer own the session (" + err.Error() + ")"
		note(session.SandboxFailed, msg, &session.ErrorData{Code: session.CodeUnavailable, Message: msg})
		return errors.New(msg)
	}
	if h.expired(b) {
		h.replaceExpired(ctx, b, note)
	}
	changed := false
	switch {
	case b.sb == nil:
		note(session.SandboxProvisioning, "", nil)
		sb, err := h.openSandbox(ctx, b, fence)
		if err != nil {
			msg := "the sandbox could not be provisioned: " + err.Error()
			note(session.SandboxFailed, msg, &session.ErrorData{Code: session.CodeUnavailable, Message: msg})
			return errors.New(msg)
		}
		b.sb, b.fence, b.born = sb, fence, h.now()
		b.restored, b.asleep = false, false
		changed = true
	case b.fence < fence || !slices.Equal(b.opened, b.egress) || !slices.Equal(b.mounted, b.mounts) || b.limited != b.limits || b.kept:
		// A new activation: the handle must carry its fence. Or the
		// session's egress allowlist changed: opening again applies it.
		// Or it slept keeping its processes: opening wakes it now, so
		// that a machine replaced because it could not be woken shows
		// below.
		sb, err := h.openSandbox(ctx, b, fence)
		if err != nil {
			b.drop()
			msg := "the sandbox could not be opened: " + err.Error()
			note(session.SandboxFailed, msg, &session.ErrorData{Code: session.CodeUnavailable, Message: msg})
			return errors.New(msg)
		}
		b.sb, b.fence = sb, fence
	}
	if h.replaced(b) {
		// The provider swapped the machine under the handle (its VM died
		// while idle): its workspace is not the one the Volume knows.
		b.restored = false
	}
	if h.cfg.Store != nil {
		if b.vol == nil {
			b.vol = &mount.Volume{Blob: h.cfg.Store, Prefix: mount.Prefix(b.id), Logger: h.log.With("session", b.id)}
		}
		ws, err := h.cfg.WorkspaceOf(b.sb)
		if err != nil {
			b.drop()
			msg := "the sandbox's workspace cannot be saved: " + err.Error()
			note(session.SandboxFailed, msg, &session.ErrorData{Code: session.CodeInternal, Message: msg})
			return errors.New(msg)
		}
		b.ws = ws
		if !b.restored || b.asleep && !b.kept {
			note(session.SandboxRestoring, "", nil)
			start := time.Now()
			rctx, span := h.startSpan(ctx, "workspace.restore", b.id)
			st, err := b.vol.Restore(rctx, b.ws, b.fence)
			endWorkspace(span, st, st.BytesRead, err)
			h.metrics.restored(st, time.Since(start), err)
			if err != nil {
				b.drop()
				msg := "workspace not restored: " + storeProblem(err) + "; the saved copy is untouched and the next turn tries again"
				note(session.SandboxFailed, msg, &session.ErrorData{Code: errorCode(err), Message: msg})
				return errors.New(msg)
			}
			b.restored = true
			changed = true
		}
	} else if b.asleep {
		changed = true // The next command wakes it.
	}
	changed = changed || b.kept // Woken, nothing restored.
	b.asleep, b.kept = false, false
	b.machine = h.generation(b.id)
	if changed {
		note(session.SandboxReady, "", nil)
	}
	h.boxes.setAwake(b, true)
	return nil
}

// openSandbox opens b's sandbox with fence.
func (h *Host) openSandbox(ctx context.Context, b *box, fence int64) (_ compute.Sandbox, err error) {
	ctx, span := h.startSpan(ctx, "sandbox.open", b.id)
	defer func() { endSpan(span, err) }()
	spec := h.cfg.SandboxSpec
	spec.Session, spec.Fence = b.id, fence
	spec.Egress = slices.Clone(b.egress)
	if b.egress == nil {
		spec.Egress = slices.Clone(h.cfg.SandboxSpec.Egress)
	}
	spec.Mounts = append(slices.Clone(spec.Mounts), b.mounts...)
	b.limits.apply(&spec) // settings.go
	sb, err := h.cfg.Provider.Open(ctx, spec)
	if err == nil {
		b.opened, b.mounted, b.limited = spec.Egress, slices.Clone(b.mounts), b.limits
	}
	return sb, err
}

// replaceExpired saves and destroys a sandbox that outlived MaxLifetime, so
// the turn gets a fresh one with the same workspace. If the workspace holds
// changes that cannot be saved, the old sandbox is kept (and replaced at a
// later turn) rather than losing them.
func (h *Host) replaceExpired(ctx context.Context, b *box, note noteFunc) {
	if b.dirty && b.vol != nil {
		note(session.SandboxSaving, "", nil)
		if err := h.saveBox(ctx, b); err != nil {
			note("", "", saveError(err)) // Kept, and replaced at a later turn.
			return
		}
	}
	if err := b.sb.Destroy(ctx); err != nil {
		h.log.Warn("destroy a sandbox past its maximum lifetime", "session", b.id, "err", err)
	}
	b.drop()
	h.boxes.setAwake(b, false)
	note(session.SandboxStopped, fmt.Sprintf("replaced by a fresh sandbox: it reached its maximum lifetime of %v", h.cfg.SandboxMaxLifetime), nil)
}

// saveBox saves b's workspace; it clears b.dirty on success. Without a
// store it does nothing.
func (h *Host) saveBox(ctx context.Context, b *box) error {
	if b.vol == nil || b.ws == nil {
		return nil
	}
	if h.replaced(b) {
		return errMachineReplaced
	}
	if err := h.nodeMayWrite(); err != nil {
		return fmt.Errorf("save workspace: %w", err)
	}
	start := time.Now()
	sctx, span := h.startSpan(ctx, "workspace.save", b.id)
	st, err := b.vol.Save(sctx, b.ws, b.fence)
	endWorkspace(span, st, st.BytesWritten, err)
	h.metrics.saved(st, time.Since(start), err)
	if err != nil {
		return err
	}
	b.dirty = false
	return nil
}

// errMachineReplaced: the provider replaced the sandbox's machine under its
// handle, so its workspace is not the one the Volume restored.
var errMachineReplaced = errors.New("the sandbox's machine was replaced while the turn ran")

// sleepBox saves b's workspace and puts its sandbox to sleep. A failed save
// does not keep it awake: sleeping keeps the workspace in the sandbox, and
// the next save (after the next turn) retries.
func (h *Host) sleepBox(ctx context.Context, b *box, why string, note noteFunc) {
	h.sleepBoxKeeping(ctx, b, why, false, note)
}

// sleepBoxKeeping is sleepBox that, with keep, keeps the agent process
// running when the provider's sleep keeps processes (agenthome.go).
func (h *Host) sleepBoxKeeping(ctx context.Context, b *box, why string, keep bool, note noteFunc) {
	keep = h.keepAgent(ctx, b, keep, note) // agenthome.go: else the agent exits; its home is saved either way
	if b.vol != nil {
		note(session.SandboxSaving, "", nil)
		if err := h.saveBox(ctx, b); err != nil {
			note("", "", saveError(err))
		}
	}
	if err := b.sb.Sleep(ctx); err != nil {
		b.drop()
		h.boxes.setAwake(b, false)
		msg := "the sandbox could not be put to sleep: " + err.Error()
		note(session.SandboxFailed, msg, nil)
		return
	}
	b.asleep, b.kept = true, keep
	h.boxes.setAwake(b, false)
	note(session.SandboxSleeping, why, nil)
}

// destroyBox destroys id's sandbox and its saved workspace, for a deleted
// session. b may have no handle: one is opened with fence (the deleting
// activation's) if the session had a sandbox.
func (h *Host) destroyBox(ctx context.Context, b *box, hadSandbox bool, fence int64) error {
	var errs []error
	sb := b.sb
	if sb == nil && hadSandbox {
		spec := h.cfg.SandboxSpec
		spec.Session, spec.Fence = b.id, fence
		var err error
		if sb, err = h.cfg.Provider.Open(ctx, spec); err != nil {
			errs = append(errs, fmt.Errorf("open sandbox to destroy it: %w", err))
		}
	}
	if sb != nil {
		if err := sb.Destroy(ctx); err != nil {
			errs = append(errs, fmt.Errorf("destroy sandbox: %w", err))
		}
	}
	if h.cfg.Store != nil {
		vol := b.vol
		if vol == nil {
			vol = &mount.Volume{Blob: h.cfg.Store, Prefix: mount.Prefix(b.id), Logger: h.log.With("session", b.id)}
		}
		if err := vol.Delete(ctx); err != nil {
			errs = append(errs, err)
		}
		if err := h.deleteAgentHome(ctx, b.id); err != nil { // agenthome.go
			errs = append(errs, err)
		}
	}
	b.drop()
	return errors.Join(errs...)
}

// saveError is the error event of a failed save.
func saveError(err error) *session.ErrorData {
	return &session.ErrorData{Code: errorCode(err), Message: "workspace not saved: " + storeProblem(err) +
		"; the sandbox keeps the changes and the next save retries"}
}

// storeProblem describes a failed save or restore.
func storeProblem(err error) string {
	switch {
	case errors.Is(err, blob.ErrUnavailable):
		return "object store unavailable (" + err.Error() + ")"
	case errors.Is(err, mount.ErrFenced):
		return "another node owns the session now (" + err.Error() + ")"
	}
	return err.Error()
}

// errorCode is the code of the error event of a failed save or restore.
func errorCode(err error) session.Code {
	switch {
	case errors.Is(err, mount.ErrConflict), errors.Is(err, mount.ErrFenced), errors.Is(err, session.ErrConflict):
		return session.CodeConflict
	case errors.Is(err, mount.ErrCorrupt), errors.Is(err, mount.ErrInvalid):
		return session.CodeInternal
	case errors.Is(err, session.ErrInsufficientStorage): // a tenant's object-store quota (mount.Quota)
		return session.CodeInsufficientStorage
	}
	return session.CodeUnavailable
}

// sandboxGone reports whether an Exec error means the sandbox itself is
// gone or unusable (rather than the command being bad).
func sandboxGone(err error) bool {
	return errors.Is(err, session.ErrUnavailable) || errors.Is(err, session.ErrNotFound) ||
		errors.Is(err, session.ErrConflict)
}

// lookup returns id's box, or nil if the session has none on this node.
func (r *sandboxes) lookup(id session.ID) *box {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.boxes[id]
}

// isAwake reports whether b's sandbox is open and awake.
func (r *sandboxes) isAwake(b *box) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return b.awake
}

// --- the session actor's side -----------------------------------------------

// previousTurn is how a turn ended: the value of EnvPreviousTurn.
type previousTurn struct {
	Turn     int64              `json:"turn"`
	Status   session.TurnStatus `json:"status"`
	ExitCode int                `json:"exit_code"`
	Reason   string             `json:"reason,omitempty"`
}

// previousOf reads from the history how the last finished turn ended: its
// turn_finished and, if it did not end ok, the last error event logged
// during it.
func previousOf(ctx context.Context, hist History) (*previousTurn, error) {
	raw, err := hist.LastOfKind(ctx, session.KindTurnFinished)
	if err != nil || raw == nil {
		return nil, err
	}
	var fin session.TurnFinishedData
	finEv, err := decodeEvent(raw, &fin)
	if err != nil {
		return nil, fmt.Errorf("decode last turn_finished: %w", err)
	}
	p := &previousTurn{Turn: fin.Turn, Status: fin.Status, ExitCode: fin.ExitCode}
	if fin.Status == session.TurnOK {
		return p, nil
	}
	var started session.TurnStartedData
	raw, err = hist.LastOfKind(ctx, session.KindTurnStarted)
	if err != nil || raw == nil {
		return p, err
	}
	startEv, err := decodeEvent(raw, &started)
	if err != nil || started.Turn != fin.Turn {
		return p, nil
	}
	raw, err = hist.LastOfKind(ctx, session.KindError)
	if err != nil || raw == nil {
		return p, err
	}
	var e session.ErrorData
	if ev, err := decodeEvent(raw, &e); err == nil && ev.Seq > startEv.Seq && ev.Seq < finEv.Seq {
		p.Reason = e.Message
	}
	return p, nil
}

// boxOp is a sandbox operation that runs outside turns: putting the
// sandbox to sleep (idle, or before the host shuts down).
type boxOp struct{ cancel context.CancelFunc }

// boxOpDone reports the end of a boxOp.
type boxOpDone struct{ op *boxOp }

// armSleep starts the sleep timer of the session's sandbox once no turn
// runs (the timer does nothing for a sandbox that is not awake).
func (s *sessionActor) armSleep() {
	if s.sandbox.box != nil && s.queue.runner == nil && !s.act.shutting {
		s.h.boxes.arm(s.sandbox.box, s.h.cfg.SandboxSleepAfter)
	}
}

// maybeSleep puts the sandbox to sleep when its timer fired and the
// session is still idle. A turn that started since made the timer stale;
// its end arms a new one.
func (s *sessionActor) maybeSleep() {
	gen, ok := s.sandbox.takeSleep(s.act.phase)
	if !ok {
		return
	}
	if s.sandbox.box == nil || s.queue.runner != nil || s.sandbox.op != nil || s.act.shutting || !s.queue.turns.Idle() ||
		!s.h.boxes.due(s.sandbox.box, gen) || !s.h.boxes.isAwake(s.sandbox.box) {
		return
	}
	s.log.Debug("sandbox idle: saving its workspace and putting it to sleep")
	s.startSleep(fmt.Sprintf("no turn for %v", s.h.cfg.SandboxSleepAfter))
}

// startSleep saves the workspace and puts the sandbox to sleep on a
// goroutine; turns wait for it.
func (s *sessionActor) startSleep(why string) {
	b := s.sandbox.box
	ctx, cancel := context.WithCancel(s.h.ctx)
	op := s.sandbox.startOp(cancel)
	s.spawn(func() {
		defer cancel()
		s.h.sleepBoxKeeping(ctx, b, why, !s.act.shutting, func(state session.SandboxState, detail string, err *session.ErrorData) {
			s.send(&sandboxNote{state: state, detail: detail, err: err})
		})
		s.send(&boxOpDone{op: op})
	})
}
