package client

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"time"

	"github.com/atriumhq/atrium/session"
)

// TaskRequest is the body of POST /v1/tasks (docs/automation.md).
type TaskRequest struct {
	Repo        string          `json:"repo"`
	Base        string          `json:"base"`
	Prompt      string          `json:"prompt"`
	Title       string          `json:"title,omitempty"`
	Harness     session.Harness `json:"harness,omitzero"`
	CallbackURL string          `json:"callback_url,omitempty"`
}

// StartedTask is the answer to POST /v1/tasks.
type StartedTask struct {
	Task    string     `json:"task"`
	Session session.ID `json:"session"`
	Branch  string     `json:"branch"`
}

// Task is a repository task as GET /v1/tasks/{id} shows it. Status is
// running, pr_opened, nothing_to_do or failed.
type Task struct {
	ID         string     `json:"id"`
	User       string     `json:"user"`
	Repo       string     `json:"repo"`
	Base       string     `json:"base"`
	Title      string     `json:"title"`
	Session    session.ID `json:"session"`
	Branch     string     `json:"branch"`
	Status     string     `json:"status"`
	Commit     string     `json:"commit,omitempty"`
	PRURL      string     `json:"pr_url,omitempty"`
	Error      string     `json:"error,omitempty"`
	DeadLetter string     `json:"dead_letter,omitempty"`
	CreatedAt  time.Time  `json:"created_at"`
	UpdatedAt  time.Time  `json:"updated_at"`
}

// StartTask starts a repository task: the server checks the caller's
// permission on the repository, creates the task's session and answers
// before the work is done.
func (c *Client) StartTask(ctx context.Context, req TaskRequest) (StartedTask, error) {
	var out StartedTask
	err := c.do(ctx, http.MethodPost, "/v1/tasks", req, &out)
	return out, err
}

// GetTask returns a task.
func (c *Client) GetTask(ctx context.Context, id string) (Task, error) {
	if id == "" {
		return Task{}, errors.New("task id is empty")
	}
	var out Task
	err := c.do(ctx, http.MethodGet, "/v1/tasks/"+url.PathEscape(id), nil, &out)
	return out, err
}
