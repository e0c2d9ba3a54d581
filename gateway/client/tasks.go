package client

import (
	"context"
	"errors"
	"net/http"
	"net/url"

	"github.com/atriumhq/atrium/session/api"
)

// The wire shapes of repository tasks (declared in session/api).
type (
	// TaskRequest is the body of POST /v1/tasks (docs/automation.md).
	TaskRequest = api.TaskRequest
	// StartedTask is the answer to POST /v1/tasks.
	StartedTask = api.StartedTask
	// Task is a repository task as GET /v1/tasks/{id} shows it.
	Task = api.Task
)

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

// ListTasks returns the caller's repository tasks (a tenant admin's: the
// tenant's), newest first; a non-empty sess keeps only that session's.
func (c *Client) ListTasks(ctx context.Context, sess string) ([]Task, error) {
	path := "/v1/tasks"
	if sess != "" {
		path += "?session=" + url.QueryEscape(sess)
	}
	var out api.TaskList
	if err := c.do(ctx, http.MethodGet, path, nil, &out); err != nil {
		return nil, err
	}
	return out.Tasks, nil
}
