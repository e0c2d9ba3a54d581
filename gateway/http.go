package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/atriumhq/atrium/gateway/audit"
	"github.com/atriumhq/atrium/gateway/auth"
	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/web"
)

// authed wraps a handler that needs an authenticated caller. It also refuses
// state-changing requests that a browser may have been tricked into sending
// with the login cookie: those from foreign origins, and cookie-authenticated
// ones without an Origin header.
func (s *Server) authed(h func(http.ResponseWriter, *http.Request, session.Principal)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, err := s.auth.Authenticate(r)
		if err != nil {
			s.refuseAuth(w, r, err)
			return
		}
		if !safeMethod(r.Method) {
			var refused *session.Error
			switch {
			case !s.originAllowed(r):
				refused = session.Errorf(session.CodeForbidden,
					"cross-origin request from %s refused: add it to the gateway's allowed origins", r.Header.Get("Origin"))
			case p.Via == session.ViaCookie && r.Header.Get("Origin") == "":
				refused = session.Errorf(session.CodeForbidden,
					"a request authenticated by the login cookie must carry an Origin header: "+
						"send it from the web UI, or use Authorization: Bearer <token> from scripts")
			}
			if refused != nil {
				e := entry(p, remoteOf(r), audit.ActDenied)
				e.Outcome, e.Detail = audit.Denied, r.Method+" "+r.URL.Path+": "+refused.Message
				if ok, _ := s.denials.allow(p.Tenant+"\x00"+p.User+"\x00\x00"+refused.Message, time.Now()); ok {
					s.record(r.Context(), e)
				}
				writeError(w, refused)
				return
			}
		}
		traceUser(r, p)
		if a, ok := r.Context().Value(accessKey{}).(*accessNote); ok {
			a.user, a.tenant = p.User, p.Tenant
		}
		h(w, r, p)
	})
}

// loopbackHostOnly refuses requests whose Host header is not a loopback
// name. It guards a server whose identity is the dev identity: that trusts
// whoever connects from this machine, and a web page of any site whose name
// its attacker rebinds to 127.0.0.1 (DNS rebinding) would otherwise reach it
// from the victim's browser with the attacker's name as its Host.
func loopbackHostOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !auth.LoopbackHost(r.Host) {
			writeError(w, session.Errorf(session.CodeForbidden,
				"this dev server answers only requests addressed to localhost, 127.0.0.1 or [::1], not %q: "+
					"open the URL `atrium dev` printed (a dev server trusts everyone on this machine; "+
					"use `atrium serve` with OIDC or API tokens to serve a network)", r.Host))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// refuseAuth answers a request whose authentication failed: 401 with a
// WWW-Authenticate challenge that says why, 429 with Retry-After for a
// throttled address, or the error's own code. Failed authentications are
// audited; requests without credentials are not failures.
func (s *Server) refuseAuth(w http.ResponseWriter, r *http.Request, err error) {
	e := session.AsError(err)
	switch e.Code {
	case session.CodeInternal:
		s.log.Error("authenticate", "err", err)
	case session.CodeUnavailable:
		s.log.Warn("authenticate", "err", err)
	case session.CodeUnauthenticated:
		w.Header().Set("WWW-Authenticate", auth.Challenge(err))
	}
	failed := e.Code == session.CodeTooManyRequests ||
		e.Code == session.CodeUnauthenticated && (!errors.Is(err, auth.ErrNoCredentials) || r.Header.Get("Authorization") != "")
	if failed || e.Code == session.CodeInternal || e.Code == session.CodeUnavailable {
		s.metrics.authFailed(err)
	}
	if failed {
		s.auditAuthFailed(r, err)
	}
	writeError(w, err)
}

func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions
}

// originAllowed reports whether the request's Origin, if any, is the
// request's own host or matches one of the configured patterns. It follows
// the rules of websocket.AcceptOptions.OriginPatterns.
func (s *Server) originAllowed(r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return true
	}
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return false
	}
	if strings.EqualFold(u.Host, r.Host) {
		return true
	}
	for _, p := range s.origins {
		target := u.Host
		if strings.Contains(p, "://") {
			target = u.Scheme + "://" + u.Host
		}
		if ok, err := path.Match(strings.ToLower(p), strings.ToLower(target)); err == nil && ok {
			return true
		}
	}
	return false
}

// secure sets security headers on every response. Their values are shared
// by every response: net/http only reads them, and a handler that changes
// one replaces its slice.
func (s *Server) secure(next http.Handler) http.Handler {
	headers := http.Header{
		"X-Content-Type-Options":     {"nosniff"},
		"X-Frame-Options":            {"DENY"},
		"Referrer-Policy":            {"no-referrer"},
		"Cross-Origin-Opener-Policy": {"same-origin"},
		"Content-Security-Policy":    {web.CSP},
	}
	noStore := []string{"no-store"}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		for k, v := range headers {
			h[k] = v
		}
		if strings.HasPrefix(r.URL.Path, "/v1/") || strings.HasPrefix(r.URL.Path, "/auth/") {
			h["Cache-Control"] = noStore
		}
		next.ServeHTTP(w, r)
	})
}

