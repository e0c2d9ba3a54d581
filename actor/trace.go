package actor

import (
	"context"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/mount"
	"github.com/atriumhq/atrium/session"
)

// TracerName is the instrumentation scope of the node's spans.
const TracerName = "github.com/atriumhq/atrium/actor"

// Span attribute keys. Spans carry identifiers and sizes, never prompt text,
// output or other payloads.
const (
	attrSession = attribute.Key("atrium.session")
	attrOp      = attribute.Key("atrium.op")
	attrUser    = attribute.Key("atrium.user")
	attrTurn    = attribute.Key("atrium.turn")
	attrSeq     = attribute.Key("atrium.prompt_seq")
	attrStatus  = attribute.Key("atrium.turn.status")
	attrExit    = attribute.Key("atrium.exit_code")
	attrBytes   = attribute.Key("atrium.workspace.bytes")
	attrFiles   = attribute.Key("atrium.workspace.files")
	attrMoved   = attribute.Key("atrium.workspace.bytes_transferred")
)

// propagator reads the W3C trace context gateways put in NATS headers.
var propagator = propagation.TraceContext{}

// headerCarrier carries the trace context in NATS headers: nats.Header and
// http.Header are the same map type, so OpenTelemetry's carrier for HTTP
// headers serves (gateway and node both use it, so keys match).
func headerCarrier(h nats.Header) propagation.HeaderCarrier { return propagation.HeaderCarrier(h) }

// noSpan is the span of a host without tracing: every method is a no-op.
var noSpan = trace.SpanFromContext(context.Background())

// tracer returns the host's tracer, or nil when tracing is off.
func tracerOf(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		return nil
	}
	return tp.Tracer(TracerName)
}

// startSpan starts an internal span under ctx's. Without tracing it returns
// ctx and a no-op span and costs nothing.
func (h *Host) startSpan(ctx context.Context, name string, id session.ID) (context.Context, trace.Span) {
	if h.tracer == nil {
		return ctx, noSpan
	}
	return h.tracer.Start(ctx, name, trace.WithAttributes(attrSession.String(string(id))))
}

// endSpan records err, if any, on span and ends it.
func endSpan(span trace.Span, err error) {
	if err != nil && span.IsRecording() {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// startCommand starts the span of one command from the session's Cmd
// subject, a child of the gateway's request span carried in msg's headers.
func (h *Host) startCommand(msg *nats.Msg, id session.ID, op session.Op) trace.Span {
	if h.tracer == nil || msg == nil {
		return noSpan
	}
	ctx := propagator.Extract(context.Background(), headerCarrier(msg.Header))
	_, span := h.tracer.Start(ctx, "atrium.command "+string(op), trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attrSession.String(string(id)), attrOp.String(string(op)),
			attrUser.String(principal(msg).User)))
	return span
}

// turnTraces links a turn's span to the span of the prompt command that
// queued it. It belongs to the session actor.
type turnTraces struct {
	cmd     trace.Span // the span of the command being handled
	prompts map[session.Seq]trace.SpanContext
}

// queued remembers the command span that made prompt seq durable.
func (t *turnTraces) queued(seq session.Seq, span trace.Span) {
	sc := span.SpanContext()
	if !sc.IsValid() {
		return
	}
	if t.prompts == nil {
		t.prompts = map[session.Seq]trace.SpanContext{}
	}
	t.prompts[seq] = sc
}

// startTurn starts the span of turn n, a child of its prompt's command span
// when this activation received the prompt, and returns the runner's
// context carrying it.
func (h *Host) startTurn(ctx context.Context, t *turnTraces, id session.ID, n int64, seq session.Seq) (context.Context, trace.Span) {
	if h.tracer == nil {
		return ctx, noSpan
	}
	parent := ctx
	if sc, ok := t.prompts[seq]; ok {
		delete(t.prompts, seq)
		parent = trace.ContextWithRemoteSpanContext(ctx, sc)
	}
	_, span := h.tracer.Start(parent, "atrium.turn", trace.WithAttributes(
		attrSession.String(string(id)), attrTurn.Int64(n), attrSeq.Int64(seq)))
	return trace.ContextWithSpan(ctx, span), span
}

// endTurn ends a turn's span with how the turn ended.
func endTurn(span trace.Span, res *turnExited) {
	if span.IsRecording() {
		span.SetAttributes(attrStatus.String(string(res.status)), attrExit.Int(res.code))
		if res.status != session.TurnOK {
			span.SetStatus(codes.Error, string(res.status))
		}
	}
	span.End()
}

// endExec ends a sandbox exec span with the command's exit.
func endExec(span trace.Span, exit compute.Exit, err error) {
	if span.IsRecording() {
		span.SetAttributes(attrExit.Int(exit.Code))
		if exit.Lost {
			span.SetStatus(codes.Error, "sandbox lost")
		}
	}
	endSpan(span, err)
}

// endWorkspace ends a workspace save or restore span with its sizes.
func endWorkspace(span trace.Span, st mount.Stats, moved int64, err error) {
	if span.IsRecording() {
		span.SetAttributes(attrBytes.Int64(st.Bytes), attrFiles.Int(st.Files), attrMoved.Int64(moved))
	}
	endSpan(span, err)
}
