// Package slack is Atrium's Slack app: the Events API, interactivity and
// slash command endpoints, with Slack's request signatures verified, and the
// Web API calls (through github.com/slack-go/slack) that post a session's
// messages to its thread. It implements channel.Channel; everything that is
// not Slack-specific (bindings, identity, roles, rendering, retries) is
// package channel's.
//
// A mention of the app in a channel starts a session bound to the mention's
// thread; later messages in the thread that mention the app (or, with
// AllMessages, every message) become prompts of that session. Direct
// messages to the app work the same way without the mention.
package slack

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/atriumhq/atrium/gateway/channel"
	"github.com/slack-go/slack"
	"github.com/slack-go/slack/slackevents"
)

// Paths of the endpoints to give Slack (see docs/channels.md).
const (
	EventsPath        = "/channels/slack/events"
	InteractivityPath = "/channels/slack/interactivity"
	CommandsPath      = "/channels/slack/commands"
)

// Defaults of Config.
const (
	// DefaultAPIURL is Slack's Web API.
	DefaultAPIURL = "https://slack.com/api/"
	// DefaultWorkTimeout bounds the handling of one request from Slack.
	DefaultWorkTimeout = 30 * time.Second
	// DefaultCallTimeout bounds one Web API call.
	DefaultCallTimeout = 15 * time.Second
	// MaxBodyBytes bounds a request from Slack.
	MaxBodyBytes = 1 << 20
)

// Platform is the name of this platform in channel.Thread.
const Platform = "slack"

// Action ids of Atrium's buttons; their value is the channel button value.
const (
	actionPrefix  = "atrium_"
	actionsBlock  = "atrium_actions"
	maxBlockText  = 3000
	maxCodeText   = maxBlockText - 8
	fallbackLimit = 3000
)

// Config configures an Adapter. BotToken, SigningSecret and Service are
// required.
type Config struct {
	// BotToken is the app's bot token (xoxb-…). Secret: never logged.
	BotToken string
	// SigningSecret verifies that requests come from Slack. Secret.
	SigningSecret string
	// AllMessages makes every message in a session's thread a prompt, not
	// only those that mention the app.
	AllMessages bool
	// Service handles what people do.
	Service *channel.Service
	// APIURL is the Web API's base URL, ending in "/"; default
	// DefaultAPIURL (tests point it at a local server).
	APIURL string
	// HTTPClient makes Web API calls; default a client with a
	// DefaultCallTimeout timeout.
	HTTPClient *http.Client
	// WorkTimeout bounds the handling of one request; default
	// DefaultWorkTimeout.
	WorkTimeout time.Duration
	// Logger receives the adapter's logs; default slog.Default().
	Logger *slog.Logger
}

// Adapter is the Slack app. It starts no goroutines.
type Adapter struct {
	cfg Config
	api *slack.Client
	log *slog.Logger

	mu     sync.Mutex
	botIDs map[string]string // guarded by mu: the app's bot user id, by team
}

var _ channel.Channel = (*Adapter)(nil)
var _ channel.Opener = (*Adapter)(nil)
var _ channel.Emails = (*Adapter)(nil)

// New returns an Adapter.
func New(cfg Config) (*Adapter, error) {
	if cfg.BotToken == "" {
		return nil, errors.New("slack: config needs the bot token (xoxb-…)")
	}
	if cfg.SigningSecret == "" {
		return nil, errors.New("slack: config needs the signing secret (Basic Information page of the app)")
	}
	if cfg.Service == nil {
		return nil, errors.New("slack: config needs the channel service")
	}
	if cfg.APIURL == "" {
		cfg.APIURL = DefaultAPIURL
	}
	if !strings.HasSuffix(cfg.APIURL, "/") {
		cfg.APIURL += "/"
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Timeout: DefaultCallTimeout}
	}
	if cfg.WorkTimeout <= 0 {
		cfg.WorkTimeout = DefaultWorkTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Adapter{
		cfg:    cfg,
		api:    slack.New(cfg.BotToken, slack.OptionAPIURL(cfg.APIURL), slack.OptionHTTPClient(cfg.HTTPClient)),
		log:    cfg.Logger,
		botIDs: make(map[string]string),
	}, nil
}

