// Package clienttest is an in-memory Atrium gateway for tests of clients. It
// speaks the wire contract of DESIGN §7 (REST and the atrium.v1 WebSocket;
// not SSE) with the contract's exact JSON shapes, keeps sessions and their
// event logs in memory, runs turns with a Go function as the harness, and has
// knobs to break things on purpose: drop or close connections, replay
// duplicates on resume, skip an event to make a gap.
//
// It also serves the identity routes of the contract (GET /auth/config,
// /v1/whoami, /v1/tokens, /v1/audit) with the same shapes. It authenticates
// "Authorization: Bearer dev:<user>", the API tokens it issued, and whatever
// Options.Authenticate accepts (an OIDC ID token verified against a test
// issuer, say), and applies tenants, tenant admins and token role caps the way
// the contract says. It is not the real gateway; end-to-end tests should also
// run the real stack.
package clienttest

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/atriumhq/atrium/session"
)

// Harness runs one turn and returns its exit code. It should return soon
// after ctx ends (the turn was cancelled).
type Harness func(ctx context.Context, t *Turn) int

// EchoHarness writes the prompt to stdout and exits 0; a prompt starting
// with "fail" exits 3; a prompt "ask" requests approval "a1" and exits 0 when
// allowed, 1 when denied.
func EchoHarness(ctx context.Context, t *Turn) int {
	switch {
	case strings.HasPrefix(t.Prompt, "fail"):
		t.Stderr("failing as asked\n")
		return 3
	case t.Prompt == "ask":
		allow, err := t.Approval(ctx, "a1", "may I?")
		if err != nil {
			return 130
		}
		if !allow {
			t.Stdout("denied\n")
			return 1
		}
		t.Stdout("allowed\n")
		return 0
	}
	t.Stdout(t.Prompt + "\n")
	return 0
}

// Options configure a Server.
type Options struct {
	// Harness runs every turn; default EchoHarness.
	Harness Harness
	// PageLimit caps the events of one history page; default 1000.
	PageLimit int
	// QueueSize bounds each WebSocket's queue of live frames; a watcher
	// whose queue is full is closed with 1008 "slow consumer". Default 1024.
	QueueSize int
	// Auth is what GET /auth/config answers; the zero value answers
	// {"mode":"dev","login_url":"/auth/dev"}.
	Auth AuthConfig
	// Authenticate resolves bearer tokens that are neither "dev:<user>"
	// nor an API token of this server, e.g. OIDC ID tokens. nil rejects
	// them. Its error's message is sent to the client.
	Authenticate func(ctx context.Context, token string) (Identity, error)
	// Tenant is the tenant of dev users; default none.
	Tenant string
	// Admins are the dev users who are tenant admins.
	Admins []string
	// AuditPageLimit caps the entries of one audit page; default 100.
	AuditPageLimit int
}

// Server is a running fake gateway.
type Server struct {
	// URL is the base URL of the server.
	URL string

	opts Options
	http *httptest.Server
	ctx  context.Context
	stop context.CancelFunc
	wg   sync.WaitGroup // turns and connections

	mu       sync.Mutex
	sessions map[session.ID]*fsession // guarded by mu
	nextConn int                      // guarded by mu
	faults   Faults                   // guarded by mu
	auths    []string                 // guarded by mu: Authorization headers seen
	tokens   map[string]*ftoken       // guarded by mu: API tokens by id
	auditLog []AuditEntry             // guarded by mu: oldest first
}

// Faults are deliberate protocol breakages (the real gateway never does
// these, but networks and restarts make clients see their effects).
type Faults struct {
	// DuplicateOnResume resends up to this many events at or before the
	// resume point when a WebSocket connects with after > 0.
	DuplicateOnResume int
	// SkipLive drops the next this-many live event frames to every
	// watcher, creating a gap.
	SkipLive int
	// RejectWS answers the next this-many WebSocket handshakes with 503
	// unavailable.
	RejectWS int
}

type fsession struct {
	meta    session.Meta
	events  [][]byte // events[i] has seq i+1
	conns   map[*fconn]struct{}
	queue   []session.Prompt
	running *fturn
	turns   int64
}

