package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/atriumhq/atrium/gateway/audit"
	"github.com/atriumhq/atrium/gateway/quota"
	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/session/api"
	"github.com/nats-io/nats.go/jetstream"
)

// Defaults of Quotas.
const (
	// DefaultInvokesPerSession caps the invokes running at once on one
	// session.
	DefaultInvokesPerSession = 4
	// DefaultInvokesPerTenant caps the invokes running at once in one
	// tenant.
	DefaultInvokesPerTenant = 32
	// DefaultSandboxRetryAfter is the wait suggested to a caller refused by
	// the quota of awake sandboxes: sandboxes go to sleep after minutes
	// idle, so there is no point in retrying at once.
	DefaultSandboxRetryAfter = 30 * time.Second
)

// HeaderInvokeID is the response header of POST /v1/sessions/{id}/invoke
// that carries the invoke's id as soon as its prompt is durable, before its
// turn starts (the start event carries it too).
const HeaderInvokeID = "Atrium-Invoke-Id"

// Quotas are the caps of invokes and the tenants' quotas
// (docs/automation.md#invoke). They are shared by every gateway through
// NATS KV (package gateway/quota), so all gateways of a system should have
// the same ones.
type Quotas struct {
	// InvokesPerSession caps the invokes running at once on one session;
	// 0 means DefaultInvokesPerSession, a negative value no cap.
	InvokesPerSession int
	// InvokesPerTenant caps the invokes running at once in one tenant; 0
	// means DefaultInvokesPerTenant, a negative value no cap.
	InvokesPerTenant int
	// SandboxesPerTenant caps the sessions of a tenant with an awake
	// sandbox: a prompt (an invoke or POST /messages) to a session whose
	// sandbox sleeps is refused while the tenant has this many awake. 0
	// means no quota.
	SandboxesPerTenant int
	// TurnsPerHour caps the prompts (invokes and POST /messages) a tenant
	// sends per hour; 0 means no quota.
	TurnsPerHour int
	// SlotTTL is how long a crashed gateway's invokes keep their slots;
	// default quota.DefaultSlotTTL.
	SlotTTL time.Duration
	// RetryAfter is the wait suggested at an invoke cap; default
	// quota.DefaultRetryAfter.
	RetryAfter time.Duration
	// Now is the clock of the turns window; default time.Now.
	Now func() time.Time
}

// invokes is the gateway's part of invoke: the quota store and the
// resolved limits.
type invokes struct {
	store                 *quota.Store
	perSession, perTenant int // 0: no cap
	sandboxes, turns      int // 0: no quota
}

// newInvokes resolves q's defaults and makes the quota store; the caller
// runs its Run.
func (s *Server) newInvokes(q Quotas) (*invokes, error) {
	capOf := func(n, def int) int {
		switch {
		case n == 0:
			return def
		case n < 0:
			return 0
		}
		return n
	}
	if q.SandboxesPerTenant < 0 || q.TurnsPerHour < 0 {
		return nil, errors.New("quotas: sandboxes per tenant and turns per hour must not be negative (0 is no quota)")
	}
	store, err := quota.New(quota.Config{
		NATS: s.nc, Prefix: s.subj.Prefix, SlotTTL: q.SlotTTL, RetryAfter: q.RetryAfter,
		RequestTimeout: s.reqTimeout, Now: q.Now, Logger: s.log, Replicas: s.replicas,
	})
	if err != nil {
		return nil, err
	}
	return &invokes{
		store:      store,
		perSession: capOf(q.InvokesPerSession, DefaultInvokesPerSession),
		perTenant:  capOf(q.InvokesPerTenant, DefaultInvokesPerTenant),
		sandboxes:  q.SandboxesPerTenant,
		turns:      q.TurnsPerHour,
	}, nil
}

// runQuotas renews the slots of this gateway's invokes until it closes.
func (s *Server) runQuotas() { s.inv.store.Run(s.ctx) }

// invokeRecord is what the KV registry holds of a running invoke, so that
// any gateway can cancel it.
type invokeRecord struct {
	Session   session.ID   `json:"session"`
	PromptSeq session.Seq  `json:"prompt_seq"`
	User      string       `json:"user"`
	Gateway   string       `json:"gateway"`
	Started   session.Time `json:"started"`
}

