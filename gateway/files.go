package gateway

// The workspace routes of DESIGN §7 "More REST": files, archives, the
// changes of a turn and forks. The node answers the commands (actor/files.go)
// and the bytes move between gateway and node as chunk streams on NATS
// inboxes (session.FileChunk): each chunk is a request its receiver answers
// once it has taken it, so a slow client slows the node down and neither
// side buffers more than a chunk.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/atriumhq/atrium/gateway/audit"
	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/session/api"
)

const (
	// fileStreamTimeout is how long a stream waits for the node's next
	// chunk or answer.
	fileStreamTimeout = 30 * time.Second
	// fileApplyTimeout bounds the wait for a write to be applied: it waits
	// for the running turn.
	fileApplyTimeout = time.Hour
	// noRespondersRetry is how long the first chunk of an upload retries
	// while the node's inbox is not yet known to this gateway's server.
	noRespondersRetry = 2 * time.Second
)

// fileRoutes registers the workspace routes.
func (s *Server) fileRoutes(mux *http.ServeMux) {
	mux.Handle("GET /v1/sessions/{id}/files", s.authed(s.listFiles))
	mux.Handle("GET /v1/sessions/{id}/files/{path...}", s.authed(s.getFile))
	mux.Handle("PUT /v1/sessions/{id}/files/{path...}", s.authed(s.putFile))
	mux.Handle("DELETE /v1/sessions/{id}/files/{path...}", s.authed(s.deleteFile))
	mux.Handle("GET /v1/sessions/{id}/archive", s.authed(s.getArchive))
	mux.Handle("POST /v1/sessions/{id}/archive", s.authed(s.postArchive))
	mux.Handle("GET /v1/sessions/{id}/turns/{n}/changes", s.authed(s.turnChanges))
	mux.Handle("POST /v1/sessions/{id}/fork", s.authed(s.forkSession))
}

