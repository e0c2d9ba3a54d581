package client

import (
	"context"
	"errors"
	"net/http"
	"net/url"

	"github.com/atriumhq/atrium/session/api"
)

// The wire shapes of schedules and dead letters (declared in session/api).
type (
	// ScheduleSpec is the body of POST /v1/schedules (docs/automation.md):
	// either Session, or New with an optional Title.
	ScheduleSpec = api.ScheduleSpec
	// Schedule is a schedule as /v1/schedules shows it.
	Schedule = api.Schedule
	// ScheduleRun is how a schedule's latest run went.
	ScheduleRun = api.ScheduleRun
	// DeadLetter is a background run that failed for good (GET /v1/dlq).
	DeadLetter = api.DeadLetter
)

// CreateSchedule creates a schedule that prompts as the caller.
func (c *Client) CreateSchedule(ctx context.Context, spec ScheduleSpec) (Schedule, error) {
	var out Schedule
	err := c.do(ctx, http.MethodPost, "/v1/schedules", spec, &out)
	return out, err
}

// ListSchedules returns the caller's schedules (a tenant admin's: the
// tenant's).
func (c *Client) ListSchedules(ctx context.Context) ([]Schedule, error) {
	var out api.ScheduleList
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
	var out api.DeadLetterList
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
