// Package telegram is Atrium's Telegram bot: the webhook Telegram calls
// (authenticated by the secret token Atrium gave it with setWebhook), and a
// small client of the four Bot API methods it needs (sendMessage,
// editMessageText, sendDocument, answerCallbackQuery). It implements
// channel.Channel, which shows that the interface is not Slack-shaped: a
// Telegram chat (or forum topic) is one thread whose current session
// "/new" replaces, there are no ephemeral messages, and buttons answer
// through callback queries.
//
// In a private chat every message goes to the chat's session (the first one
// starts it). In a group, messages that mention the bot (@name) or reply to
// one of its messages do.
package telegram

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io"
	"log/slog"
	"mime/multipart"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/atriumhq/atrium/gateway/channel"
)

// WebhookPath is the path to give Telegram with setWebhook.
const WebhookPath = "/channels/telegram/webhook"

// SecretHeader carries the secret token Telegram was given with setWebhook.
const SecretHeader = "X-Telegram-Bot-Api-Secret-Token"

// Platform is the name of this platform in channel.Thread.
const Platform = "telegram"

// Defaults of Config.
const (
	DefaultAPIURL      = "https://api.telegram.org"
	DefaultWorkTimeout = 30 * time.Second
	DefaultCallTimeout = 15 * time.Second
	// MaxBodyBytes bounds an update.
	MaxBodyBytes = 1 << 20
)

// Telegram's limits (characters; bytes are a safe bound).
const (
	maxText    = 3500
	maxCode    = 3000
	maxCaption = 1000
)

// Config configures an Adapter. Token, SecretToken and Service are required.
type Config struct {
	// Token is the bot's token from @BotFather ("123456:ABC…"). Secret.
	Token string
	// SecretToken is the secret_token given to setWebhook: Telegram sends
	// it in every call. 1 to 256 characters of A-Z, a-z, 0-9, _ and -.
	// Secret.
	SecretToken string
	// Username is the bot's username without "@", for mentions in groups;
	// default: asked with getMe when first needed.
	Username string
	// Service handles what people do.
	Service *channel.Service
	// APIURL is the Bot API's base URL; default DefaultAPIURL.
	APIURL string
	// HTTPClient makes Bot API calls; default a client with a
	// DefaultCallTimeout timeout.
	HTTPClient *http.Client
	// WorkTimeout bounds the handling of one update.
	WorkTimeout time.Duration
	// Logger receives the adapter's logs; default slog.Default().
	Logger *slog.Logger
}

// Adapter is the Telegram bot. It starts no goroutines.
type Adapter struct {
	cfg   Config
	botID string // the digits before the token's colon: the workspace of its threads
	log   *slog.Logger

	mu       sync.Mutex
	username string // guarded by mu
}

var _ channel.Channel = (*Adapter)(nil)

// New returns an Adapter.
func New(cfg Config) (*Adapter, error) {
	id, _, ok := strings.Cut(cfg.Token, ":")
	if !ok || id == "" {
		return nil, errors.New(`telegram: config needs the bot token from @BotFather ("123456:ABC…")`)
	}
	if _, err := strconv.ParseInt(id, 10, 64); err != nil {
		return nil, errors.New(`telegram: the bot token should start with the bot's numeric id ("123456:ABC…")`)
	}
	if !validSecret(cfg.SecretToken) {
		return nil, errors.New("telegram: config needs a webhook secret token of 1 to 256 characters from A-Z, a-z, 0-9, _ and - (generate one with: openssl rand -hex 32)")
	}
	if cfg.Service == nil {
		return nil, errors.New("telegram: config needs the channel service")
	}
	if cfg.APIURL == "" {
		cfg.APIURL = DefaultAPIURL
	}
	cfg.APIURL = strings.TrimRight(cfg.APIURL, "/")
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Timeout: DefaultCallTimeout}
	}
	if cfg.WorkTimeout <= 0 {
		cfg.WorkTimeout = DefaultWorkTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Adapter{cfg: cfg, botID: id, log: cfg.Logger, username: strings.TrimPrefix(cfg.Username, "@")}, nil
}

