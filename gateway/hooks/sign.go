package hooks

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// SignatureHeader carries the signature of a webhook, in and out:
// "t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">".
const SignatureHeader = "X-Atrium-Signature"

// Errors of Verify.
var (
	ErrNoSignature  = errors.New("hooks: no " + SignatureHeader + " header")
	ErrBadFormat    = errors.New("hooks: " + SignatureHeader + " is not t=<unix seconds>,v1=<hex>")
	ErrStale        = errors.New("hooks: signature timestamp outside the replay window")
	ErrBadSignature = errors.New("hooks: signature does not match the body")
)

// Sign returns the SignatureHeader value of body signed with secret at t.
func Sign(secret []byte, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac(secret, ts, body))
}

func mac(secret []byte, ts string, body []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(ts))
	m.Write([]byte{'.'})
	m.Write(body)
	return m.Sum(nil)
}

// Verify checks a SignatureHeader value against body: its timestamp must be
// within window of now (either way), and one of its v1 signatures (several
// are allowed while a secret is rotated) must be the HMAC-SHA256 of
// "<t>.<body>" under secret, compared in constant time. It returns the
// matching signature, which identifies the request.
func Verify(secret []byte, header string, body []byte, now time.Time, window time.Duration) (string, error) {
	if header == "" {
		return "", ErrNoSignature
	}
	var ts string
	var sigs []string
	for part := range strings.SplitSeq(header, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return "", ErrBadFormat
		}
		switch k {
		case "t":
			ts = v
		case "v1":
			sigs = append(sigs, v)
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || len(sigs) == 0 {
		return "", ErrBadFormat
	}
	age := now.Sub(time.Unix(sec, 0))
	if age > window || age < -window {
		return "", fmt.Errorf("%w: signed %s %s, the window is %s", ErrStale, age.Abs().Round(time.Second), agoOrAhead(age), window)
	}
	want := mac(secret, ts, body)
	for _, s := range sigs {
		got, err := hex.DecodeString(s)
		if err == nil && hmac.Equal(got, want) {
			return s, nil
		}
	}
	return "", ErrBadSignature
}

func agoOrAhead(d time.Duration) string {
	if d < 0 {
		return "ahead"
	}
	return "ago"
}
