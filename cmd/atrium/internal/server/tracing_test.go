package server_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/session"
)

// otlpReceiver is an in-process OTLP/HTTP collector: it decodes every
// ExportTraceServiceRequest posted to /v1/traces and keeps the spans and the
// raw bodies.
type otlpReceiver struct {
	srv *httptest.Server

	mu     sync.Mutex
	spans  []*tracepb.Span // guarded by mu
	bodies [][]byte        // guarded by mu
	names  []string        // service.name of each resource, guarded by mu
}

func startReceiver(t testing.TB) *otlpReceiver {
	t.Helper()
	r := &otlpReceiver{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" {
			http.Error(w, "not an OTLP traces export", http.StatusNotFound)
			return
		}
		body, err := io.ReadAll(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var ex collectortrace.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &ex); err != nil {
			t.Errorf("receiver: decode export request: %v", err)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		r.bodies = append(r.bodies, body)
		for _, rs := range ex.ResourceSpans {
			for _, a := range rs.GetResource().GetAttributes() {
				if a.Key == "service.name" {
					r.names = append(r.names, a.GetValue().GetStringValue())
				}
			}
			for _, ss := range rs.ScopeSpans {
				r.spans = append(r.spans, ss.Spans...)
			}
		}
		r.mu.Unlock()
		resp, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(resp)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

// endpoint is the receiver's host:port.
func (r *otlpReceiver) endpoint() string { return strings.TrimPrefix(r.srv.URL, "http://") }

func (r *otlpReceiver) snapshot() ([]*tracepb.Span, [][]byte, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*tracepb.Span(nil), r.spans...), append([][]byte(nil), r.bodies...), append([]string(nil), r.names...)
}

func attr(s *tracepb.Span, key string) *commonpb.AnyValue {
	for _, a := range s.Attributes {
		if a.Key == key {
			return a.Value
		}
	}
	return nil
}

// TestServer_TracePromptToSandbox is issue 9's tracing test: one prompt,
// posted to the real server with tracing on, reaches an in-process OTLP
// receiver as one trace whose spans link the gateway's request → its NATS
// request → the node's command → the turn → the sandbox exec (and the
// sandbox open and workspace restore/save under the turn), with session,
// user and turn attributes and no trace of the prompt's text.
func TestServer_TracePromptToSandbox(t *testing.T) {
	t.Parallel()
	rcv := startReceiver(t)
	s := startStack(t, func(c *server.Config) {
		c.Tracing = server.Tracing{Endpoint: rcv.endpoint(), Protocol: server.TracingHTTP, Insecure: true}
	})
	alice := s.as("alice")
	sess := alice.create("traced", testHarness)
	const secret = "tracing-prompt-text-5f1c9"
	alice.prompt(sess.ID, secret)
	if fin := alice.waitTurn(sess.ID, 1); fin.Status != session.TurnOK {
		t.Fatalf("turn 1 finished %+v, want ok", fin)
	}
	// A prompt sent as a WebSocket frame carries its own trace context too.
	w := alice.watch(sess.ID, 0)
	w.send(map[string]any{"type": "prompt", "text": "ws-" + secret, "client_id": "ws-1"})
	if f := w.nextNonEvent("ack"); f.Type != session.FrameAck {
		t.Fatalf("WebSocket prompt got %s, want an ack", f.raw)
	}
	if fin := alice.waitTurn(sess.ID, 2); fin.Status != session.TurnOK {
		t.Fatalf("turn 2 finished %+v, want ok", fin)
	}
	// Close flushes the batch processor; the test's cleanup closes again.
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	if err := s.srv.Close(ctx); err != nil {
		t.Fatalf("close server: %v", err)
	}

	spans, bodies, names := rcv.snapshot()
	for _, b := range bodies {
		if bytes.Contains(b, []byte(secret)) {
			t.Fatalf("an exported span batch contains the prompt text")
		}
	}
	if len(names) == 0 || names[0] != server.ServiceName {
		t.Fatalf("resource service.name %q, want %q", names, server.ServiceName)
	}
	byID := map[string]*tracepb.Span{}
	for _, sp := range spans {
		byID[hex.EncodeToString(sp.SpanId)] = sp
	}
	// find returns the only span named name whose parent is parent (nil:
	// any parent) and that belongs to sess.
	find := func(name string, parent *tracepb.Span) *tracepb.Span {
		t.Helper()
		var found []*tracepb.Span
		for _, sp := range spans {
			if sp.Name != name {
				continue
			}
			if parent != nil && !bytes.Equal(sp.ParentSpanId, parent.SpanId) {
				continue
			}
			if v := attr(sp, "atrium.session"); v == nil || v.GetStringValue() != string(sess.ID) {
				continue
			}
			found = append(found, sp)
		}
		if len(found) != 1 {
			var all []string
			for _, sp := range spans {
				all = append(all, sp.Name+"<-"+parentName(byID, sp))
			}
			t.Fatalf("%d spans %q of session %s under the expected parent, want 1; spans: %s", len(found), name, sess.ID, strings.Join(all, ", "))
		}
		return found[0]
	}

	req := find("POST /v1/sessions/{id}/messages", nil)
	if len(req.ParentSpanId) != 0 || req.Kind != tracepb.Span_SPAN_KIND_SERVER {
		t.Fatalf("request span: parent %x kind %v, want a server root span", req.ParentSpanId, req.Kind)
	}
	if v := attr(req, "atrium.user"); v.GetStringValue() != "alice" {
		t.Fatalf("request span atrium.user %v, want alice", v)
	}
	if v := attr(req, "http.response.status_code"); v.GetIntValue() != http.StatusAccepted {
		t.Fatalf("request span status code %v, want 202", v)
	}
	natsReq := findChild(t, spans, "nats request cmd", req)
	if natsReq.Kind != tracepb.Span_SPAN_KIND_CLIENT || attr(natsReq, "atrium.op").GetStringValue() != "prompt" {
		t.Fatalf("NATS request span: kind %v op %v, want a client span of op prompt", natsReq.Kind, attr(natsReq, "atrium.op"))
	}
	cmd := find("atrium.command prompt", natsReq)
	if cmd.Kind != tracepb.Span_SPAN_KIND_SERVER || attr(cmd, "atrium.user").GetStringValue() != "alice" {
		t.Fatalf("command span: kind %v user %v, want a server span of alice", cmd.Kind, attr(cmd, "atrium.user"))
	}
	turn := find("atrium.turn", cmd)
	if v := attr(turn, "atrium.turn"); v.GetIntValue() != 1 {
		t.Fatalf("turn span atrium.turn %v, want 1", v)
	}
	if v := attr(turn, "atrium.turn.status"); v.GetStringValue() != string(session.TurnOK) {
		t.Fatalf("turn span status %v, want ok", v)
	}
	exec := find("sandbox.exec", turn)
	if v := attr(exec, "atrium.exit_code"); v == nil || v.GetIntValue() != 0 {
		t.Fatalf("exec span exit code %v, want 0", v)
	}
	find("sandbox.open", turn)
	find("workspace.restore", turn)
	save := find("workspace.save", turn)
	if v := attr(save, "atrium.workspace.bytes"); v == nil {
		t.Fatalf("workspace.save span has no atrium.workspace.bytes attribute")
	}
	// The WebSocket prompt: a NATS request span of its own (no HTTP request
	// is its parent: the upgrade ended long before), the node's command span
	// under it, and turn 2 under that.
	var wsCmd *tracepb.Span
	for _, sp := range spans {
		if sp.Name != "atrium.command prompt" || bytes.Equal(sp.SpanId, cmd.SpanId) {
			continue
		}
		if p := byID[hex.EncodeToString(sp.ParentSpanId)]; p != nil && p.Name == "nats request cmd" && !bytes.Equal(p.SpanId, natsReq.SpanId) {
			wsCmd = sp
		}
	}
	if wsCmd == nil {
		t.Fatalf("no command span for the WebSocket prompt under a NATS request span of its own")
	}
	if v := attr(find("atrium.turn", wsCmd), "atrium.turn"); v.GetIntValue() != 2 {
		t.Fatalf("the WebSocket prompt's turn span is turn %v, want 2", v)
	}
	for _, sp := range []*tracepb.Span{natsReq, cmd, turn, exec, save} {
		if !bytes.Equal(sp.TraceId, req.TraceId) {
			t.Fatalf("span %q is in trace %x, want the request's %x", sp.Name, sp.TraceId, req.TraceId)
		}
	}
}

// findChild returns the only span named name under parent (NATS request
// spans carry a subject rather than a session attribute).
func findChild(t testing.TB, spans []*tracepb.Span, name string, parent *tracepb.Span) *tracepb.Span {
	t.Helper()
	var found []*tracepb.Span
	for _, sp := range spans {
		if sp.Name == name && bytes.Equal(sp.ParentSpanId, parent.SpanId) {
			found = append(found, sp)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d spans %q under %q, want 1", len(found), name, parent.Name)
	}
	return found[0]
}

func parentName(byID map[string]*tracepb.Span, sp *tracepb.Span) string {
	if p := byID[hex.EncodeToString(sp.ParentSpanId)]; p != nil {
		return p.Name
	}
	if len(sp.ParentSpanId) == 0 {
		return "root"
	}
	return "?"
}