type fturn struct {
	n         int64
	cancel    context.CancelFunc
	cancelled bool
	approvals map[string]chan bool
}

type fconn struct {
	id    string
	user  string
	who   Identity
	since session.Time
	ws    *websocket.Conn
	queue chan []byte
	slow  chan struct{} // closed when the queue overflowed
	once  sync.Once
	kill  chan closeReq // asks the writer to flush the queue and close
}

type closeReq struct {
	code   websocket.StatusCode
	reason string
}

// New starts a fake gateway; it is closed when the test ends.
func New(tb testing.TB, opts Options) *Server {
	tb.Helper()
	if opts.Harness == nil {
		opts.Harness = EchoHarness
	}
	if opts.PageLimit <= 0 {
		opts.PageLimit = 1000
	}
	if opts.QueueSize <= 0 {
		opts.QueueSize = 1024
	}
	if opts.Auth.Mode == "" {
		opts.Auth = AuthConfig{Mode: "dev", LoginURL: "/auth/dev"}
	}
	if opts.AuditPageLimit <= 0 {
		opts.AuditPageLimit = 100
	}
	s := &Server{opts: opts, sessions: map[session.ID]*fsession{}, tokens: map[string]*ftoken{}}
	s.ctx, s.stop = context.WithCancel(context.Background())
	s.http = httptest.NewServer(s.handler())
	s.URL = s.http.URL
	tb.Cleanup(s.Close)
	return s
}

// Close stops the server, its turns and connections. Safe to call twice.
func (s *Server) Close() {
	s.stop()
	s.http.CloseClientConnections()
	s.http.Close()
	s.wg.Wait()
}

// SetFaults replaces the fault knobs.
func (s *Server) SetFaults(f Faults) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = f
}

// Authorizations returns the Authorization headers of all requests so far.
func (s *Server) Authorizations() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.auths...)
}

// Watchers returns the number of WebSockets watching id.
func (s *Server) Watchers(id session.ID) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ss := s.sessions[id]; ss != nil {
		return len(ss.conns)
	}
	return 0
}

// LastSeq returns id's last seq.
func (s *Server) LastSeq(id session.ID) session.Seq {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ss := s.sessions[id]; ss != nil {
		return session.Seq(len(ss.events))
	}
	return 0
}

// Append appends an event to id's log and broadcasts it, as the node would.
func (s *Server) Append(id session.ID, kind session.Kind, by string, data any) session.Seq {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.sessions[id]
	if ss == nil {
		panic("clienttest: no session " + string(id))
	}
	return s.appendLocked(ss, kind, by, data)
}

// DropConnections closes every WebSocket without a close frame, like a
// network failure.
func (s *Server) DropConnections() { s.closeConns(-1, "") }

// CloseConnections closes every WebSocket with code and reason, like a
// gateway shutting down (1001) or shedding a slow consumer (1008).
func (s *Server) CloseConnections(code websocket.StatusCode, reason string) {
	s.closeConns(code, reason)
}

func (s *Server) closeConns(code websocket.StatusCode, reason string) {
	s.mu.Lock()
	var all []*fconn
	for _, ss := range s.sessions {
		for c := range ss.conns {
			all = append(all, c)
		}
	}
	s.mu.Unlock()
	for _, c := range all {
		if code < 0 {
			c.ws.CloseNow()
			continue
		}
		select {
		case c.kill <- closeReq{code, reason}:
		default: // already closing
		}
	}
}

