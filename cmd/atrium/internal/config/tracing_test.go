package config_test

import (
	"strings"
	"testing"

	"github.com/atriumhq/atrium/cmd/atrium/internal/config"
)

func TestTracing_DefaultsEnvAndErrors(t *testing.T) {
	f, err := config.Load("", env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if f.Tracing.OTLPEndpoint != "" || f.Tracing.Protocol != config.TracingHTTP {
		t.Fatalf("default tracing %+v: want off, protocol http", f.Tracing)
	}

	p := write(t, "auth: {mode: tokens}\ntracing: {otlp_endpoint: 'collector:4318', insecure: true}\n")
	f, err = config.Load(p, env(map[string]string{
		"ATRIUM_TRACING_PROTOCOL": "grpc", "ATRIUM_TRACING_SAMPLE_RATIO": "0.25",
	}))
	if err != nil {
		t.Fatal(err)
	}
	want := config.Tracing{OTLPEndpoint: "collector:4318", Protocol: config.TracingGRPC, SampleRatio: 0.25, Insecure: true}
	if f.Tracing != want {
		t.Fatalf("tracing %+v, want %+v", f.Tracing, want)
	}
	if err := f.Validate(false); err != nil {
		t.Fatalf("refused: %v", err)
	}

	if _, err := config.Load(p, env(map[string]string{"ATRIUM_TRACING_SAMPLE_RATIO": "half"})); err == nil || !strings.Contains(err.Error(), "not a number") {
		t.Fatalf("sample ratio from the environment: err %v, want not a number", err)
	}

	p = write(t, "auth: {mode: tokens}\ntracing: {otlp_endpoint: 'http://collector:4318', protocol: zipkin, sample_ratio: 2}\n")
	f, err = config.Load(p, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	err = f.Validate(false)
	for _, w := range []string{"tracing.otlp_endpoint", "without a scheme", "tracing.protocol", "tracing.sample_ratio"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("error %v lacks %q", err, w)
		}
	}
	if _, err := config.Load(write(t, "tracing: {endpoint: x}\n"), env(nil)); err == nil {
		t.Errorf("unknown tracing key accepted")
	}
}
