// Package schedule runs prompts on a cron schedule, with nobody connected.
//
// Schedules are kept in NATS KV bucket "<prefix>_schedules". Every gateway
// runs a Scheduler, but only one at a time fires ticks: the leader, which
// holds key "leader" of bucket "<prefix>_scheduler" (created with Create,
// renewed with Update at its revision, expiring after the bucket's TTL, like
// the session leases of DESIGN §5). Leadership alone is not trusted to make a
// tick fire once: before firing, the leader claims the tick by moving the
// schedule's LastTick forward with an Update at the revision it read, so two
// leaders that overlap during a failover cannot both fire it.
//
// A run prompts a session as the schedule's creator, through Sessions (which
// the gateway implements with its own role checks), and follows the turn to
// its end. Transient failures are retried with a dlq.Backoff; a run that
// fails for good, or runs out of attempts, becomes a dead letter of kind
// "schedule" that `atrium dlq retry` runs again.
package schedule

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/session/api"
	"github.com/robfig/cron/v3"
)

// Missed-tick policies (Spec.Missed): what happens to ticks that passed while
// no gateway was running (or all were partitioned from NATS).
const (
	// MissedSkip (the default) drops missed ticks; the schedule fires again
	// at its next tick.
	MissedSkip = "skip"
	// MissedRunOnce runs once for all the ticks missed, as soon as a
	// gateway is back.
	MissedRunOnce = "run_once"
)

// Run statuses (Run.Status) besides the session.TurnStatus values.
const (
	// StatusRunning: the run is under way.
	StatusRunning = "running"
	// StatusDeadLetter: the run failed for good or ran out of attempts;
	// Run.DeadLetter names the entry.
	StatusDeadLetter = "dead_letter"
)

// MinInterval is the shortest time allowed between two ticks.
const MinInterval = time.Minute

// KindSchedule is the dead-letter kind of failed scheduled runs.
const KindSchedule = "schedule"

// Spec is what a caller asks for: when, where and what to prompt. Missed is
// MissedSkip (default) or MissedRunOnce.
type Spec = api.ScheduleSpec

// DefaultTitle is the title of sessions of a New schedule without one.
const DefaultTitle = "Scheduled run"

// titleDate is appended to the title of each session a New schedule creates.
const titleDate = " 2006-01-02 15:04"

// Schedule is a stored schedule, as callers see it (its Spec is the
// embedded ScheduleSpec).
type Schedule = api.Schedule

// Run is what happened to one firing of a schedule. Status is
// StatusRunning, a turn status (ok, failed, cancelled, timeout) or
// StatusDeadLetter.
type Run = api.ScheduleRun

// record is a schedule as stored: with the principal its runs act as.
type record struct {
	Schedule
	// Principal is the creator as the schedule's runs act: user, tenant
	// and credential cap, never tenant admin rights (a scheduled run
	// acts with the creator's own role on the session, checked again at
	// each run).
	Principal session.Principal `json:"principal"`
}

// parser reads Spec.Cron: five fields or a descriptor; time zones come from
// Spec.TZ, not from a TZ= prefix.
var parser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// timing is a parsed Cron and TZ.
type timing struct {
	sched cron.Schedule
	loc   *time.Location
}

// next returns the first tick after t, in UTC; zero if there is none.
func (tm timing) next(t time.Time) time.Time {
	n := tm.sched.Next(t.In(tm.loc))
	if n.IsZero() {
		return n
	}
	return n.UTC()
}