func writeError(w http.ResponseWriter, err error) {
	e := session.AsError(err)
	w.Header().Set("Content-Type", "application/json")
	if e.Code == session.CodeTooManyRequests {
		w.Header().Set("Retry-After", "1")
	}
	w.WriteHeader(e.Code.HTTPStatus())
	_ = json.NewEncoder(w).Encode(session.ErrorBody{Error: e})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func decodeBody(r *http.Request, v any) error {
	if err := json.NewDecoder(http.MaxBytesReader(nil, r.Body, session.MaxFrameBytes)).Decode(v); err != nil {
		return session.Errorf(session.CodeBadRequest, "bad JSON body: %v", err)
	}
	return nil
}

func (s *Server) handler() http.Handler {
	mux := http.NewServeMux()
	auth := func(h func(w http.ResponseWriter, r *http.Request, who Identity) error) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			who, err := s.identify(r)
			if err != nil {
				writeAuthError(w, err)
				return
			}
			if err := h(w, r, who); err != nil {
				writeError(w, err)
			}
		}
	}
	mux.HandleFunc("GET /auth/config", s.authConfig)
	mux.HandleFunc("GET /v1/whoami", auth(s.whoami))
	mux.HandleFunc("POST /v1/tokens", auth(s.createToken))
	mux.HandleFunc("GET /v1/tokens", auth(s.listTokens))
	mux.HandleFunc("DELETE /v1/tokens/{id}", auth(s.revokeToken))
	mux.HandleFunc("GET /v1/audit", auth(s.audit))
	mux.HandleFunc("POST /v1/sessions", auth(s.create))
	mux.HandleFunc("GET /v1/sessions", auth(s.list))
	mux.HandleFunc("GET /v1/sessions/{id}", auth(s.get))
	mux.HandleFunc("DELETE /v1/sessions/{id}", auth(s.delete))
	mux.HandleFunc("POST /v1/sessions/{id}/messages", auth(s.message))
	mux.HandleFunc("POST /v1/sessions/{id}/cancel", auth(s.cancelREST))
	mux.HandleFunc("POST /v1/sessions/{id}/approvals/{aid}", auth(s.approveREST))
	mux.HandleFunc("PUT /v1/sessions/{id}/members/{user}", auth(s.member))
	mux.HandleFunc("GET /v1/sessions/{id}/events", auth(s.history))
	mux.HandleFunc("GET /v1/sessions/{id}/ws", auth(s.ws))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, session.Errorf(session.CodeNotFound, "no route %s %s", r.Method, r.URL.Path))
	})
	return mux
}

// lookupLocked returns the session and the caller's role, or not_found.
func (s *Server) lookupLocked(r *http.Request, who Identity, act session.Action) (*fsession, error) {
	id := session.ID(r.PathValue("id"))
	if err := id.Validate(); err != nil {
		return nil, err
	}
	ss := s.sessions[id]
	if ss == nil {
		return nil, session.Errorf(session.CodeNotFound, "session %s not found", id)
	}
	if err := session.Authorize(roleOf(ss, who), act); err != nil {
		if session.AsError(err).Code == session.CodeForbidden {
			s.recordLocked(r, who, AuditEntry{Action: "denied", Session: string(id), Outcome: "denied", Detail: err.Error()})
		}
		return nil, err
	}
	return ss, nil
}

func (s *Server) sessionForLocked(ss *fsession, who Identity) session.Session {
	st := session.StateHibernated
	if ss.running != nil {
		st = session.StateActive
	}
	return session.Session{
		ID: ss.meta.ID, Title: ss.meta.Title, Owner: ss.meta.Owner, CreatedAt: ss.meta.CreatedAt,
		LastSeq: session.Seq(len(ss.events)), Epoch: ss.meta.Epoch, State: st,
		Sandbox: session.SandboxInfo{State: session.SandboxNone}, Role: roleOf(ss, who),
	}
}

func (s *Server) create(w http.ResponseWriter, r *http.Request, who Identity) error {
	user := who.User
	var body struct {
		Title   string          `json:"title"`
		Harness session.Harness `json:"harness"`
	}
	if err := decodeBody(r, &body); err != nil {
		return err
	}
	if err := body.Harness.Validate(); err != nil {
		return err
	}
	if len(body.Title) > session.MaxTitleBytes {
		return session.Errorf(session.CodeBadRequest, "title is too long")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := &fsession{
		meta: session.Meta{
			ID: session.NewID(), Title: body.Title, Owner: user, Tenant: who.Tenant, Epoch: session.NewEpoch(),
			CreatedAt: session.Time{Time: time.Now().UTC()}, Members: session.Members{user: session.RoleOwner},
			Harness: body.Harness,
		},
		conns: map[*fconn]struct{}{},
	}
	s.sessions[ss.meta.ID] = ss
	s.recordLocked(r, who, AuditEntry{Action: "session_created", Session: string(ss.meta.ID), Outcome: "ok"})
	s.appendLocked(ss, session.KindSessionCreated, user, session.SessionCreatedData{Title: body.Title})
	writeJSON(w, http.StatusCreated, s.sessionForLocked(ss, who))
	return nil
}

func (s *Server) list(w http.ResponseWriter, _ *http.Request, who Identity) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []session.Session{}
	for _, ss := range s.sessions {
		if roleOf(ss, who).Valid() {
			out = append(out, s.sessionForLocked(ss, who))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt.Time) })
	writeJSON(w, http.StatusOK, map[string]any{"sessions": out})
	return nil
}

