package hooks

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/atriumhq/atrium/gateway/channel"
	"github.com/atriumhq/atrium/session"
	"github.com/nats-io/nats.go/jetstream"
)

// maxIdempotencyKey bounds the Idempotency-Key header.
const maxIdempotencyKey = 255

// handleTimeout bounds the handling of one request.
const handleTimeout = 30 * time.Second

// idemStale is how long a request may stay "in progress" before a repeat
// of it is handled again (its gateway died).
const idemStale = time.Minute

// Answer is the body of a successful inbound webhook (202).
type Answer struct {
	Session session.ID  `json:"session"`
	Seq     session.Seq `json:"seq"`
	// Created is true when the request started the session.
	Created bool   `json:"created"`
	URL     string `json:"url,omitempty"`
}

// idemRecord is what the idempotency bucket keeps of a request.
type idemRecord struct {
	Done     bool            `json:"done"`
	At       time.Time       `json:"at"`
	BodyHash string          `json:"body_hash"`
	Status   int             `json:"status,omitempty"`
	Response json.RawMessage `json:"response,omitempty"`
}

// Handler serves POST /v1/hooks/{name} (the pattern must bind "name").
// Sessions runs the commands, as the hook's user; svc subscribes the
// sessions a hook starts to its DeliverTo target and links to them.
func (h *Hooks) Handler(sessions channel.Sessions, svc *channel.Service) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.serve(w, r, sessions, svc)
	})
}

func (h *Hooks) serve(w http.ResponseWriter, r *http.Request, sessions channel.Sessions, svc *channel.Service) {
	name := r.PathValue("name")
	hk := h.hooks[name]
	if hk == nil {
		writeError(w, session.Errorf(session.CodeNotFound, "there is no webhook named %q", name))
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, session.MaxFrameBytes))
	if err != nil {
		writeError(w, session.Errorf(session.CodePayloadTooLarge, "request body is larger than %d bytes", session.MaxFrameBytes))
		return
	}
	sig, err := Verify([]byte(hk.Secret), r.Header.Get(SignatureHeader), body, h.cfg.Now(), h.cfg.Window)
	if err != nil {
		h.log.Warn("hooks: refused an inbound webhook", "hook", name, "why", err.Error())
		writeError(w, session.Errorf(session.CodeUnauthenticated, "%s", strings.TrimPrefix(err.Error(), "hooks: ")))
		return
	}
	var data map[string]any
	if err := json.Unmarshal(body, &data); err != nil {
		writeError(w, session.Errorf(session.CodeBadRequest, "the body must be a JSON object: %v", err))
		return
	}
	key := r.Header.Get(IdempotencyHeader)
	if len(key) > maxIdempotencyKey {
		writeError(w, session.Errorf(session.CodeBadRequest, "%s is longer than %d characters", IdempotencyHeader, maxIdempotencyKey))
		return
	}
	if key == "" {
		key = "sig:" + sig // an exact replay inside the window gets the same answer
	}
	// Not cancelled by the client going away: what was started is finished
	// (and its answer kept for a repeat).
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), handleTimeout)
	defer cancel()
	idemKey := name + "." + digest(key)
	bodyHash := digest(string(body))
	rev, replay, err := h.claim(ctx, idemKey, bodyHash)
	if err != nil {
		writeError(w, err)
		return
	}
	if replay != nil {
		w.Header().Set("Idempotent-Replayed", "true")
		writeRaw(w, replay.Status, replay.Response)
		return
	}
	ans, err := h.handle(ctx, hk, data, idemKey, sessions, svc)
	if err != nil {
		e := session.AsError(err)
		if e.Code == session.CodeInternal {
			h.log.Error("hooks: inbound webhook", "hook", name, "err", err)
		}
		if e.Code == session.CodeInternal || e.Code == session.CodeUnavailable || e.Code == session.CodeTooManyRequests {
			h.release(ctx, idemKey, rev) // a repeat may succeed
			writeError(w, err)
			return
		}
		b, _ := json.Marshal(session.ErrorBody{Error: e})
		h.finish(ctx, idemKey, rev, bodyHash, e.Code.HTTPStatus(), b)
		writeRaw(w, e.Code.HTTPStatus(), b)
		return
	}
	b, _ := json.Marshal(ans)
	h.finish(ctx, idemKey, rev, bodyHash, http.StatusAccepted, b)
	writeRaw(w, http.StatusAccepted, b)
}

