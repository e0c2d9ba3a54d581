package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/atriumhq/atrium/gateway/dlq"
	"github.com/atriumhq/atrium/gateway/schedule"
	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/session/api"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Automation configures schedules and dead letters (docs/automation.md):
// /v1/schedules and /v1/dlq. Every gateway runs a scheduler; one at a time
// (the leader) fires the ticks. The zero value turns them on with the
// defaults.
type Automation struct {
	// DLQ is the gateway's dead-letter queue, shared by every kind of
	// background run. Nil: the tasks' queue (Tasks.Service.DLQ) if there
	// is one, else a queue in the bucket "<prefix>_dlq".
	DLQ *dlq.Queue
	// Replicas is the number of replicas of the buckets the gateway opens
	// (schedules, scheduler lease, dead letters); default 1.
	Replicas int
	// Schedule tunes the scheduler (lease TTL, grace, run timeout,
	// retries). The gateway sets its JetStream, Prefix, Replicas,
	// Sessions, DLQ, Instance and Logger.
	Schedule schedule.Config
	// Disabled turns schedules and the /v1/dlq routes off.
	Disabled bool
}

// DefaultFollowPoll is how often a scheduled run reads its session's
// history when no event woke it: a safety net for events a NATS
// subscription dropped.
const DefaultFollowPoll = 5 * time.Second

// Audit actions of schedules and dead letters.
const (
	actScheduleCreated = "schedule_created"
	actScheduleDeleted = "schedule_deleted"
	actSchedulePaused  = "schedule_paused"
	actScheduleResumed = "schedule_resumed"
	actScheduleRun     = "schedule_run"
	actDeadLetterRetry = "dead_letter_retried"
	actDeadLetterDrop  = "dead_letter_dropped"
)

// automation is the running scheduler and dead-letter queue of a Server,
// and the handlers of their routes. The scheduler drives sessions through
// schedule.Sessions (scheduleSessions: the same checks as any client of
// the gateway), not through the server's own methods; the server only
// mounts the routes and starts and closes it.
type automation struct {
	s     *Server // the front door: authentication, errors, audit
	dlq   *dlq.Queue
	sched *schedule.Scheduler

	retries sync.WaitGroup // retries by hand under way

	mu       sync.Mutex
	retrying map[string]bool // guarded by mu: entries being retried here
}

// bucketTimeout bounds opening (creating, if needed) a KV bucket at start.
const bucketTimeout = time.Minute

// mountAutomation opens the dead-letter queue and the scheduler and
// registers their routes on mux; nil (and no routes) when cfg turns
// automation off. The scheduler starts with start.
func mountAutomation(s *Server, mux *http.ServeMux, cfg Config) (*automation, error) {
	ac := cfg.Automation
	if ac.Disabled {
		return nil, nil
	}
	js, err := jetstream.New(s.nc)
	if err != nil {
		return nil, fmt.Errorf("gateway: automation: %w", err)
	}
	// Creating replicated buckets waits for the cluster to elect their
	// leaders: seconds on a loaded cluster, far more than one request.
	ctx, cancel := context.WithTimeout(context.Background(), bucketTimeout)
	defer cancel()
	a := &automation{s: s, dlq: ac.DLQ, retrying: make(map[string]bool)}
	if a.dlq == nil && cfg.Tasks != nil {
		a.dlq = cfg.Tasks.Service.DLQ
	}
	prefix := prefixOf(s.subj)
	if a.dlq == nil {
		a.dlq, err = retryStartup(ctx, s.log, "open the dead-letter bucket", func(ctx context.Context) (*dlq.Queue, error) {
			return dlq.Open(ctx, dlq.Config{JetStream: js, Bucket: prefix + "_dlq", Replicas: ac.Replicas,
				Logger: s.log.With("worker", "dlq")})
		})
		if err != nil {
			return nil, fmt.Errorf("gateway: %w", err)
		}
	}
	sc := ac.Schedule
	sc.JetStream, sc.Prefix, sc.Replicas = js, prefix, ac.Replicas
	sc.Sessions, sc.DLQ, sc.Instance = scheduleSessions{s}, a.dlq, s.id
	sc.Logger = s.log.With("worker", "scheduler")
	sc.Audit = s.record
	a.sched, err = retryStartup(ctx, s.log, "open the schedule buckets", func(ctx context.Context) (*schedule.Scheduler, error) {
		return schedule.Open(ctx, sc)
	})
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	mux.Handle("POST /v1/schedules", s.authed(a.createSchedule))
	mux.Handle("GET /v1/schedules", s.authed(a.listSchedules))
	mux.Handle("GET /v1/schedules/{id}", s.authed(a.getSchedule))
	mux.Handle("DELETE /v1/schedules/{id}", s.authed(a.deleteSchedule))
	mux.Handle("POST /v1/schedules/{id}/pause", s.authed(a.pauseSchedule))
	mux.Handle("POST /v1/schedules/{id}/resume", s.authed(a.resumeSchedule))
	mux.Handle("POST /v1/schedules/{id}/run", s.authed(a.runSchedule))
	mux.Handle("GET /v1/dlq", s.authed(a.listDeadLetters))
	mux.Handle("POST /v1/dlq/{id}/retry", s.authed(a.retryDeadLetter))
	mux.Handle("DELETE /v1/dlq/{id}", s.authed(a.dropDeadLetter))
	return a, nil
}