// instrument counts requests by route pattern and status code and, with
// Config.AccessLog, logs one line per request when it ends.
func (s *Server) instrument(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w}
		var note *accessNote
		if s.access != nil {
			note = &accessNote{start: time.Now()}
			r = r.WithContext(context.WithValue(r.Context(), accessKey{}, note))
		}
		next.ServeHTTP(sw, r)
		route := r.Pattern // set by the ServeMux on this request.
		if route == "" {
			route = "unmatched"
		}
		code := sw.code
		if code == 0 {
			code = http.StatusOK
		}
		s.metrics.request(route, code).Inc()
		if code == http.StatusTooManyRequests {
			s.metrics.limited.Inc()
		}
		if note != nil {
			s.logAccess(r, route, code, sw.bytes, note)
		}
	})
}

// accessKey is the context key of a request's accessNote.
type accessKey struct{}

// accessNote is what the access log learns while a request is served:
// authed fills in the caller.
type accessNote struct {
	start        time.Time
	user, tenant string
}

// logAccess writes a request's access log line. It names the route
// pattern and the path but never the query string (it may carry a cursor
// today and something sensitive tomorrow) or any header but the request
// id; a WebSocket or SSE request is logged when its stream ends.
func (s *Server) logAccess(r *http.Request, route string, code int, size int64, note *accessNote) {
	attrs := []slog.Attr{
		slog.String("method", r.Method),
		slog.String("route", route),
		slog.String("path", r.URL.Path),
		slog.Int("status", code),
		slog.Int64("bytes", size),
		slog.Float64("duration_ms", float64(time.Since(note.start).Microseconds())/1000),
		slog.String("remote", remoteOf(r)),
	}
	if id := r.Header.Get("X-Request-Id"); id != "" {
		attrs = append(attrs, slog.String("request_id", id))
	}
	if note.user != "" {
		attrs = append(attrs, slog.String("user", note.user), slog.String("tenant", note.tenant))
	}
	s.access.LogAttrs(context.WithoutCancel(r.Context()), slog.LevelInfo, "request", attrs...)
}

// statusWriter records the status code and the bytes of the body. Unwrap
// lets http.ResponseController and the WebSocket library reach the
// underlying writer's Flush and Hijack.
type statusWriter struct {
	http.ResponseWriter
	code  int
	bytes int64
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += int64(n)
	return n, err
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (s *Server) noRoute(w http.ResponseWriter, r *http.Request, _ session.Principal) {
	writeError(w, session.Errorf(session.CodeNotFound, "no route for %s %s", r.Method, r.URL.Path))
}

// fail answers with err's wire error, logging failures that are the
// gateway's or the system's rather than the caller's.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	e := session.AsError(err)
	if e.Code == session.CodeInternal || e.Code == session.CodeUnavailable {
		s.log.Warn("request failed", "route", r.Pattern, "code", string(e.Code), "err", err,
			"request_id", r.Header.Get("X-Request-Id"), "session", r.PathValue("id"))
	}
	writeError(w, err)
}

// writeError answers with the contract's error body and the code's status.
// An error of code too_many_requests sets Retry-After: from its
// RetryAfter() method if it has one, else one second. An unavailable error
// that says how long its condition lasts (RetryAfterS) sets it to that.
func writeError(w http.ResponseWriter, err error) {
	e := session.AsError(err)
	if e.Code == session.CodeUnavailable && e.RetryAfterS > 0 && w.Header().Get("Retry-After") == "" {
		w.Header().Set("Retry-After", strconv.FormatInt(e.RetryAfterS, 10))
	}
	if e.Code == session.CodeTooManyRequests && w.Header().Get("Retry-After") == "" {
		secs := int64(1)
		var ra interface{ RetryAfter() time.Duration }
		if errors.As(err, &ra) {
			secs = max(1, int64((ra.RetryAfter()+time.Second-1)/time.Second))
		}
		w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	}
	writeJSON(w, e.Code.HTTPStatus(), session.ErrorBody{Error: e})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"error":{"code":"internal","message":"internal error"}}`)
	}
	writeRawJSON(w, status, append(b, '\n'))
}

func writeRawJSON(w http.ResponseWriter, status int, b []byte) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// decodeBody decodes a strict JSON object body into v: unknown fields,
// malformed JSON and trailing data are bad requests, and a body over
// session.MaxFrameBytes is too large. An empty body leaves v as it is when
// emptyOK, and is a bad request otherwise.
func decodeBody(w http.ResponseWriter, r *http.Request, v any, emptyOK bool) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, session.MaxFrameBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return session.Errorf(session.CodePayloadTooLarge, "request body is larger than %d bytes", session.MaxFrameBytes)
		}
		return session.Errorf(session.CodeBadRequest, "read request body: %v", err)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		if emptyOK {
			return nil
		}
		return session.Errorf(session.CodeBadRequest, "request body must be a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var e *session.Error
		if errors.As(err, &e) {
			return e
		}
		return session.Errorf(session.CodeBadRequest, "invalid JSON body: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return session.Errorf(session.CodeBadRequest, "invalid JSON body: unexpected data after the object")
	}
	return nil
}

// parseSeq parses a non-negative seq query value; empty means 0.
func parseSeq(name, v string) (session.Seq, error) {
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, session.Errorf(session.CodeBadRequest, "%s must be a non-negative integer, not %q", name, v)
	}
	return n, nil
}
