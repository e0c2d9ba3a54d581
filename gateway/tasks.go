package gateway

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"

	"github.com/atriumhq/atrium/gateway/audit"
	"github.com/atriumhq/atrium/gateway/task"
	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/session/api"
	"github.com/nats-io/nats.go"
)

// Tasks configures repository tasks (docs/automation.md): POST /v1/tasks
// and GET /v1/tasks/{id}. Service needs its DLQ and Forges; the gateway
// sets its NATS, Subjects, Sessions and Logger.
type Tasks struct {
	Service task.Config
}

// Audit action of a task started.
const ActTaskStarted = "task_started"

// taskRoutes are the handlers of the task routes. The task service drives
// sessions through task.Sessions (taskSessions: the same checks as any
// client of the gateway), not through the server's own methods.
type taskRoutes struct {
	s   *Server // the front door: authentication, errors, audit
	svc *task.Service
}

// mountTasks starts the task service and registers its routes; nil cfg
// mounts nothing and returns nil. The service is closed by closeTasks.
func mountTasks(s *Server, mux *http.ServeMux, cfg *Tasks) (*task.Service, error) {
	if cfg == nil {
		return nil, nil
	}
	tc := cfg.Service
	tc.NATS, tc.Subjects, tc.Sessions = s.nc, s.subj, taskSessions{chatSessions{s}}
	tc.Replicas = cmp.Or(tc.Replicas, s.replicas)
	tc.Logger = s.log.With("worker", "tasks")
	tc.Audit = s.record
	svc, err := task.New(context.Background(), tc)
	if err != nil {
		return nil, fmt.Errorf("gateway: tasks: %w", err)
	}
	rt := taskRoutes{s: s, svc: svc}
	mux.Handle("POST /v1/tasks", s.authed(rt.startTask))
	mux.Handle("GET /v1/tasks", s.authed(rt.listTasks))
	mux.Handle("GET /v1/tasks/{id}", s.authed(rt.getTask))
	return svc, nil
}

// closeTasks stops running tasks (see task.Service.Close); a nil svc does
// nothing.
func closeTasks(svc *task.Service, log *slog.Logger) {
	if svc == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), DefaultChannelsDrain)
	defer cancel()
	if err := svc.Close(ctx); err != nil {
		log.Warn("close tasks", "err", err)
	}
}

// startTask serves POST /v1/tasks {"repo","base","prompt","title"?,
// "harness"?,"callback_url"?} → 202 {"task","session"}. The caller's
// permission on the repository is checked with its forge first: without
// write access the answer is 403 and no session exists.
func (rt taskRoutes) startTask(w http.ResponseWriter, r *http.Request, p session.Principal) {
	s := rt.s
	var req task.Request
	if err := decodeBody(w, r, &req, false); err != nil {
		s.fail(w, r, err)
		return
	}
	t, err := rt.svc.Start(r.Context(), p, req)
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
	if t.Agent != "" {
		e.Detail += ", agent " + t.Agent
	}
	if r := t.Retry; r != nil {
		e.Detail += fmt.Sprintf(", retry %d attempts", r.Attempts)
	}
	s.record(r.Context(), e)
	w.Header().Set("Location", "/v1/tasks/"+t.ID)
	writeJSON(w, http.StatusAccepted, api.StartedTask{Task: t.ID, Session: t.Session, Branch: t.Branch})
}

// getTask serves GET /v1/tasks/{id} → the task (its user, or a tenant
// admin).
func (rt taskRoutes) getTask(w http.ResponseWriter, r *http.Request, p session.Principal) {
	s := rt.s
	t, err := rt.svc.Get(r.Context(), p, r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, t.View())
}

// listTasks serves GET /v1/tasks[?session=ID] → {"tasks":[Task…]}: the
// caller's tasks, or all of the tenant's for a tenant admin, newest first;
// session keeps only that session's.
func (rt taskRoutes) listTasks(w http.ResponseWriter, r *http.Request, p session.Principal) {
	s := rt.s
	q := r.URL.Query()
	for k := range q {
		if k != "session" {
			s.fail(w, r, session.Errorf(session.CodeBadRequest, "unknown query parameter %q (known: session)", k))
			return
		}
	}
	sess := session.ID(q.Get("session"))
	if sess != "" {
		if err := sess.Validate(); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	l, err := rt.svc.List(r.Context(), p, sess)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	body := api.TaskList{Tasks: make([]api.Task, 0, len(l))}
	for _, t := range l {
		body.Tasks = append(body.Tasks, t.View())
	}
	writeJSON(w, http.StatusOK, body)
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

func (c taskSessions) PutArchive(ctx context.Context, p session.Principal, id session.ID, dir string, body io.Reader) error {
	reply, err := c.do(ctx, p, id, session.ActDrive, session.Command{Op: session.OpFiles,
		Files: &session.FilesRequest{Op: session.FileArchiveIn, Path: dir, Size: -1}})
	if err == nil && (reply.Files == nil || reply.Files.Stream == "") {
		err = session.Errorf(session.CodeInternal, "the node's answer to a write has no stream")
	}
	if err != nil {
		return err
	}
	return c.s.sendBody(ctx, reply.Files.Stream, body)
}

// GetArchive is the in-process GET /v1/sessions/{id}/archive: the node's
// chunk stream (files.go) copied to w; a stream that ends early is an
// error, never a short archive.
func (c taskSessions) GetArchive(ctx context.Context, p session.Principal, id session.ID, dir string, w io.Writer) error {
	s := c.s
	sub, err := s.nc.SubscribeSync(nats.NewInbox())
	if err != nil {
		return natsError(err)
	}
	defer sub.Unsubscribe()
	reply, err := c.do(ctx, p, id, session.ActRead, session.Command{Op: session.OpFiles,
		Files: &session.FilesRequest{Op: session.FileArchiveOut, Path: dir, Stream: sub.Subject}})
	if err == nil && (reply.Files == nil || reply.Files.File == nil) {
		err = session.Errorf(session.CodeInternal, "the node's answer to a read has no file")
	}
	if err != nil {
		return err
	}
	for {
		mctx, cancel := context.WithTimeout(ctx, fileStreamTimeout)
		msg, err := sub.NextMsgWithContext(mctx)
		cancel()
		if err != nil {
			return withCause(session.Errorf(session.CodeUnavailable, "the workspace archive of session %s ended early", id), err)
		}
		if e := msg.Header.Get(session.HeaderChunkError); e != "" {
			_ = msg.Respond(nil)
			return session.Errorf(session.CodeUnavailable, "the node could not send the workspace archive of session %s: %s", id, e)
		}
		if _, err := w.Write(msg.Data); err != nil {
			_ = msg.Respond(encodeError(session.Errorf(session.CodeUnavailable, "the reader went away")))
			return fmt.Errorf("write the workspace archive of session %s: %w", id, err)
		}
		_ = msg.Respond(nil)
		if msg.Header.Get(session.HeaderChunkEnd) != "" {
			return nil
		}
	}
}

// History is chatSessions's; listed here for task.Sessions.
func (c taskSessions) History(ctx context.Context, p session.Principal, id session.ID, after session.Seq, limit int) ([]json.RawMessage, bool, error) {
	return c.chatSessions.History(ctx, p, id, after, limit)
}

// tasker is the type of Server.tasks.
type tasker = task.Service