// prefixOf is the prefix of subj's subjects and of the gateway's buckets.
func prefixOf(subj session.Subjects) string {
	if subj.Prefix == "" {
		return session.DefaultPrefix
	}
	return subj.Prefix
}

// start starts the scheduler; a nil a does nothing.
func (a *automation) start() {
	if a != nil {
		a.sched.Start()
	}
}

// close stops the scheduler (runs under way become dead letters) and waits
// for retries by hand, which end with the server's context; a nil a does
// nothing.
func (a *automation) close() {
	if a == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), DefaultChannelsDrain)
	defer cancel()
	if err := a.sched.Close(ctx); err != nil {
		a.s.log.Warn("close scheduler", "err", err)
	}
	a.retries.Wait()
}

// createSchedule serves POST /v1/schedules {"cron","tz"?,"session"? |
// "new","title"?,"prompt","missed"?} → 201 Schedule. Scheduling into a
// session needs the driver role on it; the schedule runs as its creator.
func (a *automation) createSchedule(w http.ResponseWriter, r *http.Request, p session.Principal) {
	s := a.s
	var spec schedule.Spec
	if err := decodeBody(w, r, &spec, false); err != nil {
		s.fail(w, r, err)
		return
	}
	sc, err := a.sched.Create(r.Context(), p, spec)
	if err != nil {
		if errors.Is(err, session.ErrForbidden) || errors.Is(err, session.ErrNotFound) {
			s.auditDenied(r.Context(), remoteOf(r), p, spec.Session, "schedule prompts", nil, err)
		}
		s.fail(w, r, err)
		return
	}
	e := entry(p, remoteOf(r), actScheduleCreated)
	e.Session, e.Target, e.Detail = string(sc.Session), sc.ID, fmt.Sprintf("cron %q tz %s missed %s", sc.Cron, sc.TZ, sc.Missed)
	if r := sc.Retry; r != nil {
		e.Detail += fmt.Sprintf(", retry %d attempts", r.Attempts)
	}
	s.record(r.Context(), e)
	w.Header().Set("Location", "/v1/schedules/"+sc.ID)
	writeJSON(w, http.StatusCreated, sc)
}

// listSchedules serves GET /v1/schedules → {"schedules":[Schedule…]}: the
// caller's, or all of the tenant's for a tenant admin.
func (a *automation) listSchedules(w http.ResponseWriter, r *http.Request, p session.Principal) {
	s := a.s
	l, err := a.sched.List(r.Context(), p)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.ScheduleList{Schedules: l})
}

// getSchedule serves GET /v1/schedules/{id} → Schedule.
func (a *automation) getSchedule(w http.ResponseWriter, r *http.Request, p session.Principal) {
	s := a.s
	sc, err := a.sched.Get(r.Context(), p, r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, sc)
}

// deleteSchedule serves DELETE /v1/schedules/{id} → 204.
func (a *automation) deleteSchedule(w http.ResponseWriter, r *http.Request, p session.Principal) {
	s := a.s
	id := r.PathValue("id")
	if err := a.sched.Delete(r.Context(), p, id); err != nil {
		s.fail(w, r, err)
		return
	}
	e := entry(p, remoteOf(r), actScheduleDeleted)
	e.Target = id
	s.record(r.Context(), e)
	w.WriteHeader(http.StatusNoContent)
}

// pauseSchedule serves POST /v1/schedules/{id}/pause → 200 Schedule.
func (a *automation) pauseSchedule(w http.ResponseWriter, r *http.Request, p session.Principal) {
	a.setPaused(w, r, p, true)
}

