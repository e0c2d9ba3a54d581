package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/session/api"
)

// SetSecret sets the session's secret name to value (owner only). The
// harness gets it in its environment from the next turn on; the server
// never shows the value again.
func (c *Client) SetSecret(ctx context.Context, id session.ID, name, value string) error {
	if err := session.ValidSecretName(name); err != nil {
		return err
	}
	p, err := sessionPath(id, "/secrets/"+url.PathEscape(name))
	if err != nil {
		return err
	}
	body := api.SecretValue{Value: &value}
	return c.do(ctx, http.MethodPut, p, body, nil)
}

// DeleteSecret removes the session's secret name (owner only).
func (c *Client) DeleteSecret(ctx context.Context, id session.ID, name string) error {
	if err := session.ValidSecretName(name); err != nil {
		return err
	}
	p, err := sessionPath(id, "/secrets/"+url.PathEscape(name))
	if err != nil {
		return err
	}
	return c.do(ctx, http.MethodDelete, p, nil, nil)
}

// ListSecrets returns the names of the session's secrets, who set each and
// when (owner only); never their values.
func (c *Client) ListSecrets(ctx context.Context, id session.ID) ([]session.SecretInfo, error) {
	p, err := sessionPath(id, "/secrets")
	if err != nil {
		return nil, err
	}
	var out api.SecretList
	if err := c.do(ctx, http.MethodGet, p, nil, &out); err != nil {
		return nil, err
	}
	return out.Secrets, nil
}

// SetEgress replaces the session's own egress allowlist (owner only) and
// returns the session. The sandbox gets it at the next turn.
func (c *Client) SetEgress(ctx context.Context, id session.ID, allow []string) (session.Session, error) {
	p, err := sessionPath(id, "/egress")
	if err != nil {
		return session.Session{}, err
	}
	if allow == nil {
		allow = []string{}
	}
	body := api.Egress{Allow: &allow}
	var s session.Session
	err = c.do(ctx, http.MethodPut, p, body, &s)
	return s, err
}
