package actor

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/atriumhq/atrium/session"
)

// TestTrace_Off checks that a host without a TracerProvider starts no span
// and keeps no state.
func TestTrace_Off(t *testing.T) {
	h := &Host{tracer: tracerOf(nil)}
	ctx := context.Background()
	if got, span := h.startSpan(ctx, "sandbox.exec", "s1"); got != ctx || span.IsRecording() {
		t.Fatalf("startSpan without tracing returned a new context or a recording span")
	}
	var tt turnTraces
	tt.queued(1, h.startCommand(&nats.Msg{Header: nats.Header{}}, "s1", session.OpPrompt))
	if got, span := h.startTurn(ctx, &tt, "s1", 1, 1); got != ctx || span.IsRecording() || tt.prompts != nil {
		t.Fatalf("startTurn without tracing started a span or kept state")
	}
}

// TestTrace_CommandToTurn checks that a command's span is the child of the
// span in its NATS headers and that the turn its prompt queues is the
// command's child, carried in the runner's context.
func TestTrace_CommandToTurn(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	h := &Host{tracer: tracerOf(tp)}

	ctx, gw := tp.Tracer("test").Start(context.Background(), "gateway")
	msg := &nats.Msg{Header: nats.Header{session.HeaderUser: {"alice"}}}
	propagator.Inject(ctx, headerCarrier(msg.Header))
	gw.End()

	var tt turnTraces
	cmd := h.startCommand(msg, "s1", session.OpPrompt)
	tt.queued(7, cmd)
	cmd.End()
	rctx, turn := h.startTurn(context.Background(), &tt, "s1", 3, 7)
	_, exec := h.startSpan(rctx, "sandbox.exec", "s1")
	endSpan(exec, nil)
	endTurn(turn, &turnExited{status: session.TurnOK})
	if len(tt.prompts) != 0 {
		t.Fatalf("turn traces keep %d prompts after the turn started", len(tt.prompts))
	}

	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		byName[s.Name()] = s
	}
	for child, parent := range map[string]string{"atrium.command prompt": "gateway", "atrium.turn": "atrium.command prompt", "sandbox.exec": "atrium.turn"} {
		c, p := byName[child], byName[parent]
		if c == nil || p == nil {
			t.Fatalf("spans %v: want %q and %q", byName, child, parent)
		}
		if c.Parent().SpanID() != p.SpanContext().SpanID() || c.SpanContext().TraceID() != p.SpanContext().TraceID() {
			t.Errorf("span %q: parent %v, want %q (%v)", child, c.Parent().SpanID(), parent, p.SpanContext().SpanID())
		}
	}
	if k := byName["atrium.command prompt"].SpanKind(); k != trace.SpanKindServer {
		t.Errorf("command span kind %v, want server", k)
	}
}
