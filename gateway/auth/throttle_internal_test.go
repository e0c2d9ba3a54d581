package auth

import (
	"fmt"
	"testing"
	"time"
)

func TestThrottle_Bounded(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	th := &Throttle{Failures: 2, Window: time.Minute, MaxAddrs: 100, Now: func() time.Time { return now }}
	// 50 addresses throttled, then a flood of new addresses.
	for i := range 50 {
		th.fail(fmt.Sprintf("10.0.0.%d", i))
		th.fail(fmt.Sprintf("10.0.0.%d", i))
	}
	for i := range 10000 {
		th.fail(fmt.Sprintf("10.1.%d.%d", i/256, i%256))
	}
	if n := len(th.addrs); n > 100 {
		t.Fatalf("%d addresses tracked", n)
	}
	// The flood did not make the throttled addresses forgotten.
	for i := range 50 {
		if th.wait(fmt.Sprintf("10.0.0.%d", i)) == 0 {
			t.Fatalf("10.0.0.%d forgotten", i)
		}
	}
	// Once their time is up, they give way.
	now = now.Add(2 * time.Minute)
	th.fail("10.2.0.1")
	if n := len(th.addrs); n > 2 {
		t.Fatalf("%d addresses tracked after expiry", n)
	}
}

func TestSafeNext(t *testing.T) {
	for next, want := range map[string]string{
		"/s/abc":                "/s/abc",
		"/s/abc?tab=log#end":    "/s/abc?tab=log#end",
		"/":                     "/",
		"":                      "/",
		"s/abc":                 "/",
		"//evil.example/x":      "/",
		"/\\evil.example":       "/",
		"https://evil.example/": "/",
		"javascript:alert(1)":   "/",
		"/x\r\nSet-Cookie: a=b": "/",
		"/%2F%2Fevil.example":   "/%2F%2Fevil.example",
		"/\tevil":               "/",
		"http:/evil.example/x":  "/",
		"/s/abc@evil.example":   "/s/abc@evil.example",
		"///evil.example":       "/",
		"/.//evil.example":      "/.//evil.example",
	} {
		if got := safeNext(next); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", next, got, want)
		}
	}
}