func (s *Server) get(w http.ResponseWriter, r *http.Request, who Identity) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss, err := s.lookupLocked(r, who, session.ActRead)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, s.sessionForLocked(ss, who))
	return nil
}

func (s *Server) delete(w http.ResponseWriter, r *http.Request, who Identity) error {
	s.mu.Lock()
	ss, err := s.lookupLocked(r, who, session.ActManage)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	delete(s.sessions, ss.meta.ID)
	s.recordLocked(r, who, AuditEntry{Action: "session_deleted", Session: string(ss.meta.ID), Outcome: "ok"})
	if ss.running != nil {
		ss.running.cancel()
	}
	ss.queue = nil
	conns := ss.conns
	ss.conns = map[*fconn]struct{}{}
	s.mu.Unlock()
	gone, _ := json.Marshal(session.ErrorFrame{Type: session.FrameError, Code: session.CodeNotFound, Message: "session deleted"})
	for c := range conns {
		c.enqueue(gone)
		select {
		case c.kill <- closeReq{websocket.StatusNormalClosure, "session deleted"}:
		default:
		}
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) message(w http.ResponseWriter, r *http.Request, who Identity) error {
	user := who.User
	var body struct {
		Text     string `json:"text"`
		ClientID string `json:"client_id"`
	}
	if err := decodeBody(r, &body); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ss, err := s.lookupLocked(r, who, session.ActDrive)
	if err != nil {
		return err
	}
	seq, err := s.promptLocked(ss, user, body.Text, body.ClientID)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusAccepted, map[string]session.Seq{"seq": seq})
	return nil
}

func (s *Server) cancelREST(w http.ResponseWriter, r *http.Request, who Identity) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss, err := s.lookupLocked(r, who, session.ActDrive)
	if err != nil {
		return err
	}
	if err := cancelLocked(ss); err != nil {
		return err
	}
	w.WriteHeader(http.StatusAccepted)
	return nil
}