// invokeKey is the registry key of an invoke.
func invokeKey(invokeID string) string { return "invoke/" + invokeID }

// ActInvoke is the audit action of an invoke (POST …/invoke), recorded when
// it ends.
const ActInvoke = "invoke"

// invoke serves POST /v1/sessions/{id}/invoke {"text","client_id"?}: it
// prompts the session (a driver's right) and streams that prompt's turn as
// Server-Sent Events, "start", then "stdout", "stderr", "agent",
// "approval_requested" and "error" as the turn goes (and, in an agent
// session, "agent_message", "tool_call", "tool_call_update" and "plan",
// each with its event's data), and "exit" when it
// finishes, after which the stream ends. The invoke's id is in the
// Atrium-Invoke-Id header. Closing the stream before "exit" cancels the
// turn, running or still queued. Over a cap or quota it answers 429 with
// Retry-After and a body that names the limit.
func (s *Server) invoke(w http.ResponseWriter, r *http.Request, p session.Principal) {
	id := session.ID(r.PathValue("id"))
	var body api.Message
	if err := decodeBody(w, r, &body, false); err != nil {
		s.fail(w, r, err)
		return
	}
	if err := validatePrompt(body.Text, body.ClientID); err != nil {
		s.fail(w, r, err)
		return
	}
	a, err := s.driverAccess(r.Context(), p, id)
	if err != nil {
		s.auditDenied(r.Context(), remoteOf(r), p, id, "invoke", a.entry, err)
		s.fail(w, r, err)
		return
	}
	if !s.track() {
		s.fail(w, r, session.Errorf(session.CodeUnavailable, "the gateway is shutting down: try again"))
		return
	}
	defer s.conns.Done()

	invokeID := "inv_" + randomToken(10)
	holder, _ := json.Marshal(invokeRecord{Session: id, User: p.User, Gateway: s.id, Started: session.Time{Time: time.Now()}})
	hold, err := s.inv.store.Acquire(r.Context(), holder,
		quota.Slot{What: "invokes", Scope: quota.ScopeSession, Name: string(id), Limit: s.inv.sessionCap(a.entry)}, // settings.go
		quota.Slot{What: "invokes", Scope: quota.ScopeTenant, Name: p.Tenant, Limit: s.inv.perTenant})
	if err != nil {
		s.refuse(w, r, err)
		return
	}
	defer hold.Release(context.WithoutCancel(r.Context()))
	if err := s.admitPrompt(r.Context(), a); err != nil {
		s.refuse(w, r, err)
		return
	}

	// The stream ends when the client leaves, the turn ends or the server
	// closes.
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel)
	defer stop()
	wt := s.newWatcher(p.User, true)
	wt.token = apiToken(r, p)
	if a.entry != nil {
		wt.setRole(roleIn(a.entry, p))
	}
	t, err := s.hub.join(ctx, id, wt)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	defer s.hub.leave(t, wt)
	reply, err := s.call(ctx, p, id, session.Command{Op: session.OpPrompt, Text: body.Text, ClientID: body.ClientID}, a.allowed())
	if errors.Is(err, errNotActive) {
		err = a.notActive()
	}
	if err != nil {
		s.auditDenied(ctx, remoteOf(r), p, id, "invoke", a.entry, err)
		s.fail(w, r, err)
		return
	}
	seq := reply.Seq
	out := &invokeSink{invokeID: invokeID, id: id, seq: seq, done: cancel}
	// Each invoke is an audit entry, written when it ends: its turn's
	// status, or that the stream ended first (and the turn was cancelled).
	defer func() {
		e := entry(p, remoteOf(r), ActInvoke)
		e.Session, e.Target = string(id), invokeID
		switch {
		case out.finished:
			e.Detail = fmt.Sprintf("prompt seq %d, turn %d %s", seq, out.turn, out.status)
			if out.status != session.TurnOK {
				e.Outcome = audit.Failed
			}
		default:
			e.Outcome, e.Detail = audit.Failed, fmt.Sprintf("prompt seq %d: the stream ended before the turn did; the turn is cancelled", seq)
		}
		s.record(r.Context(), e)
	}()
	// From here the prompt is durable: however the stream ends, its turn
	// is cancelled unless it has finished.
	defer func() {
		if !out.finished {
			s.cancelPrompt(context.WithoutCancel(r.Context()), p, id, seq)
		}
	}()
	rec, _ := json.Marshal(invokeRecord{Session: id, PromptSeq: seq, User: p.User, Gateway: s.id, Started: session.Time{Time: time.Now()}})
	if err := hold.Put(ctx, invokeKey(invokeID), rec); err != nil {
		s.fail(w, r, err)
		return
	}
	f := &feed{s: s, p: p, id: id, w: wt, access: a, answered: true}
	if a.entry != nil {
		f.owner = a.entry.Owner
	}
	first, err := f.open(ctx, seq)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	f.roleSeq = first.LastSeq

	s.metrics.conns.WithLabelValues("invoke").Inc()
	defer s.metrics.conns.WithLabelValues("invoke").Dec()
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	h.Set(HeaderInvokeID, invokeID)
	w.WriteHeader(http.StatusOK)
	out.sseSink = &sseSink{w: w, rc: http.NewResponseController(w), timeout: s.writeTimeout}
	defer func() { _ = out.rc.SetWriteDeadline(time.Time{}) }() // the connection may serve more requests.
	if err := out.flush(); err != nil {
		return
	}
	var end ending
	if err = f.replay(ctx, first, out); err != nil {
		end, err = f.failed(err)
	} else if !out.finished {
		end, err = f.pump(ctx, out)
	}
	if out.finished {
		return
	}
	// The turn did not finish: say why, as an error event, if the client
	// is still there to read it.
	switch {
	case err != nil:
		s.log.Debug("invoke stream ended", "session", string(id), "err", err)
		_ = out.write("error", mustJSON(session.AsError(err)))
	case end.reason != "" && r.Context().Err() == nil:
		code := session.CodeUnavailable
		if end.reason == reasonRevoked {
			code = session.CodeForbidden
		}
		_ = out.write("error", mustJSON(session.Errorf(code, "%s: the turn is cancelled", end.reason)))
	}
	_ = out.flush()
}

