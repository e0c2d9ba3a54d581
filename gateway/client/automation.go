package client

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"time"

	"github.com/atriumhq/atrium/session"
)

// ScheduleSpec is the body of POST /v1/schedules (docs/automation.md):
// either Session, or New with an optional Title.
type ScheduleSpec struct {
	Cron    string     `json:"cron"`
	TZ      string     `json:"tz,omitempty"`
	Session session.ID `json:"session,omitempty"`
	New     bool       `json:"new,omitempty"`
	Title   string     `json:"title,omitempty"`
	Prompt  string     `json:"prompt"`
	Missed  string     `json:"missed,omitempty"`
}

// Schedule is a schedule as /v1/schedules shows it.
type Schedule struct {
	ID      string `json:"id"`
	Tenant  string `json:"tenant,omitempty"`
	Creator string `json:"creator"`
	ScheduleSpec
	Paused    bool         `json:"paused"`
	CreatedAt time.Time    `json:"created_at"`
	LastTick  time.Time    `json:"last_tick"`
	NextRun   *time.Time   `json:"next_run,omitempty"`
	LastRun   *ScheduleRun `json:"last_run,omitempty"`
}

// ScheduleRun is how a schedule's latest run went. Status is running, a
// turn status (ok, failed, cancelled, timeout) or dead_letter.
type ScheduleRun struct {
	Tick       time.Time   `json:"tick"`
	Missed     int         `json:"missed,omitempty"`
	Session    session.ID  `json:"session,omitempty"`
	Seq        session.Seq `json:"seq,omitempty"`
	Turn       int64       `json:"turn,omitempty"`
	Status     string      `json:"status"`
	ExitCode   *int        `json:"exit_code,omitempty"`
	Error      string      `json:"error,omitempty"`
	DeadLetter string      `json:"dead_letter,omitempty"`
	Attempts   int         `json:"attempts,omitempty"`
	StartedAt  time.Time   `json:"started_at"`
	FinishedAt time.Time   `json:"finished_at,omitzero"`
}

// DeadLetter is a background run that failed for good (GET /v1/dlq).
type DeadLetter struct {
	ID        string          `json:"id"`
	Tenant    string          `json:"tenant"`
	User      string          `json:"user"`
	Kind      string          `json:"kind"`
	Ref       string          `json:"ref"`
	Reason    string          `json:"reason"`
	Permanent bool            `json:"permanent"`
	Attempts  int             `json:"attempts"`
	Payload   json.RawMessage `json:"payload"`
	FailedAt  time.Time       `json:"failed_at"`
}

// CreateSchedule creates a schedule that prompts as the caller.
func (c *Client) CreateSchedule(ctx context.Context, spec ScheduleSpec) (Schedule, error) {
	var out Schedule
	err := c.do(ctx, http.MethodPost, "/v1/schedules", spec, &out)
	return out, err
}

// ListSchedules returns the caller's schedules (a tenant admin's: the
// tenant's).
func (c *Client) ListSchedules(ctx context.Context) ([]Schedule, error) {
	var out struct {
		Schedules []Schedule `json:"schedules"`
	}
	err := c.do(ctx, http.MethodGet, "/v1/schedules", nil, &out)
	return out.Schedules, err
}

// GetSchedule returns schedule id.
func (c *Client) GetSchedule(ctx context.Context, id string) (Schedule, error) {
	var out Schedule
	err := c.scheduleDo(ctx, http.MethodGet, id, "", &out)
	return out, err
}

// DeleteSchedule deletes schedule id.
func (c *Client) DeleteSchedule(ctx context.Context, id string) error {
	return c.scheduleDo(ctx, http.MethodDelete, id, "", nil)
}

// PauseSchedule pauses schedule id (paused true) or resumes it.
func (c *Client) PauseSchedule(ctx context.Context, id string, paused bool) (Schedule, error) {
	op := "/resume"
	if paused {
		op = "/pause"
	}
	var out Schedule
	err := c.scheduleDo(ctx, http.MethodPost, id, op, &out)
	return out, err
}

// RunSchedule runs schedule id once now; its LastRun tells how it went.
func (c *Client) RunSchedule(ctx context.Context, id string) (Schedule, error) {
	var out Schedule
	err := c.scheduleDo(ctx, http.MethodPost, id, "/run", &out)
	return out, err
}

func (c *Client) scheduleDo(ctx context.Context, method, id, suffix string, out any) error {
	if id == "" {
		return errors.New("schedule id is empty")
	}
	return c.do(ctx, method, "/v1/schedules/"+url.PathEscape(id)+suffix, nil, out)
}

// ListDeadLetters returns the dead letters the caller may see, newest
// first: its own, or its tenant's for a tenant admin.
func (c *Client) ListDeadLetters(ctx context.Context) ([]DeadLetter, error) {
	var out struct {
		DeadLetters []DeadLetter `json:"dead_letters"`
	}
	err := c.do(ctx, http.MethodGet, "/v1/dlq", nil, &out)
	return out.DeadLetters, err
}

// RetryDeadLetter starts dead letter id's run again; the entry goes away
// when it succeeds.
func (c *Client) RetryDeadLetter(ctx context.Context, id string) error {
	if id == "" {
		return errors.New("dead letter id is empty")
	}
	return c.do(ctx, http.MethodPost, "/v1/dlq/"+url.PathEscape(id)+"/retry", nil, nil)
}

// DropDeadLetter deletes dead letter id.
func (c *Client) DropDeadLetter(ctx context.Context, id string) error {
	if id == "" {
		return errors.New("dead letter id is empty")
	}
	return c.do(ctx, http.MethodDelete, "/v1/dlq/"+url.PathEscape(id), nil, nil)
}