func (s *Server) approveREST(w http.ResponseWriter, r *http.Request, who Identity) error {
	user := who.User
	var body struct {
		Allow *bool `json:"allow"`
	}
	if err := decodeBody(r, &body); err != nil {
		return err
	}
	if body.Allow == nil {
		return session.Errorf(session.CodeBadRequest, `body must be {"allow":true|false}`)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ss, err := s.lookupLocked(r, who, session.ActDrive)
	if err != nil {
		return err
	}
	if err := s.approveLocked(ss, user, r.PathValue("aid"), *body.Allow); err != nil {
		return err
	}
	w.WriteHeader(http.StatusAccepted)
	return nil
}

func (s *Server) member(w http.ResponseWriter, r *http.Request, who Identity) error {
	user := who.User
	var body struct {
		Role string `json:"role"`
	}
	if err := decodeBody(r, &body); err != nil {
		return err
	}
	role, err := session.ParseRole(body.Role)
	if err != nil {
		return err
	}
	target := r.PathValue("user")
	if err := session.ValidUser(target); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ss, err := s.lookupLocked(r, who, session.ActManage)
	if err != nil {
		return err
	}
	if target == ss.meta.Owner {
		return session.Errorf(session.CodeConflict, "the owner's role cannot change")
	}
	if role == session.RoleNone {
		delete(ss.meta.Members, target)
	} else {
		ss.meta.Members[target] = role
	}
	s.recordLocked(r, who, AuditEntry{Action: "member_changed", Session: string(ss.meta.ID), Target: target, Outcome: "ok", Detail: "role " + string(role)})
	s.appendLocked(ss, session.KindMemberChanged, user, session.MemberChangedData{User: target, Role: role})
	w.WriteHeader(http.StatusOK)
	return nil
}

func (s *Server) history(w http.ResponseWriter, r *http.Request, who Identity) error {
	after, limit, err := parseRange(r)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ss, err := s.lookupLocked(r, who, session.ActRead)
	if err != nil {
		return err
	}
	if limit <= 0 || limit > s.opts.PageLimit {
		limit = s.opts.PageLimit
	}
	page := session.EventsPage{Events: []json.RawMessage{}, LastSeq: session.Seq(len(ss.events)), Epoch: ss.meta.Epoch}
	for seq := after + 1; seq <= session.Seq(len(ss.events)) && len(page.Events) < limit; seq++ {
		page.Events = append(page.Events, ss.events[seq-1])
	}
	writeJSON(w, http.StatusOK, page)
	return nil
}

func parseRange(r *http.Request) (after session.Seq, limit int, err error) {
	q := r.URL.Query()
	if v := q.Get("after"); v != "" {
		if after, err = strconv.ParseInt(v, 10, 64); err != nil || after < 0 {
			return 0, 0, session.Errorf(session.CodeBadRequest, "after must be a seq")
		}
	}
	if v := q.Get("limit"); v != "" {
		if limit, err = strconv.Atoi(v); err != nil || limit < 0 {
			return 0, 0, session.Errorf(session.CodeBadRequest, "limit must be a positive number")
		}
	}
	return after, limit, nil
}

// appendLocked appends an event and queues it to every watcher.
func (s *Server) appendLocked(ss *fsession, kind session.Kind, by string, data any) session.Seq {
	ev := session.Event{
		Seq: session.Seq(len(ss.events) + 1), Epoch: ss.meta.Epoch, Time: session.Time{Time: time.Now().UTC()},
		Kind: kind, By: by, Data: session.MustData(data),
	}
	b, _ := json.Marshal(ev)
	ss.events = append(ss.events, b)
	if s.faults.SkipLive > 0 {
		s.faults.SkipLive--
		return ev.Seq
	}
	frame := session.AppendEventFrame(nil, b)
	for c := range ss.conns {
		c.enqueue(frame)
	}
	return ev.Seq
}

func (s *Server) promptLocked(ss *fsession, user, text, clientID string) (session.Seq, error) {
	if text == "" {
		return 0, session.Errorf(session.CodeBadRequest, "text is empty")
	}
	if len(text) > session.MaxTextBytes {
		return 0, session.Errorf(session.CodePayloadTooLarge, "text is too long")
	}
	seq := s.appendLocked(ss, session.KindMessage, user, session.MessageData{Text: text, ClientID: clientID})
	ss.queue = append(ss.queue, session.Prompt{Seq: seq, Text: text, By: user})
	if ss.running == nil {
		s.startTurnLocked(ss)
	}
	return seq, nil
}

func cancelLocked(ss *fsession) error {
	if ss.running == nil {
		return session.Errorf(session.CodeConflict, "no turn is running")
	}
	ss.running.cancelled = true
	ss.running.cancel()
	return nil
}

func (s *Server) approveLocked(ss *fsession, user, aid string, allow bool) error {
	t := ss.running
	if t == nil || t.approvals[aid] == nil {
		return session.Errorf(session.CodeNotFound, "no pending approval %q", aid)
	}
	t.approvals[aid] <- allow
	delete(t.approvals, aid)
	s.appendLocked(ss, session.KindApprovalResolved, user, session.ApprovalResolvedData{Turn: t.n, ID: aid, Allow: allow})
	return nil
}

// startTurnLocked runs the queued prompts one at a time in a goroutine.
func (s *Server) startTurnLocked(ss *fsession) {
	p := ss.queue[0]
	ss.queue = ss.queue[1:]
	ss.turns++
	ctx, cancel := context.WithCancel(s.ctx)
	t := &fturn{n: ss.turns, cancel: cancel, approvals: map[string]chan bool{}}
	ss.running = t
	s.appendLocked(ss, session.KindTurnStarted, session.BySystem, session.TurnStartedData{Turn: t.n, PromptSeq: p.Seq})
	s.wg.Go(func() {
		defer cancel()
		start := time.Now()
		code := s.opts.Harness(ctx, &Turn{Session: ss.meta.ID, N: t.n, Prompt: p.Text, By: p.By, s: s, ss: ss, t: t})
		s.mu.Lock()
		defer s.mu.Unlock()
		status := session.TurnOK
		switch {
		case t.cancelled:
			status = session.TurnCancelled
		case code != 0:
			status = session.TurnFailed
		}
		s.appendLocked(ss, session.KindTurnFinished, session.BySystem, session.TurnFinishedData{
			Turn: t.n, Status: status, ExitCode: code, DurationMS: time.Since(start).Milliseconds(),
		})
		ss.running = nil
		if len(ss.queue) > 0 && s.sessions[ss.meta.ID] == ss {
			s.startTurnLocked(ss)
		}
	})
}

// Turn is the running turn as its harness sees it.
type Turn struct {
	Session session.ID
	N       int64
	Prompt  string
	By      string

	s  *Server
	ss *fsession
	t  *fturn
}

func (t *Turn) output(stream, text string) {
	t.s.mu.Lock()
	defer t.s.mu.Unlock()
	t.s.appendLocked(t.ss, session.KindOutput, session.BySystem, session.OutputData{Turn: t.N, Stream: stream, Text: text})
}

// Stdout records an output event on stdout.
func (t *Turn) Stdout(text string) { t.output("stdout", text) }

// Stderr records an output event on stderr.
func (t *Turn) Stderr(text string) { t.output("stderr", text) }

// Approval requests approval id and waits for a driver's answer.
func (t *Turn) Approval(ctx context.Context, id, summary string) (bool, error) {
	ch := make(chan bool, 1)
	t.s.mu.Lock()
	t.t.approvals[id] = ch
	t.s.appendLocked(t.ss, session.KindApprovalRequested, session.BySystem, session.ApprovalRequestedData{Turn: t.N, ID: id, Summary: summary})
	t.s.mu.Unlock()
	select {
	case allow := <-ch:
		return allow, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

func (c *fconn) enqueue(b []byte) {
	select {
	case c.queue <- b:
	default:
		c.once.Do(func() { close(c.slow) })
	}
}

func (s *Server) ws(w http.ResponseWriter, r *http.Request, who Identity) error {
	user := who.User
	after, _, err := parseRange(r)
	if err != nil {
		return err
	}
	s.mu.Lock()
	_, err = s.lookupLocked(r, who, session.ActRead)
	if err == nil && s.faults.RejectWS > 0 {
		s.faults.RejectWS--
		err = session.Errorf(session.CodeUnavailable, "try again")
	}
	s.mu.Unlock()
	if err != nil {
		return err
	}
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{session.Subprotocol}})
	if err != nil {
		return nil // Accept wrote the response
	}
	if ws.Subprotocol() != session.Subprotocol {
		ws.Close(websocket.StatusPolicyViolation, "use subprotocol "+session.Subprotocol)
		return nil
	}
	ws.SetReadLimit(session.MaxFrameBytes)

	s.mu.Lock()
	ss, err := s.lookupLocked(r, who, session.ActRead)
	if err != nil {
		s.mu.Unlock()
		b, _ := json.Marshal(session.ErrorFrame{Type: session.FrameError, Code: session.AsError(err).Code, Message: err.Error()})
		ws.Write(r.Context(), websocket.MessageText, b)
		ws.Close(websocket.StatusNormalClosure, "")
		return nil
	}
	s.nextConn++
	c := &fconn{
		id: "c" + strconv.Itoa(s.nextConn), user: user, who: who, since: session.Time{Time: time.Now().UTC()},
		ws: ws, queue: make(chan []byte, s.opts.QueueSize), slow: make(chan struct{}),
		kill: make(chan closeReq, 1),
	}
	hello, _ := json.Marshal(session.HelloFrame{
		Type: session.FrameHello, Session: s.sessionForLocked(ss, who),
		You: session.You{User: user, Role: roleOf(ss, who)}, LastSeq: session.Seq(len(ss.events)),
	})
	from := after + 1
	if after > 0 && s.faults.DuplicateOnResume > 0 {
		from = max(1, after+1-session.Seq(s.faults.DuplicateOnResume))
	}
	var backlog [][]byte
	for seq := from; seq <= session.Seq(len(ss.events)); seq++ {
		backlog = append(backlog, session.AppendEventFrame(nil, ss.events[seq-1]))
	}
	ss.conns[c] = struct{}{}
	s.broadcastPresenceLocked(ss)
	s.mu.Unlock()

	defer func() {
		s.mu.Lock()
		if _, ok := ss.conns[c]; ok {
			delete(ss.conns, c)
			s.broadcastPresenceLocked(ss)
		}
		s.mu.Unlock()
		ws.CloseNow()
	}()

	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() {
		defer cancel()
		write := func(b []byte) bool {
			wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
			defer wcancel()
			return ws.Write(wctx, websocket.MessageText, b) == nil
		}
		if !write(hello) {
			return
		}
		for _, b := range backlog {
			if !write(b) {
				return
			}
		}
		for {
			select {
			case <-ctx.Done():
				return
			case <-c.slow:
				ws.Close(session.CloseSlowConsumer, "slow consumer")
				return
			case req := <-c.kill:
				for len(c.queue) > 0 {
					if !write(<-c.queue) {
						return
					}
				}
				ws.Close(req.code, req.reason)
				return
			case b := <-c.queue:
				if !write(b) {
					return
				}
			}
		}
	})
	for {
		_, b, err := ws.Read(ctx)
		if err != nil {
			return nil
		}
		s.clientFrame(ss, c, b)
	}
}