// parseTiming parses cron and tz, with errors a user can act on.
func parseTiming(expr, tz string) (timing, error) {
	expr = strings.TrimSpace(expr)
	if expr == "" {
		return timing{}, session.Errorf(session.CodeBadRequest, `give a cron expression, such as "0 9 * * 1-5" (09:00 on weekdays)`)
	}
	if strings.HasPrefix(expr, "TZ=") || strings.HasPrefix(expr, "CRON_TZ=") {
		return timing{}, session.Errorf(session.CodeBadRequest, "give the time zone separately (--tz or \"tz\"), not in the cron expression")
	}
	if tz == "" {
		tz = "UTC"
	}
	if tz == "Local" {
		return timing{}, session.Errorf(session.CodeBadRequest, `time zone "Local" depends on the server: name one, such as Europe/Paris or UTC`)
	}
	loc, err := time.LoadLocation(tz)
	if err != nil {
		return timing{}, session.Errorf(session.CodeBadRequest, "unknown time zone %q: use an IANA name such as Europe/Paris, America/New_York or UTC", tz)
	}
	s, err := parser.Parse(expr)
	if err != nil {
		return timing{}, session.Errorf(session.CodeBadRequest,
			"cron expression %q: %v; it has five fields (minute hour day-of-month month day-of-week), such as \"0 9 * * 1-5\", or is a descriptor such as @daily", expr, err)
	}
	tm := timing{sched: s, loc: loc}
	// The gap between ticks varies (days of months, DST); sampling a few
	// catches expressions that fire more than once a minute (@every 10s)
	// and those that never fire (30 February).
	t := tm.next(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	if t.IsZero() {
		return timing{}, session.Errorf(session.CodeBadRequest, "cron expression %q never fires", expr)
	}
	for range 4 {
		n := tm.next(t)
		if n.IsZero() {
			break
		}
		if n.Sub(t) < MinInterval {
			return timing{}, session.Errorf(session.CodeBadRequest, "cron expression %q fires more often than once a minute", expr)
		}
		t = n
	}
	return tm, nil
}

// validateSpec checks sp and fills in its defaults.
func validateSpec(sp *Spec) (timing, error) {
	tm, err := parseTiming(sp.Cron, sp.TZ)
	if err != nil {
		return timing{}, err
	}
	sp.Cron = strings.TrimSpace(sp.Cron)
	if sp.TZ == "" {
		sp.TZ = "UTC"
	}
	switch {
	case sp.New && sp.Session != "":
		return timing{}, session.Errorf(session.CodeBadRequest, "give either a session or new, not both")
	case !sp.New && sp.Session == "":
		return timing{}, session.Errorf(session.CodeBadRequest, "give the session to prompt (--session ID), or ask for a new session at each run (--new --title T)")
	case sp.Session != "":
		if err := sp.Session.Validate(); err != nil {
			return timing{}, err
		}
		if sp.Title != "" {
			return timing{}, session.Errorf(session.CodeBadRequest, "a title is for new sessions: give it with --new, or leave it out")
		}
	case sp.New:
		sp.Title = strings.TrimSpace(sp.Title)
		if sp.Title == "" {
			sp.Title = DefaultTitle
		}
		if max := session.MaxTitleBytes - len(titleDate); len(sp.Title) > max {
			return timing{}, session.Errorf(session.CodeBadRequest, "title is longer than %d bytes", max)
		}
	}
	switch {
	case strings.TrimSpace(sp.Prompt) == "":
		return timing{}, session.Errorf(session.CodeBadRequest, "give the prompt to send at each tick (--prompt)")
	case len(sp.Prompt) > session.MaxTextBytes:
		return timing{}, session.Errorf(session.CodeBadRequest, "prompt is longer than %d bytes", session.MaxTextBytes)
	case !utf8.ValidString(sp.Prompt) || !utf8.ValidString(sp.Title):
		return timing{}, session.Errorf(session.CodeBadRequest, "prompt and title must be UTF-8")
	}
	switch sp.Missed {
	case "":
		sp.Missed = MissedSkip
	case MissedSkip, MissedRunOnce:
	default:
		return timing{}, session.Errorf(session.CodeBadRequest, "missed must be %s or %s, not %q", MissedSkip, MissedRunOnce, sp.Missed)
	}
	if sp.Retry != nil {
		if err := sp.Retry.Validate(); err != nil {
			return timing{}, err
		}
	}
	return tm, nil
}

// timing returns the parsed timing of a stored schedule.
func (r *record) timing() (timing, error) {
	tm, err := parseTiming(r.Cron, r.TZ)
	if err != nil {
		return timing{}, fmt.Errorf("schedule %s: %w", r.ID, err)
	}
	return tm, nil
}

// visible reports whether p may see and manage r: its creator, or an admin
// of its tenant.
func (r *record) visible(p session.Principal) bool {
	return p.User != "" && r.Tenant == p.Tenant && (r.Creator == p.User || p.Admin)
}

// view returns r as callers see it, with NextRun filled in.
func (r *record) view(now time.Time) Schedule {
	s := r.Schedule
	if !s.Paused {
		if tm, err := r.timing(); err == nil {
			if n := tm.next(later(s.LastTick, now)); !n.IsZero() {
				s.NextRun = &n
			}
		}
	}
	return s
}

// runTitle is the title of the session a New schedule creates for tick.
func (r *record) runTitle(tick time.Time) string {
	loc, err := time.LoadLocation(r.TZ)
	if err != nil {
		loc = time.UTC
	}
	return r.Title + tick.In(loc).Format(titleDate)
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// errNotFound is the answer about a schedule that does not exist or that
// the caller may not see.
func errNotFound(id string) error {
	return session.Errorf(session.CodeNotFound, "there is no schedule %q: list yours with `atrium schedule ls`", id)
}

// validID reports whether id can be a schedule's id (and a KV key).
func validID(id string) bool {
	return strings.HasPrefix(id, "sc_") && session.ID(id).Validate() == nil
}

// newID returns a fresh schedule id such as "sc_3kq7xq4m2fdh2dnbw5ad".
func newID() string {
	return "sc_" + strings.TrimPrefix(string(session.NewID()), "s_")
}

// errors of the store.
var errConflict = errors.New("schedule: changed meanwhile")
