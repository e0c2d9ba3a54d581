package gateway

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/atriumhq/atrium/gateway/audit"
	"github.com/atriumhq/atrium/gateway/task"
	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/session/api"
)

// Tasks configures repository tasks (docs/automation.md): POST /v1/tasks
// and GET /v1/tasks/{id}. Service needs its DLQ and Forges; the gateway
// sets its NATS, Subjects, Sessions and Logger.
type Tasks struct {
	Service task.Config
}

// Audit action of a task started.
const ActTaskStarted = "task_started"

// mountTasks starts the task service and registers its routes; nil cfg
// mounts nothing. The service is closed by closeTasks.
func (s *Server) mountTasks(mux *http.ServeMux, cfg *Tasks) error {
	if cfg == nil {
		return nil
	}
	tc := cfg.Service
	tc.NATS, tc.Subjects, tc.Sessions = s.nc, s.subj, taskSessions{chatSessions{s}}
	tc.Replicas = cmp.Or(tc.Replicas, s.replicas)
	tc.Logger = s.log.With("component", "tasks")
	svc, err := task.New(context.Background(), tc)
	if err != nil {
		return fmt.Errorf("gateway: tasks: %w", err)
	}
	s.tasks = svc
	mux.Handle("POST /v1/tasks", s.authed(s.startTask))
	mux.Handle("GET /v1/tasks/{id}", s.authed(s.getTask))
	return nil
}

// closeTasks stops running tasks (see task.Service.Close).
func (s *Server) closeTasks() {
	if s.tasks == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), DefaultChannelsDrain)
	defer cancel()
	if err := s.tasks.Close(ctx); err != nil {
		s.log.Warn("close tasks", "err", err)
	}
}

// startTask serves POST /v1/tasks {"repo","base","prompt","title"?,
// "harness"?,"callback_url"?} → 202 {"task","session"}. The caller's
// permission on the repository is checked with its forge first: without
// write access the answer is 403 and no session exists.
func (s *Server) startTask(w http.ResponseWriter, r *http.Request, p session.Principal) {
	var req task.Request
	if err := decodeBody(w, r, &req, false); err != nil {
		s.fail(w, r, err)
		return
	}
	t, err := s.tasks.Start(r.Context(), p, req)
	if err != nil {
		var se *session.Error
		if errors.As(err, &se) && se.Code == session.CodeForbidden {
			s.auditDenied(r.Context(), remoteOf(r), p, "", "start task on "+req.Repo, nil, err)
		}
		s.fail(w, r, err)
		return
	}
	e := entry(p, remoteOf(r), ActTaskStarted)
	e.Session, e.Target, e.Detail = string(t.Session), t.ID, "repo "+t.Repo+", base "+t.Base
	s.record(r.Context(), e)
	w.Header().Set("Location", "/v1/tasks/"+t.ID)
	writeJSON(w, http.StatusAccepted, api.StartedTask{Task: t.ID, Session: t.Session, Branch: t.Branch})
}

// getTask serves GET /v1/tasks/{id} → the task (its user, or a tenant
// admin).
func (s *Server) getTask(w http.ResponseWriter, r *http.Request, p session.Principal) {
	t, err := s.tasks.Get(r.Context(), p, r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, t.View())
}

// taskSessions implements task.Sessions with the same checks as REST.
type taskSessions struct{ chatSessions }

var _ task.Sessions = taskSessions{}

func (c taskSessions) Create(ctx context.Context, p session.Principal, title string, h session.Harness, egress []string) (session.Session, error) {
	s := c.s
	if err := h.Validate(); err != nil {
		return session.Session{}, err
	}
	if err := checkEgressShape(egress); err != nil {
		return session.Session{}, err
	}
	id := session.NewID()
	reply, err := s.place(ctx, p, session.PlaceRequest{Op: session.PlaceCreate, Session: id, Title: title, Harness: h, Egress: egress})
	if err != nil {
		return session.Session{}, err
	}
	sess := reply.Session
	if sess == nil {
		info, err := s.call(ctx, p, id, session.Command{Op: session.OpInfo}, true)
		if err == nil && info.Session == nil {
			err = session.Errorf(session.CodeInternal, "info reply of session %s has no session", id)
		}
		if err != nil {
			return session.Session{}, err
		}
		sess = info.Session
	}
	s.refreshCatalog(ctx, sess.ID)
	e := entry(p, "", audit.ActSessionCreated)
	e.Session, e.Detail = string(sess.ID), "repository task; egress "+truncateDetail(sess.Egress)
	s.record(ctx, e)
	return *sess, nil
}

func (c taskSessions) SetSecret(ctx context.Context, p session.Principal, id session.ID, name, value string) error {
	_, err := c.do(ctx, p, id, session.ActManage, session.Command{Op: session.OpSecretSet, Name: name, Value: value})
	return err
}

func (c taskSessions) DeleteSecret(ctx context.Context, p session.Principal, id session.ID, name string) error {
	_, err := c.do(ctx, p, id, session.ActManage, session.Command{Op: session.OpSecretDelete, Name: name})
	return err
}

func (c taskSessions) PROpened(ctx context.Context, p session.Principal, id session.ID, pr session.PROpenedData) error {
	_, err := c.do(ctx, p, id, session.ActDrive, session.Command{Op: session.OpPROpened, PR: &pr})
	return err
}

// History is chatSessions's; listed here for task.Sessions.
func (c taskSessions) History(ctx context.Context, p session.Principal, id session.ID, after session.Seq, limit int) ([]json.RawMessage, bool, error) {
	return c.chatSessions.History(ctx, p, id, after, limit)
}

// tasker is the type of Server.tasks.
type tasker = task.Service
