package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Protocols of Tracing.Protocol.
const (
	TracingHTTP = "http" // OTLP over HTTP/protobuf (port 4318 by convention)
	TracingGRPC = "grpc" // OTLP over gRPC (port 4317 by convention)
)

// ServiceName is the service.name resource attribute of Atrium's spans.
const ServiceName = "atrium"

// Tracing configures OpenTelemetry tracing. The zero value is off: no
// exporter, no goroutine, and the gateway and node skip every span.
type Tracing struct {
	// Endpoint is the host:port of an OTLP collector; empty turns tracing
	// off.
	Endpoint string
	// Protocol is TracingHTTP (the default) or TracingGRPC.
	Protocol string
	// SampleRatio is the fraction of new traces recorded, in (0, 1]; zero
	// means 1 (every trace). Requests that arrive with a sampled W3C
	// traceparent are recorded whatever the ratio.
	SampleRatio float64
	// Insecure sends spans without TLS (plain HTTP, or gRPC without TLS).
	Insecure bool
}

// newTracerProvider returns the tracer provider of cfg, or nil when tracing
// is off. Its batch processor's goroutine runs until Shutdown, which also
// sends the spans still buffered.
//
// Export failures (a collector that is down) are logged to log as warnings:
// the OpenTelemetry error handler is process-wide, so it is set here, once
// tracing is on.
func newTracerProvider(ctx context.Context, cfg Tracing, log *slog.Logger) (*sdktrace.TracerProvider, error) {
	if cfg.Endpoint == "" {
		return nil, nil
	}
	if strings.Contains(cfg.Endpoint, "://") {
		return nil, fmt.Errorf("tracing endpoint %q: give host:port without a scheme (set insecure for plain HTTP)", cfg.Endpoint)
	}
	ratio := cfg.SampleRatio
	if ratio == 0 {
		ratio = 1
	}
	if ratio < 0 || ratio > 1 {
		return nil, fmt.Errorf("tracing sample ratio %v: want a fraction in (0, 1]", ratio)
	}
	var (
		exp sdktrace.SpanExporter
		err error
	)
	switch cfg.Protocol {
	case "", TracingHTTP:
		opts := []otlptracehttp.Option{otlptracehttp.WithEndpoint(cfg.Endpoint)}
		if cfg.Insecure {
			opts = append(opts, otlptracehttp.WithInsecure())
		}
		exp, err = otlptracehttp.New(ctx, opts...)
	case TracingGRPC:
		opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(cfg.Endpoint)}
		if cfg.Insecure {
			opts = append(opts, otlptracegrpc.WithInsecure())
		}
		exp, err = otlptracegrpc.New(ctx, opts...)
	default:
		return nil, fmt.Errorf("tracing protocol %q: want http or grpc", cfg.Protocol)
	}
	if err != nil {
		return nil, fmt.Errorf("create OTLP exporter: %w", err)
	}
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("export traces", "err", err)
	}))
	res := resource.NewSchemaless(attribute.String("service.name", ServiceName))
	return sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))),
	), nil
}

// tracerProvider returns the provider for the gateway and the node: nil
// (not a nil pointer in an interface) when tracing is off.
func (s *Server) tracerProvider() trace.TracerProvider {
	if s.tp == nil {
		return nil
	}
	return s.tp
}

// shutdownTracing sends the spans still buffered and stops the exporter.
func (s *Server) shutdownTracing(ctx context.Context) error {
	if s.tp == nil {
		return nil
	}
	if err := s.tp.Shutdown(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("shut down tracing: %w", err)
	}
	return nil
}