// resumeSchedule serves POST /v1/schedules/{id}/resume → 200 Schedule; the
// ticks that passed while it was paused are not run.
func (a *automation) resumeSchedule(w http.ResponseWriter, r *http.Request, p session.Principal) {
	a.setPaused(w, r, p, false)
}

func (a *automation) setPaused(w http.ResponseWriter, r *http.Request, p session.Principal, paused bool) {
	s := a.s
	id := r.PathValue("id")
	sc, err := a.sched.SetPaused(r.Context(), p, id, paused)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	act := actScheduleResumed
	if paused {
		act = actSchedulePaused
	}
	e := entry(p, remoteOf(r), act)
	e.Target = id
	s.record(r.Context(), e)
	writeJSON(w, http.StatusOK, sc)
}

// runSchedule serves POST /v1/schedules/{id}/run → 202 Schedule: the
// schedule runs once now, as its creator, outside its timing; its
// last_run tells how it went.
func (a *automation) runSchedule(w http.ResponseWriter, r *http.Request, p session.Principal) {
	s := a.s
	id := r.PathValue("id")
	sc, err := a.sched.RunNow(r.Context(), p, id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	e := entry(p, remoteOf(r), actScheduleRun)
	e.Session, e.Target = string(sc.Session), id
	s.record(r.Context(), e)
	writeJSON(w, http.StatusAccepted, sc)
}

// seesDeadLetter reports whether p may see (and retry, and drop) e: the
// user the run acted for, or an admin of its tenant.
func seesDeadLetter(p session.Principal, e dlq.Entry) bool {
	return p.User != "" && e.Tenant == p.Tenant && (e.User == p.User || p.Admin)
}

// deadLetter returns entry id if p may see it.
func (a *automation) deadLetter(ctx context.Context, p session.Principal, id string) (dlq.Entry, error) {
	e, err := a.dlq.Get(ctx, id)
	if err != nil {
		if !errors.Is(err, session.ErrNotFound) {
			err = withCause(session.Errorf(session.CodeUnavailable, "dead letters are unavailable: try again shortly"), err)
		}
		return dlq.Entry{}, err
	}
	if !seesDeadLetter(p, e) {
		return dlq.Entry{}, session.Errorf(session.CodeNotFound, "there is no dead letter %s: list them with `atrium dlq ls`", id)
	}
	return e, nil
}

// listDeadLetters serves GET /v1/dlq → {"dead_letters":[Entry…]}, newest
// first: a tenant admin sees the tenant's, anyone else their own.
func (a *automation) listDeadLetters(w http.ResponseWriter, r *http.Request, p session.Principal) {
	s := a.s
	all, err := a.dlq.List(r.Context(), p.Tenant)
	if err != nil {
		s.fail(w, r, withCause(session.Errorf(session.CodeUnavailable, "dead letters are unavailable: try again shortly"), err))
		return
	}
	out := []dlq.Entry{}
	for _, e := range all {
		if seesDeadLetter(p, e) {
			out = append(out, e)
		}
	}
	writeJSON(w, http.StatusOK, api.DeadLetterList{DeadLetters: out})
}

// retryDeadLetter serves POST /v1/dlq/{id}/retry → 202 {"id","status":
// "retrying"}: the run starts again in the background, as the user it
// acted for; on success the entry goes away, on failure it stays with the
// new reason (GET /v1/dlq shows which).
func (a *automation) retryDeadLetter(w http.ResponseWriter, r *http.Request, p session.Principal) {
	s := a.s
	id := r.PathValue("id")
	e, err := a.deadLetter(r.Context(), p, id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if !a.dlq.CanRetry(e.Kind) {
		s.fail(w, r, session.Errorf(session.CodeBadRequest,
			"dead letters of kind %q cannot be retried by this server (is that feature turned on?): drop it with `atrium dlq drop %s`", e.Kind, id))
		return
	}
	a.mu.Lock()
	if a.retrying[id] {
		a.mu.Unlock()
		s.fail(w, r, session.Errorf(session.CodeConflict, "dead letter %s is being retried already: see `atrium dlq ls`", id))
		return
	}
	s.mu.Lock()
	closing := s.closing
	if !closing {
		a.retries.Add(1)
		a.retrying[id] = true
	}
	s.mu.Unlock()
	a.mu.Unlock()
	if closing {
		s.fail(w, r, session.Errorf(session.CodeUnavailable, "the gateway is shutting down: retry through another one"))
		return
	}
	go func() { // owned: a.retries, waited for by closeAutomation.
		defer a.retries.Done()
		defer func() {
			a.mu.Lock()
			delete(a.retrying, id)
			a.mu.Unlock()
		}()
		if err := a.dlq.Retry(s.ctx, id); err != nil {
			s.log.Info("dead letter retried and failed again", "id", id, "kind", e.Kind, "err", err)
		}
	}()
	le := entry(p, remoteOf(r), actDeadLetterRetry)
	le.Target, le.Detail = id, e.Kind+" "+e.Ref
	s.record(r.Context(), le)
	writeJSON(w, http.StatusAccepted, struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	}{id, "retrying"})
}

// dropDeadLetter serves DELETE /v1/dlq/{id} → 204.
func (a *automation) dropDeadLetter(w http.ResponseWriter, r *http.Request, p session.Principal) {
	s := a.s
	id := r.PathValue("id")
	e, err := a.deadLetter(r.Context(), p, id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if err := a.dlq.Delete(r.Context(), id); err != nil {
		if !errors.Is(err, session.ErrNotFound) && !errors.Is(err, session.ErrConflict) {
			err = withCause(session.Errorf(session.CodeUnavailable, "dead letters are unavailable: try again shortly"), err)
		}
		s.fail(w, r, err)
		return
	}
	le := entry(p, remoteOf(r), actDeadLetterDrop)
	le.Target, le.Detail = id, e.Kind+" "+e.Ref
	s.record(r.Context(), le)
	w.WriteHeader(http.StatusNoContent)
}

// scheduleSessions implements schedule.Sessions with the gateway's own
// checks, as chatSessions does for chat channels.
type scheduleSessions struct{ s *Server }

var _ schedule.Sessions = scheduleSessions{}

func (c scheduleSessions) Authorize(ctx context.Context, p session.Principal, id session.ID) error {
	a, err := c.s.check(ctx, p, id, session.ActDrive)
	if err != nil {
		return err
	}
	return a.deny
}

func (c scheduleSessions) Create(ctx context.Context, p session.Principal, title string) (session.ID, error) {
	sess, err := chatSessions(c).Create(ctx, p, title)
	return sess.ID, err
}

// Run prompts id as p and reads the session's history after the prompt
// until the turn it started finishes. The history, not the live
// subscription, is what it reads: events only wake it, so a dropped one
// costs at most DefaultFollowPoll.
func (c scheduleSessions) Run(ctx context.Context, p session.Principal, id session.ID, text string) (schedule.Outcome, error) {
	s := c.s
	wake := make(chan struct{}, 1)
	sub, err := s.nc.Subscribe(s.subj.Events(id), func(*nats.Msg) {
		select {
		case wake <- struct{}{}:
		default:
		}
	})
	if err != nil {
		return schedule.Outcome{}, natsError(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	seq, err := chatSessions(c).Prompt(ctx, p, id, text, "sched_"+randomToken(8))
	if err != nil {
		return schedule.Outcome{}, err
	}
	out := schedule.Outcome{Seq: seq}
	poll := time.NewTicker(DefaultFollowPoll)
	defer poll.Stop()
	after := seq
	for {
		evs, more, err := chatSessions(c).History(ctx, p, id, after, DefaultEventsLimit)
		if err != nil {
			return out, err
		}
		for _, raw := range evs {
			var ev session.Event
			if err := json.Unmarshal(raw, &ev); err != nil {
				return out, fmt.Errorf("decode event after %d of session %s: %w", after, id, err)
			}
			after = ev.Seq
			if done := follow(&out, seq, ev); done {
				return out, nil
			}
		}
		if more {
			continue
		}
		select {
		case <-ctx.Done():
			return out, ctx.Err()
		case <-wake:
		case <-poll.C:
		}
	}
}

// follow updates out with ev, an event after the prompt at seq, and reports
// whether the prompt's turn has finished.
func follow(out *schedule.Outcome, seq session.Seq, ev session.Event) bool {
	switch ev.Kind {
	case session.KindTurnStarted:
		var d session.TurnStartedData
		if json.Unmarshal(ev.Data, &d) == nil && d.PromptSeq == seq {
			out.Turn = d.Turn
		}
	case session.KindError:
		var d session.ErrorData
		if out.Turn != 0 && json.Unmarshal(ev.Data, &d) == nil {
			out.Reason = d.Message
			if d.Code == session.CodeUnavailable {
				out.Unavailable = true
			}
		}
	case session.KindTurnFinished:
		var d session.TurnFinishedData
		if out.Turn != 0 && json.Unmarshal(ev.Data, &d) == nil && d.Turn == out.Turn {
			out.Status, out.ExitCode = d.Status, d.ExitCode
			return true
		}
	}
	return false
}
