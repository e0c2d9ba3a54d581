package schedule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/atriumhq/atrium/gateway/audit"
	"github.com/atriumhq/atrium/gateway/dlq"
	"github.com/atriumhq/atrium/session"
)

// ActRun is the audit action of a scheduled run that ended: by the
// scheduler, by hand (run now) or by a retry of its dead letter.
const ActRun = "schedule_run_finished"

// Payload is what a dead letter of a scheduled run keeps for its retry.
type Payload struct {
	Schedule string    `json:"schedule"`
	Tick     time.Time `json:"tick"`
	// Session is the session prompted; for a New schedule, the one created
	// for the tick (empty if creating it failed), so that a retry prompts
	// it rather than creating another.
	Session session.ID `json:"session,omitempty"`
}

// fire runs r for run.Tick, retrying transient failures, and records the
// result in r's LastRun; a failure for good becomes a dead letter.
func (s *Scheduler) fire(r record, run Run) {
	pl := Payload{Schedule: r.ID, Tick: run.Tick, Session: r.Session}
	var out Outcome
	attempts, err := s.backoff(r).Do(s.ctx, func(ctx context.Context) error {
		var err error
		out, err = s.runOnce(ctx, r, &pl)
		return err
	})
	run.Attempts = attempts
	if err != nil && s.ctx.Err() != nil {
		err = fmt.Errorf("the gateway stopped during the run: %w", err)
	}
	s.finish(r, run, pl, out, err, "")
}

// runOnce runs r once as its creator: it creates the tick's session if r
// asks for a new one and pl has none yet, prompts the session, and follows
// the turn. Once the prompt is durable it is never sent again by this run:
// an error after that is permanent, unless the turn failed because what it
// needed was unavailable (its sandbox did not start), which is transient.
func (s *Scheduler) runOnce(ctx context.Context, r record, pl *Payload) (Outcome, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RunTimeout)
	defer cancel()
	p := r.Principal
	if pl.Session == "" {
		id, err := s.cfg.Sessions.Create(ctx, p, r.runTitle(pl.Tick))
		if err != nil {
			return Outcome{}, explain(r, "", fmt.Errorf("create the run's session: %w", err))
		}
		pl.Session = id
	}
	out, err := s.cfg.Sessions.Run(ctx, p, pl.Session, r.Prompt)
	switch {
	case err != nil && out.Seq != 0:
		return out, fmt.Errorf("the prompt was sent (seq %d of session %s) but its turn could not be followed to its end (%s): see the session before retrying",
			out.Seq, pl.Session, session.AsError(err).Message)
	case err != nil:
		return out, explain(r, pl.Session, err)
	case out.Status == session.TurnOK, out.Status == session.TurnCancelled:
		return out, nil
	}
	msg := fmt.Sprintf("turn %d of session %s ended %s with exit code %d", out.Turn, pl.Session, out.Status, out.ExitCode)
	if out.Reason != "" {
		msg += ": " + out.Reason
	}
	// A turn that failed or timed out is tried again (the prompt sent
	// again to the same session) only under the schedule's retry policy:
	// the agent's failure, unlike the infrastructure's, is retried only
	// when the schedule asks for it.
	if out.Unavailable || r.Retry != nil {
		return out, dlq.Transient(errors.New(msg))
	}
	return out, errors.New(msg)
}

// explain says why a run acting as r's creator was refused, when it was.
func explain(r record, id session.ID, err error) error {
	if !errors.Is(err, session.ErrForbidden) && !errors.Is(err, session.ErrNotFound) {
		return err
	}
	if id == "" {
		return fmt.Errorf("%s, who created schedule %s, may no longer create sessions (the schedule runs as its creator): %w", r.Creator, r.ID, err)
	}
	return fmt.Errorf("%s, who created schedule %s, can no longer drive session %s (the schedule runs as its creator: give them the driver role again, or delete the schedule): %w",
		r.Creator, r.ID, id, err)
}

