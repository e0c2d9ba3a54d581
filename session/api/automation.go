package api

import (
	"encoding/json"
	"time"

	"github.com/atriumhq/atrium/session"
)

// ScheduleSpec is the body of POST /v1/schedules (docs/automation.md):
// when, where and what to prompt.
type ScheduleSpec struct {
	// Cron is a standard five-field cron expression ("0 9 * * 1-5") or a
	// descriptor (@hourly, @daily, @weekly, @every 2h …).
	Cron string `json:"cron"`
	// TZ is the IANA time zone the cron expression is read in; default UTC.
	TZ string `json:"tz,omitempty"`
	// Session is the session prompted at each tick; or, with New, a new
	// session titled Title (plus the tick's date) is created at each tick.
	Session session.ID `json:"session,omitempty"`
	New     bool       `json:"new,omitempty"`
	Title   string     `json:"title,omitempty"`
	// Prompt is the text sent at each tick.
	Prompt string `json:"prompt"`
	// Missed is "skip" (default) or "run_once".
	Missed string `json:"missed,omitempty"`
	// Retry tries a run again when its turn fails or times out (retry.go).
	Retry *RetryPolicy `json:"retry,omitempty"`
}

// Schedule is a schedule as /v1/schedules shows it.
type Schedule struct {
	ID      string `json:"id"`
	Tenant  string `json:"tenant,omitempty"`
	Creator string `json:"creator"`
	ScheduleSpec
	Paused    bool      `json:"paused"`
	CreatedAt time.Time `json:"created_at"`
	// LastTick is the latest tick claimed, fired or skipped; ticks up to it
	// are done. Creating or resuming a schedule sets it to the time then.
	LastTick time.Time `json:"last_tick"`
	// NextRun is the schedule's next tick (not stored; nil while paused).
	NextRun *time.Time `json:"next_run,omitempty"`
	// LastRun is the latest run fired, if any.
	LastRun *ScheduleRun `json:"last_run,omitempty"`
}

// ScheduleRun is what happened to one firing of a schedule.
type ScheduleRun struct {
	Tick time.Time `json:"tick"`
	// Missed counts the ticks this run stands for beyond Tick (run_once).
	Missed  int        `json:"missed,omitempty"`
	Session session.ID `json:"session,omitempty"`
	// Seq is the prompt's seq in Session; Turn the turn it started.
	Seq  session.Seq `json:"seq,omitempty"`
	Turn int64       `json:"turn,omitempty"`
	// Status is running, a turn status (ok, failed, cancelled, timeout) or
	// dead_letter.
	Status     string    `json:"status"`
	ExitCode   *int      `json:"exit_code,omitempty"`
	Error      string    `json:"error,omitempty"`
	DeadLetter string    `json:"dead_letter,omitempty"`
	Attempts   int       `json:"attempts,omitempty"`
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
}

// ScheduleList answers GET /v1/schedules.
type ScheduleList struct {
	Schedules []Schedule `json:"schedules"`
}

// DeadLetter is a background run that failed for good (GET /v1/dlq).
type DeadLetter struct {
	ID     string `json:"id"`     // assigned when stored ("dl_…")
	Tenant string `json:"tenant"` // the tenant of User
	User   string `json:"user"`   // who the run acts for
	Kind   string `json:"kind"`   // "task", "schedule", …
	Ref    string `json:"ref"`    // task id / schedule id
	// Reason is the last error, human readable, with no secrets.
	Reason string `json:"reason"`
	// Permanent is true if the run failed for good; false if its retries
	// were exhausted.
	Permanent bool `json:"permanent"`
	// Attempts counts the tries made, by hand retries included.
	Attempts int `json:"attempts"`
	// Payload is what a retry needs (kind-specific).
	Payload  json.RawMessage `json:"payload"`
	FailedAt time.Time       `json:"failed_at"`
}

// DeadLetterList answers GET /v1/dlq.
type DeadLetterList struct {
	DeadLetters []DeadLetter `json:"dead_letters"`
}

// TaskRequest is the body of POST /v1/tasks (docs/automation.md).
type TaskRequest struct {
	Repo    string          `json:"repo"`
	Base    string          `json:"base"`
	Prompt  string          `json:"prompt"`
	Title   string          `json:"title,omitempty"`
	Harness session.Harness `json:"harness,omitzero"`
	// Agent is short for Harness {"agent":NAME}, as in POST /v1/sessions.
	Agent       string `json:"agent,omitempty"`
	CallbackURL string `json:"callback_url,omitempty"`
	// Retry tries the task again when its turn fails or times out
	// (retry.go).
	Retry *RetryPolicy `json:"retry,omitempty"`
}

// StartedTask answers POST /v1/tasks.
type StartedTask struct {
	Task    string     `json:"task"`
	Session session.ID `json:"session"`
	Branch  string     `json:"branch"`
}

// TaskList answers GET /v1/tasks: the caller's repository tasks (a tenant
// admin's: the tenant's), newest first.
type TaskList struct {
	Tasks []Task `json:"tasks"`
}

// Task is a repository task as GET /v1/tasks/{id} shows it. Status is
// running, pr_opened, nothing_to_do or failed.
type Task struct {
	ID      string     `json:"id"`
	User    string     `json:"user"`
	Repo    string     `json:"repo"`
	Base    string     `json:"base"`
	Title   string     `json:"title"`
	Session session.ID `json:"session"`
	Branch  string     `json:"branch"`
	// Agent names the ACP agent the task's session runs; empty for a
	// harness run inside the task wrapper.
	Agent       string `json:"agent,omitempty"`
	Status      string `json:"status"`
	Commit      string `json:"commit,omitempty"`
	PRURL       string `json:"pr_url,omitempty"`
	Error       string `json:"error,omitempty"`
	DeadLetter  string `json:"dead_letter,omitempty"`
	CallbackURL string `json:"callback_url,omitempty"`
	// Retry is the task's retry policy, if it has one; Attempts counts
	// the tries made so far.
	Retry     *RetryPolicy `json:"retry,omitempty"`
	Attempts  int          `json:"attempts,omitempty"`
	CreatedAt time.Time    `json:"created_at"`
	UpdatedAt time.Time    `json:"updated_at"`
}