func (s *Server) clientFrame(ss *fsession, c *fconn, b []byte) {
	var f session.ClientFrame
	reply := func(err error, clientID string) {
		e := session.AsError(err)
		out, _ := json.Marshal(session.ErrorFrame{Type: session.FrameError, Code: e.Code, Message: e.Message, ClientID: clientID})
		c.enqueue(out)
	}
	if err := json.Unmarshal(b, &f); err != nil {
		reply(session.Errorf(session.CodeBadRequest, "bad frame: %v", err), "")
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sessions[ss.meta.ID] != ss {
		reply(session.Errorf(session.CodeNotFound, "session deleted"), f.ClientID)
		return
	}
	if err := session.Authorize(roleOf(ss, c.who), session.ActDrive); err != nil {
		reply(err, f.ClientID)
		return
	}
	switch f.Type {
	case session.FramePrompt:
		seq, err := s.promptLocked(ss, c.user, f.Text, f.ClientID)
		if err != nil {
			reply(err, f.ClientID)
			return
		}
		out, _ := json.Marshal(session.AckFrame{Type: session.FrameAck, ClientID: f.ClientID, Seq: seq})
		c.enqueue(out)
	case session.FrameCancel:
		if err := cancelLocked(ss); err != nil {
			reply(err, "")
		}
	case session.FrameApprove:
		if f.Allow == nil {
			reply(session.Errorf(session.CodeBadRequest, "approve needs allow"), "")
			return
		}
		if err := s.approveLocked(ss, c.user, f.ID, *f.Allow); err != nil {
			reply(err, "")
		}
	default:
		reply(session.Errorf(session.CodeBadRequest, "unknown frame type %q", f.Type), f.ClientID)
	}
}

func (s *Server) broadcastPresenceLocked(ss *fsession) {
	p := session.PresenceFrame{Type: session.FramePresence, Watchers: []session.Watcher{}}
	for c := range ss.conns {
		p.Watchers = append(p.Watchers, session.Watcher{User: c.user, Conn: c.id, Since: c.since})
	}
	sort.Slice(p.Watchers, func(i, j int) bool { return p.Watchers[i].Conn < p.Watchers[j].Conn })
	b, _ := json.Marshal(p)
	for c := range ss.conns {
		c.enqueue(b)
	}
}
