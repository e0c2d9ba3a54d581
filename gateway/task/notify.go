package task

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/atriumhq/atrium/gateway/hooks"
)

// DefaultNotifyTimeout bounds one callback delivery.
const DefaultNotifyTimeout = 10 * time.Second

// SignedPoster is a Notifier that POSTs results signed like outbound
// webhooks (gateway/hooks): X-Atrium-Signature "t=<unix>,v1=<hex
// HMAC-SHA256 of "<t>.<body>">" under Secret. It tries once; a result is
// also in GET /v1/tasks/{id}.
type SignedPoster struct {
	Secret []byte
	// HTTP sends the requests; default a client with DefaultNotifyTimeout.
	HTTP *http.Client
}

// Notify implements Notifier.
func (p *SignedPoster) Notify(ctx context.Context, callbackURL string, body []byte) error {
	if len(p.Secret) == 0 {
		return errors.New("callback: no signing secret")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, callbackURL, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("callback: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(hooks.SignatureHeader, hooks.Sign(p.Secret, time.Now(), body))
	c := p.HTTP
	if c == nil {
		c = &http.Client{Timeout: DefaultNotifyTimeout}
	}
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("callback: %w", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("callback: answered %d", resp.StatusCode)
	}
	return nil
}