// Routes registers the endpoints Slack calls.
func (a *Adapter) Routes(mux *http.ServeMux) {
	mux.HandleFunc("POST "+EventsPath, a.events)
	mux.HandleFunc("POST "+InteractivityPath, a.interactivity)
	mux.HandleFunc("POST "+CommandsPath, a.commands)
}

// Platform implements channel.Channel.
func (a *Adapter) Platform() string { return Platform }

// verified reads the body of a request from Slack and checks its signature
// (HMAC-SHA256 with the signing secret, compared in constant time, over a
// timestamp at most five minutes from now). It answers the request itself
// and returns false when the request is not Slack's.
func (a *Adapter) verified(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		http.Error(w, "request body too large or unreadable", http.StatusRequestEntityTooLarge)
		return nil, false
	}
	sv, err := slack.NewSecretsVerifier(r.Header, a.cfg.SigningSecret)
	if err == nil {
		_, _ = sv.Write(body)
		err = sv.Ensure()
	}
	if err != nil {
		why := "signature does not verify"
		switch {
		case errors.Is(err, slack.ErrMissingHeaders):
			why = "missing X-Slack-Signature or X-Slack-Request-Timestamp"
		case errors.Is(err, slack.ErrExpiredTimestamp):
			why = "request timestamp is more than five minutes from now"
		}
		a.log.Warn("slack: refused a request", "path", r.URL.Path, "why", why)
		http.Error(w, "slack: "+why, http.StatusUnauthorized)
		return nil, false
	}
	return body, true
}

// work returns a context for handling a verified request: Slack gives up on
// a request after three seconds and retries it, but what was started is
// finished (the retry is a duplicate and is dropped).
func (a *Adapter) work(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(r.Context()), a.cfg.WorkTimeout)
}