// handle turns the body into a prompt.
func (h *Hooks) handle(ctx context.Context, hk *hook, data map[string]any, idemKey string, sessions channel.Sessions, svc *channel.Service) (Answer, error) {
	prompt, err := render(hk.prompt, data)
	if err != nil {
		return Answer{}, session.Errorf(session.CodeBadRequest, "the body does not fit webhook %s: %v", hk.Name, templateError(err))
	}
	prompt = strings.TrimSpace(prompt)
	if prompt == "" {
		return Answer{}, session.Errorf(session.CodeBadRequest, "the prompt made from the body is empty")
	}
	if len(prompt) > session.MaxTextBytes {
		return Answer{}, session.Errorf(session.CodePayloadTooLarge, "the prompt is longer than %d bytes", session.MaxTextBytes)
	}
	p := session.Principal{User: hk.User, Tenant: hk.Tenant, Via: "webhook"}
	var ans Answer
	if hk.key != nil {
		k, err := render(hk.key, data)
		if err != nil {
			return Answer{}, session.Errorf(session.CodeBadRequest, "the body does not fit webhook %s: %v", hk.Name, templateError(err))
		}
		ans.Session, err = h.keyed(ctx, hk.Name+"."+digest(k))
		if err != nil {
			return Answer{}, err
		}
	}
	if ans.Session == "" {
		title, err := render(hk.title, data)
		if err != nil {
			return Answer{}, session.Errorf(session.CodeBadRequest, "the body does not fit webhook %s: %v", hk.Name, templateError(err))
		}
		if ans.Session, err = h.start(ctx, hk, p, data, clipTitle(title), sessions, svc); err != nil {
			return Answer{}, err
		}
		ans.Created = true
	}
	ans.Seq, err = sessions.Prompt(ctx, p, ans.Session, prompt, "hook:"+idemKey[len(hk.Name)+1:][:24])
	if err != nil {
		return Answer{}, err
	}
	if svc != nil {
		ans.URL = svc.Link(ans.Session)
	}
	return ans, nil
}

// start creates the session of a request, records it under its key (if
// the hook has keys) and subscribes it to the hook's target.
func (h *Hooks) start(ctx context.Context, hk *hook, p session.Principal, data map[string]any, title string, sessions channel.Sessions, svc *channel.Service) (session.ID, error) {
	sess, err := sessions.Create(ctx, p, title)
	if err != nil {
		return "", err
	}
	id := sess.ID
	if hk.key != nil {
		k, _ := render(hk.key, data) // rendered once already
		bound, err := h.bindKey(ctx, hk.Name+"."+digest(k), id)
		if err != nil {
			return "", err
		}
		if bound != id { // another request with the key won
			_ = sessions.Delete(ctx, p, id)
			return bound, nil
		}
	}
	if hk.DeliverTo != "" && svc != nil {
		if err := svc.Subscribe(ctx, p, id, channel.Subscription{Target: hk.DeliverTo, Kinds: hk.DeliverKinds}); err != nil {
			return "", fmt.Errorf("subscribe session %s to %s: %w", id, hk.DeliverTo, err)
		}
	}
	return id, nil
}

// keyed returns the session recorded under key, or "".
func (h *Hooks) keyed(ctx context.Context, key string) (session.ID, error) {
	kv, err := h.open(ctx, &h.keys)
	if err != nil {
		return "", unavailable(err)
	}
	ctx, cancel := context.WithTimeout(ctx, h.cfg.Timeout)
	defer cancel()
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", nil
	}
	if err != nil {
		return "", unavailable(err)
	}
	return session.ID(e.Value()), nil
}

// bindKey records id under key unless a session is there already, and
// returns the session that is.
func (h *Hooks) bindKey(ctx context.Context, key string, id session.ID) (session.ID, error) {
	kv, err := h.open(ctx, &h.keys)
	if err != nil {
		return "", unavailable(err)
	}
	cctx, cancel := context.WithTimeout(ctx, h.cfg.Timeout)
	defer cancel()
	if _, err := kv.Create(cctx, key, []byte(id)); errors.Is(err, jetstream.ErrKeyExists) {
		return h.keyed(ctx, key)
	} else if err != nil {
		return "", unavailable(err)
	}
	return id, nil
}

