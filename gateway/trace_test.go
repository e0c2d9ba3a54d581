package gateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/nats-io/nats.go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/atriumhq/atrium/session"
)

// TestTrace_Off checks that a gateway without a TracerProvider adds no
// middleware, no span and no header.
func TestTrace_Off(t *testing.T) {
	s := &Server{tracer: tracerOf(nil)}
	mux := http.NewServeMux()
	if h, ok := s.traced(mux).(*http.ServeMux); !ok || h != mux {
		t.Fatalf("traced without tracing wrapped the handler")
	}
	msg := &nats.Msg{Subject: "x", Header: nats.Header{session.HeaderUser: {"alice"}}}
	ctx := context.Background()
	got, end := s.traceRequest(ctx, msg, session.Command{Op: session.OpPrompt})
	end(nil)
	if got != ctx || len(msg.Header) != 1 {
		t.Fatalf("traceRequest without tracing changed the context or headers %v", msg.Header)
	}
}

// TestTrace_RequestToNode checks the request span (named by route, with the
// session and caller) and that the NATS request span is its child and is
// what the node reads back from the headers.
func TestTrace_RequestToNode(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	s := &Server{tracer: tracerOf(tp)}

	var msg *nats.Msg
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sessions/{id}/messages", func(w http.ResponseWriter, r *http.Request) {
		traceUser(r, session.Principal{User: "alice"})
		msg = &nats.Msg{Subject: "atrium.session.s1.cmd", Header: principalHeader(session.Principal{User: "alice"})}
		_, end := s.traceRequest(r.Context(), msg, session.Command{Op: session.OpPrompt, Text: "secret words"})
		end(nil)
		w.WriteHeader(http.StatusAccepted)
	})
	w := httptest.NewRecorder()
	s.traced(mux).ServeHTTP(w, httptest.NewRequest("POST", "/v1/sessions/s1/messages", nil))
	if w.Code != http.StatusAccepted {
		t.Fatalf("status %d", w.Code)
	}

	spans := rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want the NATS request and the HTTP request", len(spans))
	}
	natsSpan, req := spans[0], spans[1]
	if req.Name() != "POST /v1/sessions/{id}/messages" || req.SpanKind() != trace.SpanKindServer {
		t.Fatalf("request span %q kind %v", req.Name(), req.SpanKind())
	}
	want := map[string]string{"atrium.session": "s1", "atrium.user": "alice", "http.route": "POST /v1/sessions/{id}/messages"}
	for _, a := range req.Attributes() {
		if v, ok := want[string(a.Key)]; ok {
			if a.Value.AsString() != v {
				t.Errorf("request span %s=%q, want %q", a.Key, a.Value.AsString(), v)
			}
			delete(want, string(a.Key))
		}
	}
	if len(want) > 0 {
		t.Errorf("request span lacks %v", want)
	}
	if natsSpan.Parent().SpanID() != req.SpanContext().SpanID() || natsSpan.SpanKind() != trace.SpanKindClient {
		t.Fatalf("NATS span parent %v kind %v, want the request span %v", natsSpan.Parent().SpanID(), natsSpan.SpanKind(), req.SpanContext().SpanID())
	}
	for _, sp := range spans {
		for _, a := range sp.Attributes() {
			if a.Value.Emit() == "secret words" {
				t.Fatalf("span %q carries the prompt text in %s", sp.Name(), a.Key)
			}
		}
	}
	if msg.Header.Get(session.HeaderUser) != "alice" {
		t.Fatalf("principal header lost: %v", msg.Header)
	}
	got := trace.SpanContextFromContext(propagator.Extract(context.Background(), headerCarrier(msg.Header)))
	if got.SpanID() != natsSpan.SpanContext().SpanID() || got.TraceID() != req.SpanContext().TraceID() || !got.IsRemote() {
		t.Fatalf("headers %v carry %v, want the NATS span %v", msg.Header, got, natsSpan.SpanContext())
	}
}