// events serves the Events API: the url_verification handshake, mentions
// of the app and messages.
func (a *Adapter) events(w http.ResponseWriter, r *http.Request) {
	body, ok := a.verified(w, r)
	if !ok {
		return
	}
	ev, err := slackevents.ParseEvent(json.RawMessage(body), slackevents.OptionNoVerifyToken())
	if err != nil {
		http.Error(w, "slack: undecodable event", http.StatusBadRequest)
		return
	}
	switch ev.Type {
	case slackevents.URLVerification:
		v, ok := ev.Data.(*slackevents.EventsAPIURLVerificationEvent)
		if !ok {
			http.Error(w, "slack: undecodable url_verification", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]string{"challenge": v.Challenge})
		return
	case slackevents.CallbackEvent:
	default:
		w.WriteHeader(http.StatusOK)
		return
	}
	outer, ok := ev.Data.(*slackevents.EventsAPICallbackEvent)
	if !ok {
		w.WriteHeader(http.StatusOK)
		return
	}
	for _, au := range outer.Authorizations {
		if au.IsBot && au.UserID != "" {
			a.setBotID(au.TeamID, au.UserID)
		}
	}
	if n := r.Header.Get("X-Slack-Retry-Num"); n != "" {
		a.log.Info("slack: event delivered again", "retry", n, "reason", r.Header.Get("X-Slack-Retry-Reason"))
	}
	ctx, cancel := a.work(r)
	defer cancel()
	in, ok := a.incoming(ctx, outer, ev.InnerEvent)
	if !ok {
		w.WriteHeader(http.StatusOK)
		return
	}
	if err := a.cfg.Service.Receive(ctx, a, in); err != nil {
		if !errors.Is(err, channel.ErrBusy) {
			a.log.Warn("slack: event not handled: Slack will deliver it again", "err", err)
		}
		http.Error(w, "atrium: try again later", http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// incoming turns an inner event into a message for the service; false
// means the event is not for Atrium.
func (a *Adapter) incoming(ctx context.Context, outer *slackevents.EventsAPICallbackEvent, inner slackevents.EventsAPIInnerEvent) (channel.Incoming, bool) {
	team := outer.TeamID
	switch e := inner.Data.(type) {
	case *slackevents.AppMentionEvent:
		if e.BotID != "" || e.User == "" {
			return channel.Incoming{}, false
		}
		return channel.Incoming{
			Thread:  channel.Thread{Platform: Platform, Workspace: team, Channel: e.Channel, ID: first(e.ThreadTimeStamp, e.TimeStamp)},
			User:    channel.User{ID: e.User},
			Text:    a.withoutMention(ctx, team, e.Text),
			EventID: outer.EventID,
			Start:   true,
		}, true
	case *slackevents.MessageEvent:
		if e.SubType != "" || e.BotID != "" || e.User == "" {
			return channel.Incoming{}, false // edits, joins, bots (Atrium itself)
		}
		if e.ChannelType == "im" {
			// A direct message conversation is one thread (like a Telegram
			// chat); a thread inside it is its own.
			th := channel.Thread{Platform: Platform, Workspace: team, Channel: e.Channel, ID: e.ThreadTimeStamp}
			return channel.Incoming{Thread: th, User: channel.User{ID: e.User}, Text: a.withoutMention(ctx, team, e.Text),
				EventID: outer.EventID, Start: true}, true
		}
		th := channel.Thread{Platform: Platform, Workspace: team, Channel: e.Channel, ID: e.ThreadTimeStamp}
		// In channels, mentions arrive as app_mention events too: only
		// unmentioned replies in a thread count, and only with AllMessages.
		if !a.cfg.AllMessages || e.ThreadTimeStamp == "" || a.mentions(ctx, team, e.Text) {
			return channel.Incoming{}, false
		}
		return channel.Incoming{Thread: th, User: channel.User{ID: e.User}, Text: e.Text, EventID: outer.EventID}, true
	}
	return channel.Incoming{}, false
}

var mentionRE = regexp.MustCompile(`<@([A-Z0-9]+)(\|[^>]*)?>`)

// withoutMention removes the mentions of the app from text.
func (a *Adapter) withoutMention(ctx context.Context, team, text string) string {
	bot := a.botID(ctx, team)
	out := mentionRE.ReplaceAllStringFunc(text, func(m string) string {
		if id := mentionRE.FindStringSubmatch(m)[1]; bot == "" || id == bot {
			return ""
		}
		return m
	})
	return strings.TrimSpace(out)
}

func (a *Adapter) mentions(ctx context.Context, team, text string) bool {
	bot := a.botID(ctx, team)
	return bot != "" && strings.Contains(text, "<@"+bot)
}

func (a *Adapter) setBotID(team, id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.botIDs[team] = id
}

// botID returns the app's user id in team: from the authorizations Slack
// sends with events, else from auth.test.
func (a *Adapter) botID(ctx context.Context, team string) string {
	a.mu.Lock()
	id, ok := a.botIDs[team]
	a.mu.Unlock()
	if ok {
		return id
	}
	res, err := a.api.AuthTestContext(ctx)
	if err != nil {
		a.log.Warn("slack: auth.test", "err", err)
		return ""
	}
	a.setBotID(team, res.UserID)
	return res.UserID
}

// interactivity serves button presses.
func (a *Adapter) interactivity(w http.ResponseWriter, r *http.Request) {
	body, ok := a.verified(w, r)
	if !ok {
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	cb, err := slack.InteractionCallbackParse(r)
	if err != nil {
		http.Error(w, "slack: undecodable interaction", http.StatusBadRequest)
		return
	}
	if cb.Type != slack.InteractionTypeBlockActions || len(cb.ActionCallback.BlockActions) == 0 {
		w.WriteHeader(http.StatusOK)
		return
	}
	act := cb.ActionCallback.BlockActions[0]
	action, ok := strings.CutPrefix(act.ActionID, actionPrefix)
	if !ok {
		w.WriteHeader(http.StatusOK)
		return
	}
	th := channel.Thread{Platform: Platform, Workspace: cb.Team.ID, Channel: cb.Channel.ID,
		ID: first(cb.Message.ThreadTimestamp, cb.Container.ThreadTs, cb.Message.Timestamp)}
	user := channel.User{ID: cb.User.ID, Name: cb.User.Name}
	ctx, cancel := a.work(r)
	defer cancel()
	reply, err := a.cfg.Service.Press(ctx, a, channel.Press{Thread: th, User: user, Action: action, Value: act.Value})
	if err != nil {
		a.log.Warn("slack: button press not handled", "err", err)
		reply = "Atrium could not handle that just now: please press the button again in a moment."
	}
	if reply != "" {
		a.cfg.Service.Tell(a, th, user, reply)
	}
	w.WriteHeader(http.StatusOK)
}

// commands serves the /atrium slash command; the reply is ephemeral.
func (a *Adapter) commands(w http.ResponseWriter, r *http.Request) {
	body, ok := a.verified(w, r)
	if !ok {
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	sc, err := slack.SlashCommandParse(r)
	if err != nil {
		http.Error(w, "slack: undecodable command", http.StatusBadRequest)
		return
	}
	name, args, _ := strings.Cut(strings.TrimSpace(sc.Text), " ")
	prefix := first(sc.Command, "/atrium") + " "
	ctx, cancel := a.work(r)
	defer cancel()
	reply, err := a.cfg.Service.Command(ctx, a, channel.Command{
		Thread: channel.Thread{Platform: Platform, Workspace: sc.TeamID, Channel: sc.ChannelID},
		User:   channel.User{ID: sc.UserID, Name: sc.UserName},
		Name:   name, Args: args, Prefix: prefix,
	})
	if err != nil {
		a.log.Warn("slack: command not handled", "err", err)
		reply = "Atrium is not reachable right now: please try again in a moment."
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]string{"response_type": "ephemeral", "text": reply})
}

// Post implements channel.Channel with chat.postMessage.
func (a *Adapter) Post(ctx context.Context, th channel.Thread, m channel.Message) (channel.Ref, error) {
	opts := []slack.MsgOption{slack.MsgOptionText(fallback(m), false), slack.MsgOptionBlocks(blocks(m)...)}
	if th.ID != "" {
		opts = append(opts, slack.MsgOptionTS(th.ID))
	}
	_, ts, err := a.api.PostMessageContext(ctx, th.Channel, opts...)
	if err != nil {
		return "", classify("chat.postMessage", err)
	}
	return channel.Ref(ts), nil
}

// Open implements channel.Opener: it posts m in the channel; the new
// message's thread is the session's.
func (a *Adapter) Open(ctx context.Context, where channel.Thread, m channel.Message) (channel.Thread, error) {
	where.ID = ""
	ref, err := a.Post(ctx, where, m)
	if err != nil {
		return channel.Thread{}, err
	}
	where.ID = string(ref)
	return where, nil
}

// Edit implements channel.Channel with chat.update.
func (a *Adapter) Edit(ctx context.Context, th channel.Thread, ref channel.Ref, m channel.Message) error {
	_, _, _, err := a.api.UpdateMessageContext(ctx, th.Channel, string(ref),
		slack.MsgOptionText(fallback(m), false), slack.MsgOptionBlocks(blocks(m)...))
	return classify("chat.update", err)
}

// Upload implements channel.Channel with files.getUploadURLExternal, an
// upload, and files.completeUploadExternal into the thread.
func (a *Adapter) Upload(ctx context.Context, th channel.Thread, f channel.File, comment string) error {
	_, err := a.api.UploadFileContext(ctx, slack.UploadFileParameters{
		Reader: bytes.NewReader(f.Content), FileSize: len(f.Content), Filename: f.Name, Title: f.Title,
		InitialComment: comment, Channel: th.Channel, ThreadTimestamp: th.ID,
	})
	return classify("files upload", err)
}

// Whisper implements channel.Channel with chat.postEphemeral in the thread.
func (a *Adapter) Whisper(ctx context.Context, th channel.Thread, to channel.User, text string) error {
	opts := []slack.MsgOption{slack.MsgOptionText(escape(text), false)}
	if th.ID != "" {
		opts = append(opts, slack.MsgOptionTS(th.ID))
	}
	_, err := a.api.PostEphemeralContext(ctx, th.Channel, to.ID, opts...)
	return classify("chat.postEphemeral", err)
}

// VerifiedEmail implements channel.Emails with users.info (scope
// users:read.email): the email of a person whose address Slack has
// confirmed; "" for bots, deactivated accounts and guests.
func (a *Adapter) VerifiedEmail(ctx context.Context, workspace, userID string) (string, error) {
	u, err := a.api.GetUserInfoContext(ctx, userID)
	if err != nil {
		var se slack.SlackErrorResponse
		if errors.As(err, &se) && se.Err == "user_not_found" {
			return "", nil
		}
		return "", classify("users.info", err)
	}
	if u.IsBot || u.Deleted || u.IsRestricted || u.IsUltraRestricted || !u.IsEmailConfirmed {
		return "", nil
	}
	return u.Profile.Email, nil
}

// classify wraps a Web API error for the service's retries: 429 carries
// its Retry-After; server errors, network errors and Slack's own transient
// errors are retried; the rest (channel_not_found, not_in_channel,
// invalid_auth, …) cannot succeed by retrying.
func classify(method string, err error) error {
	if err == nil {
		return nil
	}
	var rl *slack.RateLimitedError
	var sc slack.StatusCodeError
	var se slack.SlackErrorResponse
	switch {
	case errors.As(err, &rl):
		return &channel.RateLimited{After: rl.RetryAfter, Err: fmt.Errorf("slack %s: %w", method, err)}
	case errors.As(err, &sc):
		if sc.Code >= 500 || sc.Code == http.StatusTooManyRequests || sc.Code == http.StatusRequestTimeout {
			return fmt.Errorf("slack %s: %w", method, err)
		}
		return channel.Permanent(fmt.Errorf("slack %s: %w", method, err))
	case errors.As(err, &se):
		switch se.Err {
		case "ratelimited", "internal_error", "fatal_error", "service_unavailable", "request_timeout":
			return fmt.Errorf("slack %s: %w", method, err)
		}
		return channel.Permanent(fmt.Errorf("slack %s: %s", method, se.Err))
	}
	return fmt.Errorf("slack %s: %w", method, err)
}

// blocks renders m as Block Kit blocks.
func blocks(m channel.Message) []slack.Block {
	var bs []slack.Block
	if m.Text != "" {
		bs = append(bs, slack.NewSectionBlock(slack.NewTextBlockObject(slack.MarkdownType, clip(escape(m.Text), maxBlockText), false, false), nil, nil))
	}
	if m.Code != "" {
		code := strings.ReplaceAll(escape(m.Code), "```", "` ` `")
		bs = append(bs, slack.NewSectionBlock(slack.NewTextBlockObject(slack.MarkdownType, "```"+tail(code, maxCodeText)+"```", false, false), nil, nil))
	}
	if m.Link != nil {
		bs = append(bs, slack.NewContextBlock("", slack.NewTextBlockObject(slack.MarkdownType,
			"<"+escape(m.Link.URL)+"|"+escape(m.Link.Text)+">", false, false)))
	}
	if len(m.Buttons) > 0 {
		var els []slack.BlockElement
		for _, b := range m.Buttons {
			btn := slack.NewButtonBlockElement(actionPrefix+b.Action, b.Value, slack.NewTextBlockObject(slack.PlainTextType, b.Label, false, false))
			switch b.Style {
			case channel.StylePrimary:
				btn.WithStyle(slack.StylePrimary)
			case channel.StyleDanger:
				btn.WithStyle(slack.StyleDanger)
			}
			els = append(els, btn)
		}
		bs = append(bs, slack.NewActionBlock(actionsBlock, els...))
	}
	return bs
}

// fallback is the plain text of m, shown in notifications.
func fallback(m channel.Message) string { return clip(escape(m.Text), fallbackLimit) }

// escape escapes Slack's control characters (mrkdwn).
func escape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}

// clip keeps the first n bytes of s (whole runes).
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	n -= len("…")
	for n > 0 && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n] + "…"
}

// tail keeps the last n bytes of s (whole runes).
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := len(s) - n + len("…")
	for i < len(s) && s[i]&0xC0 == 0x80 {
		i++
	}
	return "…" + s[i:]
}

func first(ss ...string) string {
	for _, s := range ss {
		if s != "" {
			return s
		}
	}
	return ""
}