func validSecret(s string) bool {
	if s == "" || len(s) > 256 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// Routes registers the webhook.
func (a *Adapter) Routes(mux *http.ServeMux) {
	mux.HandleFunc("POST "+WebhookPath, a.webhook)
}

// Platform implements channel.Channel.
func (a *Adapter) Platform() string { return Platform }

// The parts of Bot API objects the adapter reads.
type (
	update struct {
		UpdateID      int64          `json:"update_id"`
		Message       *message       `json:"message"`
		CallbackQuery *callbackQuery `json:"callback_query"`
	}
	message struct {
		MessageID int64    `json:"message_id"`
		ThreadID  int64    `json:"message_thread_id"`
		IsTopic   bool     `json:"is_topic_message"`
		From      *user    `json:"from"`
		Chat      chat     `json:"chat"`
		Text      string   `json:"text"`
		ReplyTo   *message `json:"reply_to_message"`
	}
	user struct {
		ID        int64  `json:"id"`
		IsBot     bool   `json:"is_bot"`
		FirstName string `json:"first_name"`
		Username  string `json:"username"`
	}
	chat struct {
		ID   int64  `json:"id"`
		Type string `json:"type"` // private, group, supergroup, channel
	}
	callbackQuery struct {
		ID      string   `json:"id"`
		From    user     `json:"from"`
		Message *message `json:"message"`
		Data    string   `json:"data"`
	}
)

// webhook serves the updates Telegram posts. An update that could not be
// handled gets a server error, so that Telegram delivers it again.
func (a *Adapter) webhook(w http.ResponseWriter, r *http.Request) {
	got := r.Header.Get(SecretHeader)
	if subtle.ConstantTimeCompare([]byte(got), []byte(a.cfg.SecretToken)) != 1 {
		a.log.Warn("telegram: refused a webhook call without the right secret token", "had_token", got != "")
		http.Error(w, "telegram: wrong or missing "+SecretHeader, http.StatusUnauthorized)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		http.Error(w, "telegram: update too large", http.StatusRequestEntityTooLarge)
		return
	}
	var u update
	if err := json.Unmarshal(body, &u); err != nil {
		http.Error(w, "telegram: undecodable update", http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), a.cfg.WorkTimeout)
	defer cancel()
	eventID := strconv.FormatInt(u.UpdateID, 10)
	switch {
	case u.Message != nil:
		err = a.onMessage(ctx, u.Message, eventID)
	case u.CallbackQuery != nil:
		err = a.onCallback(ctx, u.CallbackQuery, eventID)
	}
	if err != nil {
		if !errors.Is(err, channel.ErrBusy) {
			a.log.Warn("telegram: update not handled: Telegram will deliver it again", "err", err)
		}
		http.Error(w, "atrium: try again later", http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (a *Adapter) thread(m *message) channel.Thread {
	th := channel.Thread{Platform: Platform, Workspace: a.botID, Channel: strconv.FormatInt(m.Chat.ID, 10)}
	if m.IsTopic && m.ThreadID != 0 {
		th.ID = strconv.FormatInt(m.ThreadID, 10)
	}
	return th
}

func person(u *user) channel.User {
	name := u.FirstName
	if u.Username != "" {
		name = "@" + u.Username
	}
	return channel.User{ID: strconv.FormatInt(u.ID, 10), Name: name}
}

func (a *Adapter) onMessage(ctx context.Context, m *message, eventID string) error {
	if m.From == nil || m.From.IsBot || strings.TrimSpace(m.Text) == "" {
		return nil
	}
	th, who := a.thread(m), person(m.From)
	text := strings.TrimSpace(m.Text)
	if strings.HasPrefix(text, "/") {
		word, args, _ := strings.Cut(text[1:], " ")
		name, to, addressed := strings.Cut(word, "@")
		if addressed && !strings.EqualFold(to, a.botUsername(ctx)) {
			return nil // a command for another bot of the group
		}
		reply, err := a.cfg.Service.Command(ctx, a, channel.Command{
			Thread: th, User: who, Name: name, Args: args, Prefix: "/", EventID: eventID,
		})
		if err != nil || reply == "" {
			return err
		}
		a.cfg.Service.Tell(a, th, who, reply)
		return nil
	}
	in := channel.Incoming{Thread: th, User: who, Text: text, EventID: eventID}
	switch m.Chat.Type {
	case "private":
		in.Start = true
	default:
		bot := a.botUsername(ctx)
		mention := bot != "" && strings.Contains(strings.ToLower(text), "@"+strings.ToLower(bot))
		reply := m.ReplyTo != nil && m.ReplyTo.From != nil && m.ReplyTo.From.IsBot && strings.EqualFold(m.ReplyTo.From.Username, bot)
		if !mention && !reply {
			return nil
		}
		if mention {
			in.Text = strings.TrimSpace(removeFold(text, "@"+bot))
		}
		in.Start = true
	}
	return a.cfg.Service.Receive(ctx, a, in)
}

func (a *Adapter) onCallback(ctx context.Context, q *callbackQuery, eventID string) error {
	if q.Message == nil {
		return nil
	}
	action, value, _ := strings.Cut(q.Data, ":")
	th := a.thread(q.Message)
	reply, err := a.cfg.Service.Press(ctx, a, channel.Press{Thread: th, User: person(&q.From), Action: action, Value: value, EventID: eventID})
	if err != nil {
		return err
	}
	if reply == "" {
		return nil
	}
	if err := a.call(ctx, "answerCallbackQuery", map[string]any{"callback_query_id": q.ID, "text": clipRunes(reply, 190), "show_alert": true}, nil); err != nil {
		a.log.Warn("telegram: answer a button press: replying in the chat instead", "err", err)
		a.cfg.Service.Tell(a, th, person(&q.From), reply)
	}
	return nil
}

// botUsername returns the bot's username, asking getMe the first time.
func (a *Adapter) botUsername(ctx context.Context) string {
	a.mu.Lock()
	name := a.username
	a.mu.Unlock()
	if name != "" {
		return name
	}
	var me user
	if err := a.call(ctx, "getMe", struct{}{}, &me); err != nil {
		a.log.Warn("telegram: getMe", "err", err)
		return ""
	}
	a.mu.Lock()
	a.username = me.Username
	a.mu.Unlock()
	return me.Username
}

// Post implements channel.Channel with sendMessage.
func (a *Adapter) Post(ctx context.Context, th channel.Thread, m channel.Message) (channel.Ref, error) {
	id, err := a.send(ctx, th, m)
	if err != nil {
		return "", err
	}
	return channel.Ref(strconv.FormatInt(id, 10)), nil
}

func (a *Adapter) send(ctx context.Context, th channel.Thread, m channel.Message) (int64, error) {
	req := map[string]any{
		"chat_id": th.Channel, "text": render(m), "parse_mode": "HTML",
		"link_preview_options": map[string]bool{"is_disabled": true},
	}
	if th.ID != "" {
		req["message_thread_id"] = th.ID
	}
	if kb := keyboard(m); kb != nil {
		req["reply_markup"] = kb
	}
	var sent message
	if err := a.call(ctx, "sendMessage", req, &sent); err != nil {
		return 0, err
	}
	return sent.MessageID, nil
}

// Edit implements channel.Channel with editMessageText.
func (a *Adapter) Edit(ctx context.Context, th channel.Thread, ref channel.Ref, m channel.Message) error {
	kb := keyboard(m)
	if kb == nil {
		kb = map[string]any{"inline_keyboard": [][]any{}} // remove answered buttons
	}
	err := a.call(ctx, "editMessageText", map[string]any{
		"chat_id": th.Channel, "message_id": string(ref), "text": render(m), "parse_mode": "HTML",
		"link_preview_options": map[string]bool{"is_disabled": true}, "reply_markup": kb,
	}, nil)
	var e *apiError
	if errors.As(err, &e) && strings.Contains(e.Description, "message is not modified") {
		return nil
	}
	return err
}

// Upload implements channel.Channel with sendDocument.
func (a *Adapter) Upload(ctx context.Context, th channel.Thread, f channel.File, comment string) error {
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	_ = mw.WriteField("chat_id", th.Channel)
	if th.ID != "" {
		_ = mw.WriteField("message_thread_id", th.ID)
	}
	_ = mw.WriteField("caption", clipRunes(comment, maxCaption))
	fw, err := mw.CreateFormFile("document", f.Name)
	if err != nil {
		return channel.Permanent(fmt.Errorf("telegram sendDocument: %w", err))
	}
	_, _ = fw.Write(f.Content)
	if err := mw.Close(); err != nil {
		return channel.Permanent(fmt.Errorf("telegram sendDocument: %w", err))
	}
	return a.do(ctx, "sendDocument", mw.FormDataContentType(), body.Bytes(), nil)
}

// Whisper implements channel.Channel. Telegram has no private replies in
// groups: it is a message in the thread addressed to the person.
func (a *Adapter) Whisper(ctx context.Context, th channel.Thread, to channel.User, text string) error {
	if to.Name != "" {
		text = to.Name + ": " + text
	}
	_, err := a.send(ctx, th, channel.Message{Text: text})
	return err
}

// apiError is an error answer of the Bot API.
type apiError struct {
	Method      string
	Code        int
	Description string
	RetryAfter  int
}

func (e *apiError) Error() string {
	return fmt.Sprintf("telegram %s: %d %s", e.Method, e.Code, e.Description)
}

// call posts req as JSON to method and decodes the result into out.
func (a *Adapter) call(ctx context.Context, method string, req, out any) error {
	b, err := json.Marshal(req)
	if err != nil {
		return channel.Permanent(fmt.Errorf("telegram %s: encode: %w", method, err))
	}
	return a.do(ctx, method, "application/json", b, out)
}

// do makes one Bot API request and classifies its failure for retries:
// 429 carries retry_after, server and network errors are retried, and any
// other refusal is permanent.
func (a *Adapter) do(ctx context.Context, method, ctype string, body []byte, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.cfg.APIURL+"/bot"+a.cfg.Token+"/"+method, bytes.NewReader(body))
	if err != nil {
		return channel.Permanent(fmt.Errorf("telegram %s: %w", method, err))
	}
	req.Header.Set("Content-Type", ctype)
	resp, err := a.cfg.HTTPClient.Do(req)
	if err != nil {
		// The URL holds the token: report the method only.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Errorf("telegram %s: %w", method, err)
	}
	defer resp.Body.Close()
	var r struct {
		OK          bool            `json:"ok"`
		Result      json.RawMessage `json:"result"`
		ErrorCode   int             `json:"error_code"`
		Description string          `json:"description"`
		Parameters  struct {
			RetryAfter int `json:"retry_after"`
		} `json:"parameters"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, MaxBodyBytes)).Decode(&r); err != nil {
		if resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests {
			return fmt.Errorf("telegram %s: HTTP %d", method, resp.StatusCode)
		}
		return fmt.Errorf("telegram %s: undecodable answer (HTTP %d): %w", method, resp.StatusCode, err)
	}
	if r.OK {
		if out != nil && len(r.Result) > 0 {
			if err := json.Unmarshal(r.Result, out); err != nil {
				return channel.Permanent(fmt.Errorf("telegram %s: decode result: %w", method, err))
			}
		}
		return nil
	}
	e := &apiError{Method: method, Code: cmpOr(r.ErrorCode, resp.StatusCode), Description: r.Description, RetryAfter: r.Parameters.RetryAfter}
	switch {
	case e.Code == http.StatusTooManyRequests:
		return &channel.RateLimited{After: time.Duration(max(1, e.RetryAfter)) * time.Second, Err: e}
	case e.Code >= 500:
		return e
	}
	return channel.Permanent(e)
}

func cmpOr(a, b int) int {
	if a != 0 {
		return a
	}
	return b
}

// render renders m as Telegram HTML.
func render(m channel.Message) string {
	var b strings.Builder
	b.WriteString(escape(clipRunes(m.Text, maxText)))
	if m.Code != "" {
		if b.Len() > 0 {
			b.WriteString("\n")
		}
		b.WriteString("<pre>" + escape(lastRunes(m.Code, maxCode)) + "</pre>")
	}
	if m.Link != nil {
		b.WriteString("\n<a href=\"" + html.EscapeString(m.Link.URL) + "\">" + escape(m.Link.Text) + "</a>")
	}
	if b.Len() == 0 {
		return "…"
	}
	return b.String()
}

// escape escapes what Telegram's HTML parse mode requires outside tags.
var escape = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace

// keyboard renders m's buttons as an inline keyboard; callback data is
// "action:value".
func keyboard(m channel.Message) map[string]any {
	if len(m.Buttons) == 0 {
		return nil
	}
	row := make([]map[string]string, 0, len(m.Buttons))
	for _, btn := range m.Buttons {
		row = append(row, map[string]string{"text": btn.Label, "callback_data": btn.Action + ":" + btn.Value})
	}
	return map[string]any{"inline_keyboard": [][]map[string]string{row}}
}

func clipRunes(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

func lastRunes(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return "…" + string(r[len(r)-n+1:])
}

// removeFold removes every occurrence of sub from s, ignoring case.
func removeFold(s, sub string) string {
	return regexp.MustCompile("(?i)"+regexp.QuoteMeta(sub)).ReplaceAllString(s, "")
}
