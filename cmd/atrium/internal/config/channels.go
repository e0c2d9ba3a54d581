package config

import (
	"fmt"
	"strings"

	"github.com/atriumhq/atrium/gateway"
	"github.com/atriumhq/atrium/gateway/channel"
	"github.com/atriumhq/atrium/gateway/hooks"
	"github.com/atriumhq/atrium/gateway/slack"
	"github.com/atriumhq/atrium/gateway/telegram"
	"github.com/atriumhq/atrium/session"
)

// Channels configures chat channels and signed webhooks (docs/channels.md).
// Each part is off until its secrets are set. Secrets inside lists (hooks
// and hook targets) are never written in the file: they name the
// environment variable that holds them (secret_env).
type Channels struct {
	// ThreadRole is the role of a known person of a session's tenant who
	// speaks in its thread without one: driver (default), viewer or none.
	ThreadRole string          `yaml:"thread_role"`
	Slack      SlackChannel    `yaml:"slack"`
	Telegram   TelegramChannel `yaml:"telegram"`
	Workspaces []ChatWorkspace `yaml:"workspaces"`
	Users      []ChatUser      `yaml:"users"`
	Hooks      []InboundHook   `yaml:"hooks"`
	Targets    []WebhookTarget `yaml:"hook_targets"`
}

// SlackChannel configures the Slack app; it is on when BotToken is set.
type SlackChannel struct {
	BotToken      string `yaml:"bot_token" secret:"true"`
	SigningSecret string `yaml:"signing_secret" secret:"true"`
	// AllMessages makes every message in a session's thread a prompt, not
	// only those that mention the app.
	AllMessages bool `yaml:"all_messages"`
}

// TelegramChannel configures the Telegram bot; it is on when BotToken is set.
type TelegramChannel struct {
	BotToken      string `yaml:"bot_token" secret:"true"`
	WebhookSecret string `yaml:"webhook_secret" secret:"true"`
	// Username is the bot's @username (without @); default asked from
	// Telegram.
	Username string `yaml:"username"`
}

// ChatWorkspace maps a Slack team or a Telegram bot to a tenant.
type ChatWorkspace struct {
	Platform     string   `yaml:"platform"`
	Workspace    string   `yaml:"workspace"`
	Tenant       string   `yaml:"tenant"`
	EmailDomains []string `yaml:"email_domains"`
}

// ChatUser maps one platform user to an Atrium user.
type ChatUser struct {
	Platform  string `yaml:"platform"`
	Workspace string `yaml:"workspace"`
	ID        string `yaml:"id"`
	User      string `yaml:"user"`
	Tenant    string `yaml:"tenant"`
}

// InboundHook is a webhook served at POST /v1/hooks/<name>.
type InboundHook struct {
	Name string `yaml:"name"`
	// SecretEnv names the environment variable holding the signing secret.
	SecretEnv    string   `yaml:"secret_env"`
	User         string   `yaml:"user"`
	Tenant       string   `yaml:"tenant"`
	Prompt       string   `yaml:"prompt"`
	Title        string   `yaml:"title"`
	SessionKey   string   `yaml:"session_key"`
	DeliverTo    string   `yaml:"deliver_to"`
	DeliverKinds []string `yaml:"deliver_kinds"`
}

// WebhookTarget is where outbound webhooks are delivered.
type WebhookTarget struct {
	Name string `yaml:"name"`
	// URLEnv, if set, names the environment variable holding the URL
	// (for URLs with credentials in them); else URL is used.
	URL       string `yaml:"url"`
	URLEnv    string `yaml:"url_env"`
	SecretEnv string `yaml:"secret_env"`
}

// on reports whether any channel or webhook is configured.
func (c Channels) on() bool {
	return c.Slack.BotToken != "" || c.Telegram.BotToken != "" || len(c.Hooks) > 0 || len(c.Targets) > 0
}