// finish records how run ended in r's LastRun; a failed run becomes a dead
// letter first (dead, if set, is the entry it already is: a retry by hand).
func (s *Scheduler) finish(r record, run Run, pl Payload, out Outcome, err error, dead string) {
	run.Session, run.Seq, run.Turn = pl.Session, out.Seq, out.Turn
	run.FinishedAt = time.Now().UTC()
	if out.Status != "" {
		code := out.ExitCode
		run.ExitCode = &code
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(s.ctx), s.cfg.Timeout)
	defer cancel()
	if err == nil {
		run.Status = string(out.Status)
		s.log.Info("scheduled run finished", "schedule", r.ID, "session", pl.Session, "turn", out.Turn, "status", run.Status)
	} else {
		run.Status, run.Error, run.DeadLetter = StatusDeadLetter, err.Error(), dead
		if dead == "" && s.cfg.DLQ != nil {
			b, _ := json.Marshal(pl) // a struct of strings and a time always encodes.
			e, perr := s.cfg.DLQ.Put(ctx, dlq.Entry{
				Tenant: r.Tenant, User: r.Creator, Kind: KindSchedule, Ref: r.ID,
				Reason: err.Error(), Permanent: !dlq.IsTransient(err), Attempts: run.Attempts, Payload: b,
			})
			if perr != nil {
				s.log.Error("scheduled run failed and its dead letter could not be stored", "schedule", r.ID,
					"tick", run.Tick, "err", err, "store_err", perr)
			}
			run.DeadLetter = e.ID
		}
		s.log.Warn("scheduled run failed", "schedule", r.ID, "session", pl.Session, "dead_letter", run.DeadLetter, "err", err)
	}
	s.audit(ctx, r, run)
	uerr := s.update(ctx, r.ID, func(cur *record) error {
		if cur.LastRun != nil && cur.LastRun.Tick.After(run.Tick) {
			return errSuperseded
		}
		cur.LastRun = &run
		return nil
	})
	if uerr != nil && !errors.Is(uerr, errSuperseded) && !errors.Is(uerr, session.ErrNotFound) {
		s.log.Warn("scheduled run not recorded", "schedule", r.ID, "err", uerr)
	}
}

// audit records how run of r ended, as r's creator (Via "schedule"): the
// outcome, the turn's status and the tries; never the prompt.
func (s *Scheduler) audit(ctx context.Context, r record, run Run) {
	if s.cfg.Audit == nil {
		return
	}
	e := audit.Entry{Tenant: r.Tenant, Actor: r.Creator, Via: "schedule", Action: ActRun, Outcome: audit.OK,
		Session: string(run.Session), Target: r.ID}
	e.Detail = fmt.Sprintf("tick %s, %s after %d attempt(s)", run.Tick.UTC().Format(time.RFC3339), run.Status, max(run.Attempts, 1))
	if run.Turn != 0 {
		e.Detail += fmt.Sprintf(", turn %d", run.Turn)
	}
	if run.Status != string(session.TurnOK) {
		e.Outcome = audit.Failed
	}
	if run.DeadLetter != "" {
		e.Detail += ", dead letter " + run.DeadLetter
	}
	s.cfg.Audit(ctx, e)
}

// errSuperseded: a later run is recorded already.
var errSuperseded = errors.New("schedule: a later run is recorded")

// retry runs the scheduled run of dead letter e again (dlq.Handle): as the
// schedule's creator, prompting the session the failed run used.
func (s *Scheduler) retry(ctx context.Context, e dlq.Entry) error {
	var pl Payload
	if err := json.Unmarshal(e.Payload, &pl); err != nil || pl.Schedule == "" {
		return fmt.Errorf("dead letter %s does not say which schedule it ran: drop it with `atrium dlq drop %s`", e.ID, e.ID)
	}
	r, _, err := s.get(ctx, pl.Schedule)
	if errors.Is(err, session.ErrNotFound) {
		return fmt.Errorf("schedule %s was deleted: drop this dead letter with `atrium dlq drop %s`", pl.Schedule, e.ID)
	}
	if err != nil {
		return err
	}
	run := Run{Tick: pl.Tick, Session: pl.Session, Status: StatusRunning, StartedAt: time.Now().UTC(), Attempts: e.Attempts + 1}
	out, err := s.runOnce(ctx, r, &pl)
	s.finish(r, run, pl, out, err, e.ID)
	return err
}
