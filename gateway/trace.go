package gateway

import (
	"context"
	"net/http"
	"strconv"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/atriumhq/atrium/session"
)

// TracerName is the instrumentation scope of the gateway's spans.
const TracerName = "github.com/atriumhq/atrium/gateway"

// Span attribute keys. Spans carry routes, identifiers and status codes,
// never request bodies, prompt text or tokens.
const (
	attrSession = attribute.Key("atrium.session")
	attrUser    = attribute.Key("atrium.user")
	attrOp      = attribute.Key("atrium.op")
	attrRoute   = attribute.Key("http.route")
	attrMethod  = attribute.Key("http.request.method")
	attrStatus  = attribute.Key("http.response.status_code")
	attrSystem  = attribute.Key("messaging.system")
	attrDest    = attribute.Key("messaging.destination.name")
)

// propagator writes the W3C trace context into NATS headers; the node reads
// it back (actor/trace.go).
var propagator = propagation.TraceContext{}

// headerCarrier carries the trace context in NATS headers: nats.Header and
// http.Header are the same map type, so OpenTelemetry's carrier for HTTP
// headers serves (gateway and node both use it, so keys match).
func headerCarrier(h nats.Header) propagation.HeaderCarrier { return propagation.HeaderCarrier(h) }

// tracerOf returns tp's tracer for the gateway, or nil when tracing is off.
func tracerOf(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		return nil
	}
	return tp.Tracer(TracerName)
}

// traced starts a server span for each request, named after the route
// pattern the mux matched. Without tracing it returns next unchanged. It
// must wrap instrument and the mux, which set the pattern on the request
// this handler passes down.
func (s *Server) traced(next http.Handler) http.Handler {
	if s.tracer == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := propagator.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := s.tracer.Start(ctx, r.Method, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attrMethod.String(r.Method)))
		defer span.End()
		sw := &statusWriter{ResponseWriter: w}
		r = r.WithContext(ctx)
		next.ServeHTTP(sw, r)
		route := r.Pattern
		if route == "" {
			route = "unmatched"
		}
		code := sw.code
		if code == 0 {
			code = http.StatusOK
		}
		span.SetName(route)
		span.SetAttributes(attrRoute.String(route), attrStatus.Int(code))
		if id := r.PathValue("id"); id != "" {
			span.SetAttributes(attrSession.String(id))
		}
		if code >= http.StatusInternalServerError {
			span.SetStatus(codes.Error, strconv.Itoa(code))
		}
	})
}

// traceUser adds the authenticated caller to the request's span.
func traceUser(r *http.Request, p session.Principal) {
	if span := trace.SpanFromContext(r.Context()); span.IsRecording() {
		span.SetAttributes(attrUser.String(p.User))
	}
}

// traceRequest starts a client span for a request to the nodes and injects
// its context into msg's headers, so the node's span is its child. The
// returned function ends the span with the request's error.
func (s *Server) traceRequest(ctx context.Context, msg *nats.Msg, body any) (context.Context, func(error)) {
	if s.tracer == nil {
		return ctx, noEnd
	}
	op, kind := "", "place"
	switch b := body.(type) {
	case session.Command:
		op, kind = string(b.Op), "cmd"
	case session.PlaceRequest:
		op = string(b.Op)
	}
	ctx, span := s.tracer.Start(ctx, "nats request "+kind, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attrSystem.String("nats"), attrDest.String(msg.Subject), attrOp.String(op)))
	if msg.Header == nil {
		msg.Header = nats.Header{}
	}
	propagator.Inject(ctx, headerCarrier(msg.Header))
	return ctx, func(err error) {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}

func noEnd(error) {}