// check returns the problems of the channels section that need no
// environment, each naming its setting.
func (c Channels) check() []error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...)))
	}
	switch c.ThreadRole {
	case "", "driver", "viewer", "none":
	default:
		bad("channels.thread_role", "%q: want driver, viewer or none", c.ThreadRole)
	}
	if (c.Slack.BotToken == "") != (c.Slack.SigningSecret == "") {
		bad("channels.slack", "set both bot_token (xoxb-…, OAuth & Permissions page) and signing_secret (Basic Information page)")
	}
	if c.Telegram.BotToken != "" && c.Telegram.WebhookSecret == "" {
		bad("channels.telegram.webhook_secret", "required with a bot token (generate one with: openssl rand -hex 32, and give it to setWebhook)")
	}
	for i, h := range c.Hooks {
		if h.SecretEnv == "" {
			bad(fmt.Sprintf("channels.hooks[%d].secret_env", i), "name the environment variable that holds the hook's signing secret")
		}
	}
	for i, t := range c.Targets {
		if t.SecretEnv == "" {
			bad(fmt.Sprintf("channels.hook_targets[%d].secret_env", i), "name the environment variable that holds the target's signing secret")
		}
		if (t.URL == "") == (t.URLEnv == "") {
			bad(fmt.Sprintf("channels.hook_targets[%d]", i), "set either url or url_env")
		}
	}
	if c.on() {
		if err := c.identity().Validate(); err != nil {
			bad("channels.users", "%s", strings.TrimPrefix(err.Error(), "channel identity: "))
		}
	}
	return errs
}

func (c Channels) identity() channel.Identity {
	var id channel.Identity
	for _, w := range c.Workspaces {
		id.Workspaces = append(id.Workspaces, channel.WorkspaceMapping{Platform: w.Platform, Workspace: w.Workspace, Tenant: w.Tenant, EmailDomains: w.EmailDomains})
	}
	for _, u := range c.Users {
		id.Users = append(id.Users, channel.UserMapping{Platform: u.Platform, Workspace: u.Workspace, ID: u.ID, User: u.User, Tenant: u.Tenant})
	}
	return id
}

// Gateway returns the gateway's channels configuration, or nil if none is
// configured. getenv reads the secrets that secret_env and url_env name.
func (c Channels) Gateway(publicURL string, getenv func(string) string) (*gateway.Channels, error) {
	if !c.on() {
		return nil, nil
	}
	if errs := c.check(); len(errs) > 0 {
		return nil, errs[0]
	}
	env := func(key, name string) (string, error) {
		v := getenv(name)
		if v == "" {
			return "", fmt.Errorf("%s: the environment variable %s is not set", key, name)
		}
		return v, nil
	}
	out := &gateway.Channels{Service: channel.Config{
		Identity: c.identity(), PublicURL: publicURL, ThreadRole: session.Role(c.ThreadRole),
	}}
	if c.Slack.BotToken != "" {
		out.Slack = &slack.Config{BotToken: c.Slack.BotToken, SigningSecret: c.Slack.SigningSecret, AllMessages: c.Slack.AllMessages}
	}
	if c.Telegram.BotToken != "" {
		out.Telegram = &telegram.Config{Token: c.Telegram.BotToken, SecretToken: c.Telegram.WebhookSecret, Username: c.Telegram.Username}
	}
	if len(c.Hooks) > 0 || len(c.Targets) > 0 {
		hc := &hooks.Config{}
		for i, t := range c.Targets {
			secret, err := env(fmt.Sprintf("channels.hook_targets[%d].secret_env", i), t.SecretEnv)
			if err != nil {
				return nil, err
			}
			u := t.URL
			if t.URLEnv != "" {
				if u, err = env(fmt.Sprintf("channels.hook_targets[%d].url_env", i), t.URLEnv); err != nil {
					return nil, err
				}
			}
			hc.Targets = append(hc.Targets, hooks.Target{Name: t.Name, URL: u, Secret: secret})
		}
		for i, h := range c.Hooks {
			secret, err := env(fmt.Sprintf("channels.hooks[%d].secret_env", i), h.SecretEnv)
			if err != nil {
				return nil, err
			}
			hk := hooks.Hook{Name: h.Name, Secret: secret, User: h.User, Tenant: h.Tenant, Prompt: h.Prompt, Title: h.Title,
				SessionKey: h.SessionKey, DeliverTo: h.DeliverTo}
			for _, k := range h.DeliverKinds {
				hk.DeliverKinds = append(hk.DeliverKinds, session.Kind(k))
			}
			hc.Hooks = append(hc.Hooks, hk)
		}
		out.Hooks = hc
	}
	return out, nil
}