// listFiles serves GET /v1/sessions/{id}/files?path=DIR[&recursive=1] →
// {"entries":[{"path","type","size","mode","mtime"}…]}: the folder's
// entries, or everything below it with recursive.
func (s *Server) listFiles(w http.ResponseWriter, r *http.Request, p session.Principal) {
	q := r.URL.Query()
	rec, err := boolParam("recursive", q.Get("recursive"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.list(w, r, p, q.Get("path"), rec)
}

// list streams the node's JSON listing (session.FileListing) to w: a
// large folder does not fit in one NATS message.
func (s *Server) list(w http.ResponseWriter, r *http.Request, p session.Principal, dir string, recursive bool) {
	s.download(w, r, p, session.FilesRequest{Op: session.FileList, Path: dir, Recursive: recursive})
}

func boolParam(name, v string) (bool, error) {
	switch v {
	case "", "0", "false":
		return false, nil
	case "1", "true":
		return true, nil
	}
	return false, session.Errorf(session.CodeBadRequest, "%s must be true or false, not %q", name, v)
}

// getFile serves GET /v1/sessions/{id}/files/{path} → the file's bytes
// (Content-Length, Last-Modified, and Atrium-Mode with its permission
// bits). A path ending in "/" lists the folder.
func (s *Server) getFile(w http.ResponseWriter, r *http.Request, p session.Principal) {
	name := r.PathValue("path")
	if name == "" || name[len(name)-1] == '/' {
		s.list(w, r, p, name, false)
		return
	}
	s.download(w, r, p, session.FilesRequest{Op: session.FileRead, Path: name})
}

// getArchive serves GET /v1/sessions/{id}/archive?path=DIR → a tar.gz of
// the workspace or of a folder, names relative to it.
func (s *Server) getArchive(w http.ResponseWriter, r *http.Request, p session.Principal) {
	s.download(w, r, p, session.FilesRequest{Op: session.FileArchiveOut, Path: r.URL.Query().Get("path")})
}

// download asks the node for a read and copies its stream to w.
func (s *Server) download(w http.ResponseWriter, r *http.Request, p session.Principal, req session.FilesRequest) {
	id := session.ID(r.PathValue("id"))
	sub, err := s.nc.SubscribeSync(nats.NewInbox())
	if err != nil {
		s.fail(w, r, natsError(err))
		return
	}
	defer sub.Unsubscribe()
	req.Stream = sub.Subject
	reply, err := s.do(r, p, id, session.ActRead, session.Command{Op: session.OpFiles, Files: &req})
	if err == nil && (reply.Files == nil || reply.Files.File == nil) {
		err = session.Errorf(session.CodeInternal, "the node's answer to a read has no file")
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	f := reply.Files.File
	h := w.Header()
	switch req.Op {
	case session.FileList:
		h.Set("Content-Type", "application/json")
	case session.FileArchiveOut:
		h.Set("Content-Type", "application/gzip")
		name := "workspace"
		if req.Path != "" {
			name = lastElem(req.Path)
		}
		h.Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", name+".tar.gz"))
	default:
		h.Set("Content-Type", "application/octet-stream")
		h.Set("Content-Length", strconv.FormatInt(f.Size, 10))
		h.Set("Atrium-Mode", f.Mode)
		if !f.MTime.IsZero() {
			h.Set("Last-Modified", f.MTime.UTC().Format(http.TimeFormat))
		}
	}
	w.WriteHeader(http.StatusOK)
	for {
		ctx, cancel := context.WithTimeout(r.Context(), fileStreamTimeout)
		msg, err := sub.NextMsgWithContext(ctx)
		cancel()
		if err != nil {
			s.log.Warn("file stream from the node ended early", "session", id, "err", err)
			panic(http.ErrAbortHandler) // The client sees a truncated body.
		}
		if e := msg.Header.Get(session.HeaderChunkError); e != "" {
			s.log.Warn("file stream from the node failed", "session", id, "err", e)
			_ = msg.Respond(nil)
			panic(http.ErrAbortHandler)
		}
		if _, err := w.Write(msg.Data); err != nil {
			_ = msg.Respond(encodeError(session.Errorf(session.CodeUnavailable, "the client went away")))
			return
		}
		_ = msg.Respond(nil)
		if msg.Header.Get(session.HeaderChunkEnd) != "" {
			return
		}
	}
}

func lastElem(p string) string {
	for i := len(p) - 1; i >= 0; i-- {
		if p[i] == '/' && i < len(p)-1 {
			return p[i+1:]
		}
	}
	return p
}

func encodeError(e *session.Error) []byte {
	b, _ := json.Marshal(session.Reply{Error: e})
	return b
}

// putFile serves PUT /v1/sessions/{id}/files/{path}?mode=0644 bytes → 204
// (driver) once the file is written and saved. It waits for the running
// turn. An upload that ends early changes nothing.
func (s *Server) putFile(w http.ResponseWriter, r *http.Request, p session.Principal) {
	var mode uint64
	if m := r.URL.Query().Get("mode"); m != "" {
		v, err := strconv.ParseUint(m, 8, 32)
		if err != nil || v > 0o777 {
			s.fail(w, r, session.Errorf(session.CodeBadRequest, "mode %q must be octal permission bits from 0 to 0777, such as 0644", m))
			return
		}
		mode = v
	}
	s.upload(w, r, p, session.FilesRequest{Op: session.FileWrite, Path: r.PathValue("path"), Size: r.ContentLength, Mode: uint32(mode)})
}

// deleteFile serves DELETE /v1/sessions/{id}/files/{path} → 204 (driver):
// a file, a link, or a folder with everything in it.
func (s *Server) deleteFile(w http.ResponseWriter, r *http.Request, p session.Principal) {
	r.Body = http.NoBody
	r.ContentLength = 0
	s.upload(w, r, p, session.FilesRequest{Op: session.FileDelete, Path: r.PathValue("path")})
}

// postArchive serves POST /v1/sessions/{id}/archive?path=DIR tar.gz → 204
// (driver): unpacked into the folder (made if needed), whole or not at all.
func (s *Server) postArchive(w http.ResponseWriter, r *http.Request, p session.Principal) {
	s.upload(w, r, p, session.FilesRequest{Op: session.FileArchiveIn, Path: r.URL.Query().Get("path"), Size: r.ContentLength})
}

// upload sends the request body to the node as a write and answers once
// the node has applied it.
func (s *Server) upload(w http.ResponseWriter, r *http.Request, p session.Principal, req session.FilesRequest) {
	id := session.ID(r.PathValue("id"))
	reply, err := s.do(r, p, id, session.ActDrive, session.Command{Op: session.OpFiles, Files: &req})
	if err == nil && (reply.Files == nil || reply.Files.Stream == "") {
		err = session.Errorf(session.CodeInternal, "the node's answer to a write has no stream")
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if err := s.sendBody(r.Context(), reply.Files.Stream, r.Body); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// sendBody streams body to the node's inbox; the answer to the last chunk
// is the outcome of the write. A body that cannot be read aborts the
// stream, and the node discards what it received.
func (s *Server) sendBody(ctx context.Context, stream string, body io.Reader) error {
	buf := make([]byte, min(session.MaxChunkBytes, int(s.nc.MaxPayload())-4096))
	first := true
	for {
		n, rerr := io.ReadFull(body, buf)
		msg := nats.NewMsg(stream)
		last := rerr == io.EOF || rerr == io.ErrUnexpectedEOF
		switch {
		case last:
			msg.Data = buf[:n]
			msg.Header.Set(session.HeaderChunkEnd, "1")
		case rerr != nil:
			e := session.Errorf(session.CodeBadRequest, "the upload was interrupted: %v; nothing was written", rerr)
			msg.Header.Set(session.HeaderChunkError, string(encodeError(e)))
			_ = s.nc.PublishMsg(msg)
			return e
		default:
			msg.Data = buf[:n]
		}
		timeout := fileStreamTimeout
		if last {
			timeout = fileApplyTimeout
		}
		resp, err := s.requestChunk(ctx, msg, timeout, first)
		first = false
		if err != nil {
			if errors.Is(err, nats.ErrNoResponders) {
				return session.Errorf(session.CodeUnavailable, "the node stopped receiving the upload: try again")
			}
			return natsError(err)
		}
		if len(resp.Data) > 0 {
			var rep session.Reply
			if err := json.Unmarshal(resp.Data, &rep); err != nil {
				return session.Errorf(session.CodeInternal, "the node's answer to an upload chunk is not JSON")
			}
			if rep.Error != nil {
				return rep.Error
			}
		}
		if last {
			return nil
		}
	}
}

// requestChunk sends one chunk and waits for its answer. The first chunk
// retries briefly on no responders: the node's inbox may not have reached
// this gateway's server yet.
func (s *Server) requestChunk(ctx context.Context, msg *nats.Msg, timeout time.Duration, first bool) (*nats.Msg, error) {
	deadline := time.Now().Add(noRespondersRetry)
	for {
		rctx, cancel := context.WithTimeout(ctx, timeout)
		resp, err := s.nc.RequestMsgWithContext(rctx, msg)
		cancel()
		if !first || !errors.Is(err, nats.ErrNoResponders) || time.Now().After(deadline) {
			return resp, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// turnChanges serves GET /v1/sessions/{id}/turns/{n}/changes →
// {"files":[{"path","status","diff"?}…]}: what turn n changed in the
// workspace, from the saved workspace before and after it.
func (s *Server) turnChanges(w http.ResponseWriter, r *http.Request, p session.Principal) {
	id := session.ID(r.PathValue("id"))
	n, err := strconv.ParseInt(r.PathValue("n"), 10, 64)
	if err != nil || n < 1 {
		s.fail(w, r, session.Errorf(session.CodeBadRequest, "turn must be a number from 1, not %q", r.PathValue("n")))
		return
	}
	reply, err := s.do(r, p, id, session.ActRead, session.Command{Op: session.OpFiles, Files: &session.FilesRequest{
		Op: session.FileChanges, Turn: n,
	}})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	body := session.TurnChanges{Files: []session.FileChange{}}
	if reply.Files != nil && reply.Files.Changes != nil {
		body.Files = reply.Files.Changes
	}
	writeJSON(w, http.StatusOK, body)
}

// forkSession serves POST /v1/sessions/{id}/fork {"at_seq"?,"title"?} → 201
// Session: a new session owned by the caller, with the history up to at_seq
// (default: all of it) and the workspace as of then.
func (s *Server) forkSession(w http.ResponseWriter, r *http.Request, p session.Principal) {
	id := session.ID(r.PathValue("id"))
	var body api.Fork
	if err := decodeBody(w, r, &body, true); err != nil {
		s.fail(w, r, err)
		return
	}
	if body.AtSeq != nil && *body.AtSeq < 1 {
		s.fail(w, r, session.Errorf(session.CodeBadRequest, "at_seq must be 1 or more, not %d", *body.AtSeq))
		return
	}
	if len(body.Title) > session.MaxTitleBytes {
		s.fail(w, r, session.Errorf(session.CodeBadRequest, "title is longer than %d bytes", session.MaxTitleBytes))
		return
	}
	if !p.Limit(session.RoleOwner).AtLeast(session.RoleDriver) {
		err := session.Errorf(session.CodeForbidden, "this credential is limited to the %s role: it cannot create sessions", p.Cap)
		s.auditDenied(r.Context(), remoteOf(r), p, id, "fork", nil, err)
		s.fail(w, r, err)
		return
	}
	req := &session.ForkRequest{Title: body.Title, Child: session.NewID()}
	if body.AtSeq != nil {
		req.AtSeq = *body.AtSeq
	}
	reply, err := s.do(r, p, id, session.ActRead, session.Command{Op: session.OpFork, Fork: req})
	if err == nil && reply.Session == nil {
		err = session.Errorf(session.CodeInternal, "the node's answer to a fork has no session")
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	sess := reply.Session
	s.refreshCatalog(r.Context(), sess.ID)
	e := entry(p, remoteOf(r), audit.ActSessionCreated)
	e.Session = string(sess.ID)
	e.Detail = "fork of " + string(id)
	if req.AtSeq > 0 {
		e.Detail += " at seq " + strconv.FormatInt(req.AtSeq, 10)
	}
	s.record(r.Context(), e)
	w.Header().Set("Location", "/v1/sessions/"+string(sess.ID))
	writeJSON(w, http.StatusCreated, sess)
}
