package config_test

import (
	"strings"
	"testing"

	"github.com/atriumhq/atrium/cmd/atrium/internal/config"
	"github.com/atriumhq/atrium/session"
)

const channelsYAML = `
auth:
  mode: tokens
public_url: https://atrium.example.com
channels:
  thread_role: viewer
  slack:
    signing_secret: from-the-file
  telegram:
    webhook_secret: tg_secret
    username: atrium_bot
  workspaces:
    - {platform: slack, workspace: T0123, tenant: acme, email_domains: [acme.com]}
    - {platform: telegram, workspace: "4242", tenant: acme}
  users:
    - {platform: telegram, id: "1001", user: alice@acme.com}
  hooks:
    - name: ci
      secret_env: CI_HOOK_SECRET
      user: ci-bot
      tenant: acme
      prompt: "fix {{.repo}}"
      session_key: "{{.repo}}"
      deliver_to: results
      deliver_kinds: [turn_finished]
  hook_targets:
    - {name: results, url_env: RESULTS_URL, secret_env: RESULTS_SECRET}
`

func TestChannels(t *testing.T) {
	getenv := env(map[string]string{
		"ATRIUM_CHANNELS_SLACK_BOT_TOKEN":    "xoxb-1",
		"ATRIUM_CHANNELS_TELEGRAM_BOT_TOKEN": "4242:AAA",
		"CI_HOOK_SECRET":                     "ci-secret-0123456789",
		"RESULTS_URL":                        "https://ci.example.com/hook?token=x",
		"RESULTS_SECRET":                     "results-secret-0123456789",
	})
	f, err := config.Load(write(t, channelsYAML), getenv)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Validate(false); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	gc, err := f.Channels.Gateway(f.PublicURL, getenv)
	if err != nil {
		t.Fatalf("Gateway: %v", err)
	}
	if gc.Slack == nil || gc.Slack.BotToken != "xoxb-1" || gc.Slack.SigningSecret != "from-the-file" ||
		gc.Telegram == nil || gc.Telegram.Token != "4242:AAA" || gc.Service.ThreadRole != session.RoleViewer ||
		gc.Service.PublicURL != "https://atrium.example.com" || len(gc.Service.Identity.Workspaces) != 2 {
		t.Fatalf("channels %+v", gc)
	}
	h := gc.Hooks
	if h == nil || len(h.Hooks) != 1 || h.Hooks[0].Secret != "ci-secret-0123456789" || h.Hooks[0].DeliverKinds[0] != session.KindTurnFinished ||
		len(h.Targets) != 1 || h.Targets[0].URL != "https://ci.example.com/hook?token=x" {
		t.Fatalf("hooks %+v", h)
	}
	red, err := f.Redacted()
	if err != nil || strings.Contains(string(red), "xoxb-1") || strings.Contains(string(red), "from-the-file") {
		t.Fatalf("redacted config shows a channel secret:\n%s", red)
	}

	// A missing secret names its variable; a half-configured Slack says what is missing.
	getenv = env(map[string]string{"ATRIUM_CHANNELS_SLACK_BOT_TOKEN": "xoxb-1", "ATRIUM_CHANNELS_TELEGRAM_BOT_TOKEN": "4242:AAA"})
	f, _ = config.Load(write(t, channelsYAML), getenv)
	if _, err := f.Channels.Gateway(f.PublicURL, getenv); err == nil || !strings.Contains(err.Error(), "RESULTS_SECRET is not set") {
		t.Fatalf("missing target secret: %v", err)
	}
	f, _ = config.Load(write(t, "auth: {mode: tokens}\nchannels: {slack: {bot_token: xoxb-1}, thread_role: admin}\n"), env(nil))
	err = f.Validate(false)
	if err == nil || !strings.Contains(err.Error(), "channels.slack: set both") || !strings.Contains(err.Error(), "channels.thread_role") {
		t.Fatalf("Validate: %v", err)
	}
	if gc, err := (config.Channels{}).Gateway("", env(nil)); gc != nil || err != nil {
		t.Fatalf("no channels: %v %v", gc, err)
	}
}