// driverAccess checks that p may drive id: by the catalog, or, when the
// catalog denies it (the catalog lags behind a session just created or a
// member just added), by the session's actor if it is active.
func (s *Server) driverAccess(ctx context.Context, p session.Principal, id session.ID) (access, error) {
	a, err := s.check(ctx, p, id, session.ActDrive)
	if err != nil || a.deny == nil {
		return a, err
	}
	reply, err := s.call(ctx, p, id, session.Command{Op: session.OpInfo}, false)
	switch {
	case errors.Is(err, errNotActive):
		return a, a.deny
	case err != nil:
		return a, err
	case reply.Session == nil:
		return a, session.Errorf(session.CodeInternal, "info reply of session %s has no session", id)
	}
	return a, session.Authorize(reply.Session.Role, session.ActDrive)
}

// cancelPrompt cancels the turn of the prompt at seq, running or queued.
// A turn that has finished, or a session that is no longer active (so runs
// nothing), needs nothing.
func (s *Server) cancelPrompt(ctx context.Context, p session.Principal, id session.ID, seq session.Seq) {
	_, err := s.call(ctx, p, id, session.Command{Op: session.OpCancel, PromptSeq: seq}, false)
	if err != nil && !errors.Is(err, errNotActive) && !errors.Is(err, session.ErrConflict) {
		s.log.Warn("cancel the turn of a closed invoke", "session", string(id), "seq", seq, "err", err)
	}
}

