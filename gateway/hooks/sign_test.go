package hooks

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestSignVerify(t *testing.T) {
	secret, body := []byte("s3cret-0123456789"), []byte(`{"text":"hi"}`)
	now := time.Unix(1_800_000_000, 0)
	h := Sign(secret, now, body)
	if !strings.HasPrefix(h, "t=1800000000,v1=") || len(h) != len("t=1800000000,v1=")+64 {
		t.Fatalf("Sign = %q", h)
	}
	if _, err := Verify(secret, h, body, now.Add(4*time.Minute), DefaultWindow); err != nil {
		t.Fatalf("Verify inside the window: %v", err)
	}
	rotated := "t=1800000000,v1=" + strings.Repeat("0", 64) + "," + strings.TrimPrefix(h, "t=1800000000,")
	if _, err := Verify(secret, rotated, body, now, DefaultWindow); err != nil {
		t.Fatalf("Verify with two signatures (rotation): %v", err)
	}
	for name, tc := range map[string]struct {
		secret []byte
		header string
		body   []byte
		now    time.Time
		want   error
	}{
		"missing":      {secret, "", body, now, ErrNoSignature},
		"garbage":      {secret, "sha256=abc", body, now, ErrBadFormat},
		"no v1":        {secret, "t=1800000000", body, now, ErrBadFormat},
		"bad time":     {secret, "t=soon,v1=00", body, now, ErrBadFormat},
		"stale":        {secret, h, body, now.Add(5*time.Minute + time.Second), ErrStale},
		"future":       {secret, h, body, now.Add(-5*time.Minute - time.Second), ErrStale},
		"other secret": {[]byte("other-secret-0123"), h, body, now, ErrBadSignature},
		"other body":   {secret, h, []byte(`{"text":"hi!"}`), now, ErrBadSignature},
		"other time":   {secret, strings.Replace(h, "t=1800000000", "t="+strconv.Itoa(1_800_000_001), 1), body, now, ErrBadSignature},
		"not hex":      {secret, "t=1800000000,v1=zz", body, now, ErrBadSignature},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := Verify(tc.secret, tc.header, tc.body, tc.now, DefaultWindow); !errors.Is(err, tc.want) {
				t.Fatalf("Verify = %v, want %v", err, tc.want)
			}
		})
	}
}