// claim records that the request idemKey is being handled. It returns the
// stored answer if the request was handled already, a conflict if it is
// being handled or was made with another body.
func (h *Hooks) claim(ctx context.Context, idemKey, bodyHash string) (uint64, *idemRecord, error) {
	kv, err := h.open(ctx, &h.idem)
	if err != nil {
		return 0, nil, unavailable(err)
	}
	ctx, cancel := context.WithTimeout(ctx, h.cfg.Timeout)
	defer cancel()
	val, _ := json.Marshal(idemRecord{At: h.cfg.Now(), BodyHash: bodyHash})
	rev, err := kv.Create(ctx, idemKey, val)
	if err == nil {
		return rev, nil, nil
	}
	if !errors.Is(err, jetstream.ErrKeyExists) {
		return 0, nil, unavailable(err)
	}
	e, err := kv.Get(ctx, idemKey)
	if err != nil {
		return 0, nil, unavailable(err)
	}
	var rec idemRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return 0, nil, unavailable(err)
	}
	switch {
	case rec.BodyHash != bodyHash:
		return 0, nil, session.Errorf(session.CodeConflict, "this %s was used with a different body", IdempotencyHeader)
	case rec.Done:
		return 0, &rec, nil
	case h.cfg.Now().Sub(rec.At) < idemStale:
		return 0, nil, retryLater{err: session.Errorf(session.CodeConflict, "a request with this %s is being handled: repeat it in a moment", IdempotencyHeader)}
	}
	rev, err = kv.Update(ctx, idemKey, val, e.Revision())
	if err != nil {
		return 0, nil, retryLater{err: session.Errorf(session.CodeConflict, "a request with this %s is being handled: repeat it in a moment", IdempotencyHeader)}
	}
	return rev, nil, nil
}

func (h *Hooks) finish(ctx context.Context, idemKey string, rev uint64, bodyHash string, status int, resp []byte) {
	kv, err := h.open(ctx, &h.idem)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, h.cfg.Timeout)
	defer cancel()
	val, _ := json.Marshal(idemRecord{Done: true, At: h.cfg.Now(), BodyHash: bodyHash, Status: status, Response: resp})
	if _, err := kv.Update(ctx, idemKey, val, rev); err != nil {
		h.log.Warn("hooks: store the answer of a request", "err", err)
	}
}

func (h *Hooks) release(ctx context.Context, idemKey string, rev uint64) {
	kv, err := h.open(ctx, &h.idem)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, h.cfg.Timeout)
	defer cancel()
	_ = kv.Delete(ctx, idemKey, jetstream.LastRevision(rev))
}

// retryLater is a conflict that also says when to come back.
type retryLater struct{ err *session.Error }

func (e retryLater) Error() string           { return e.err.Error() }
func (e retryLater) Unwrap() error           { return e.err }
func (retryLater) RetryAfter() time.Duration { return time.Second }

func unavailable(err error) error {
	return fmt.Errorf("%w: %w", session.Errorf(session.CodeUnavailable, "webhook state is unavailable: try again shortly"), err)
}

// templateError shortens text/template's errors to what the sender can act
// on ("map has no entry for key \"text\"").
func templateError(err error) string {
	s := err.Error()
	if i := strings.LastIndex(s, ": "); i >= 0 {
		return s[i+2:]
	}
	return s
}

func digest(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:16])
}

func clipTitle(s string) string {
	s = strings.TrimSpace(s)
	if len(s) <= session.MaxTitleBytes {
		return s
	}
	n := session.MaxTitleBytes
	for n > 0 && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n]
}

// writeError answers with the wire contract's error body.
func writeError(w http.ResponseWriter, err error) {
	e := session.AsError(err)
	var ra interface{ RetryAfter() time.Duration }
	if errors.As(err, &ra) {
		w.Header().Set("Retry-After", strconv.Itoa(max(1, int(ra.RetryAfter()/time.Second))))
	}
	b, _ := json.Marshal(session.ErrorBody{Error: e})
	writeRaw(w, e.Code.HTTPStatus(), b)
}

func writeRaw(w http.ResponseWriter, status int, b []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