// cancelInvoke serves POST /v1/sessions/{id}/invoke/cancel {"invoke_id"} →
// 202 {}: it cancels the invoke's turn, running or queued, whichever
// gateway streams it; that stream then ends with "exit" status cancelled.
func (s *Server) cancelInvoke(w http.ResponseWriter, r *http.Request, p session.Principal) {
	id := session.ID(r.PathValue("id"))
	var body api.InvokeCancel
	if err := decodeBody(w, r, &body, false); err != nil {
		s.fail(w, r, err)
		return
	}
	if body.InvokeID == "" {
		s.fail(w, r, session.Errorf(session.CodeBadRequest, `body needs "invoke_id": the Atrium-Invoke-Id header or start event of the invoke`))
		return
	}
	if _, err := s.check(r.Context(), p, id, session.ActRead); err != nil {
		s.fail(w, r, err)
		return
	}
	v, ok, err := s.inv.store.Lookup(r.Context(), invokeKey(body.InvokeID))
	var rec invokeRecord
	if err == nil && ok {
		err = json.Unmarshal(v, &rec)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if !ok || rec.Session != id {
		s.fail(w, r, session.Errorf(session.CodeNotFound, "no invoke %s is running on session %s: it has finished, or never existed", body.InvokeID, id))
		return
	}
	_, err = s.do(r, p, id, session.ActDrive, session.Command{Op: session.OpCancel, PromptSeq: rec.PromptSeq})
	if errors.Is(err, session.ErrConflict) {
		err = session.Errorf(session.CodeConflict, "invoke %s has already finished", body.InvokeID)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeRawJSON(w, http.StatusAccepted, []byte("{}\n"))
}

// admitPrompt enforces the tenant quotas on a prompt to a session: awake sandboxes
// and turns per hour. It counts the turn. A caller the catalog does not let
// drive id is left to the session to refuse, uncounted.
func (s *Server) admitPrompt(ctx context.Context, a access) error {
	if a.entry == nil || a.deny != nil {
		return nil
	}
	if s.inv.sandboxes > 0 && !awake(a.entry.Sandbox) {
		n, err := s.awakeSandboxes(ctx, a.entry.Tenant)
		if err != nil {
			return err
		}
		if n >= s.inv.sandboxes {
			return &quota.Exceeded{What: "sandboxes", Scope: quota.ScopeTenant, Limit: s.inv.sandboxes, Wait: DefaultSandboxRetryAfter}
		}
	}
	return s.inv.store.Charge(ctx, "turns", quota.ScopeTenant, a.entry.Tenant, s.inv.turns)
}

// checkPromptQuota is admitPrompt for the prompt paths that have not read
// the catalog yet (POST /messages).
func (s *Server) checkPromptQuota(ctx context.Context, p session.Principal, id session.ID) error {
	if s.inv.sandboxes <= 0 && s.inv.turns <= 0 {
		return nil
	}
	a, err := s.check(ctx, p, id, session.ActDrive)
	if err != nil {
		return nil // the prompt's own check reports it
	}
	return s.admitPrompt(ctx, a)
}

// awake reports whether a sandbox in state st holds a machine.
func awake(st session.SandboxState) bool {
	switch st {
	case session.SandboxProvisioning, session.SandboxRestoring, session.SandboxReady, session.SandboxSaving:
		return true
	}
	return false
}

// awakeSandboxes counts the sessions of tenant whose sandbox is awake, as
// the catalog says: from the cache, else from the bucket.
func (s *Server) awakeSandboxes(ctx context.Context, tenant string) (int, error) {
	if n, ok := s.cache.countAwake(tenant); ok {
		return n, nil
	}
	kv, err := s.catalog(ctx)
	if err != nil {
		return 0, catalogError(err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.reqTimeout)
	defer cancel()
	wa, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return 0, catalogError(fmt.Errorf("watch catalog: %w", err))
	}
	defer func() { _ = wa.Stop() }()
	n := 0
	for {
		select {
		case <-ctx.Done():
			return 0, catalogError(fmt.Errorf("read catalog: %w", ctx.Err()))
		case e, ok := <-wa.Updates():
			if !ok {
				return 0, catalogError(errors.New("read catalog: watcher stopped"))
			}
			if e == nil {
				return n, nil
			}
			var entry session.CatalogEntry
			if json.Unmarshal(e.Value(), &entry) == nil && entry.Tenant == tenant && awake(entry.Sandbox) {
				n++
			}
		}
	}
}

// countAwake counts the cached sessions of tenant with an awake sandbox,
// and reports whether the cache is ready.
func (c *catalogCache) countAwake(tenant string) (int, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if !c.ready {
		return 0, false
	}
	n := 0
	for _, it := range c.entries {
		if it.entry != nil && it.entry.Tenant == tenant && awake(it.entry.Sandbox) {
			n++
		}
	}
	return n, true
}

// refuse answers with err, and for a quota refusal with the structured
// body: {"error":{"code":"too_many_requests","message","quota","limit",
// "scope","retry_after_s"}} and Retry-After.
func (s *Server) refuse(w http.ResponseWriter, r *http.Request, err error) {
	var ex *quota.Exceeded
	if !errors.As(err, &ex) {
		s.fail(w, r, err)
		return
	}
	secs := ex.RetryAfterSeconds()
	w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	writeJSON(w, http.StatusTooManyRequests, api.QuotaRefusal{Error: api.QuotaError{
		Code: session.CodeTooManyRequests, Message: ex.Message(), Quota: ex.What,
		Limit: ex.Limit, Scope: ex.Scope, RetryAfterS: secs,
	}})
}

// invokeSink writes the events of one prompt's turn as the invoke's
// Server-Sent Events, and calls done once it has written "exit".
type invokeSink struct {
	*sseSink
	invokeID string
	id       session.ID
	seq      session.Seq // the prompt's
	turn     int64       // 0 until the prompt's turn starts
	done     func()
	finished bool
	status   session.TurnStatus // the turn's, once finished
}

// turnData holds the fields of the event data kinds an invoke reads.
type turnData struct {
	Turn       int64              `json:"turn"`
	PromptSeq  session.Seq        `json:"prompt_seq"`
	Stream     string             `json:"stream"`
	Text       string             `json:"text"`
	Status     session.TurnStatus `json:"status"`
	ExitCode   int                `json:"exit_code"`
	DurationMS int64              `json:"duration_ms"`
}

func (k *invokeSink) event(ev *event) error {
	if k.finished {
		return nil
	}
	switch ev.kind {
	case session.KindTurnStarted, session.KindOutput, session.KindAgent, session.KindApprovalRequested, session.KindTurnFinished:
	case session.KindAgentMessage, session.KindToolCall, session.KindToolCallUpdate, session.KindPlan:
	case session.KindError:
		if k.turn == 0 {
			return nil
		}
	default:
		return nil
	}
	var e struct {
		Data json.RawMessage `json:"data"`
	}
	var d turnData
	if err := json.Unmarshal(ev.raw, &e); err != nil || json.Unmarshal(e.Data, &d) != nil {
		return session.Errorf(session.CodeInternal, "event %d of session %s: undecodable %s data", ev.seq, k.id, ev.kind)
	}
	if k.turn == 0 {
		if ev.kind != session.KindTurnStarted || d.PromptSeq != k.seq {
			return nil
		}
		k.turn = d.Turn
		return k.write("start", mustJSON(api.InvokeStart{InvokeID: k.invokeID, Session: k.id, Seq: k.seq, Turn: k.turn}))
	}
	if ev.kind == session.KindError { // an error while the turn runs, e.g. its harness could not start
		return k.write("error", e.Data)
	}
	if d.Turn != k.turn {
		return nil
	}
	switch ev.kind {
	case session.KindOutput:
		stream := "stdout"
		if d.Stream == "stderr" {
			stream = "stderr"
		}
		return k.write(stream, mustJSON(api.InvokeText{Text: d.Text}))
	case session.KindAgent, session.KindApprovalRequested,
		session.KindAgentMessage, session.KindToolCall, session.KindToolCallUpdate, session.KindPlan:
		return k.write(string(ev.kind), e.Data)
	case session.KindTurnFinished:
		if err := k.write("exit", mustJSON(api.InvokeExit{ExitCode: d.ExitCode, Status: d.Status, DurationMS: d.DurationMS})); err != nil {
			return err
		}
		if err := k.flush(); err != nil {
			return err
		}
		k.finished, k.status = true, d.Status
		k.done()
	}
	return nil
}

// write writes one event named name with data.
func (k *invokeSink) write(name string, data []byte) error {
	k.deadline()
	if _, err := k.w.Write([]byte("event: " + name)); err != nil {
		return &writeFailed{err: err}
	}
	return k.data(data)
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic("gateway: encode " + fmt.Sprintf("%T", v) + ": " + err.Error())
	}
	return b
}
