// Package channel is the platform-neutral half of Atrium's chat channels and
// webhooks: it turns what people say in a chat thread into commands on a
// session, and a session's events into messages in that thread.
//
// It owns the Channel interface that every chat platform adapter implements
// (gateway/slack, gateway/telegram), the durable thread ↔ session bindings,
// the dedupe store that makes each platform event count once, the mapping of
// platform users to Atrium principals, the rendering of events into messages
// (a status message edited in place while a turn runs, the result when it
// ends, approvals as buttons), and the delivery queues that retry outgoing
// messages with backoff until they are delivered.
//
// Everything an adapter does goes through Sessions, which the gateway
// implements with the same role checks (session.RoleFor), activation and
// auditing as its REST routes: a chat user acts as the Atrium user they map
// to and can do exactly what that user can.
//
// Outgoing messages are driven by a session's events, watched from the
// gateway side over NATS; nothing here ever waits on a session actor. Each
// bound session is driven by one gateway at a time, the holder of its lease
// (see Service), so that several gateways never post the same event twice.
package channel

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"
)

// Thread is a conversation on a chat platform that a session is bound to.
// Its fields are the platform's own identifiers; together they are unique.
type Thread struct {
	// Platform names the adapter: "slack", "telegram".
	Platform string `json:"platform"`
	// Workspace is the platform's installation: a Slack team, a Telegram bot.
	Workspace string `json:"workspace"`
	// Channel is where the thread lives: a Slack channel, a Telegram chat.
	Channel string `json:"channel"`
	// ID is the thread within the channel: a Slack thread_ts, a Telegram
	// forum topic; "" is the channel itself.
	ID string `json:"id,omitempty"`
}

// key returns a KV-safe key for t.
func (t Thread) key() string {
	return hashKey(t.Platform, t.Workspace, t.Channel, t.ID)
}

// place returns a KV-safe key for t's channel.
func (t Thread) place() string {
	return hashKey(t.Platform, t.Workspace, t.Channel)
}

func hashKey(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// User is a person on a chat platform.
type User struct {
	// ID is the platform's user id: a Slack user id, a Telegram user id.
	ID string
	// Name is a display name, for messages; it is never used to decide
	// anything.
	Name string
}

// Message is what the service asks a platform to show. It has no markup:
// the adapter escapes the text and renders each part in its own way.
type Message struct {
	// Text is the message, in plain text.
	Text string
	// Code is shown preformatted under Text (a turn's output), if set.
	Code string
	// Link is shown under the rest, if set.
	Link *Link
	// Buttons are shown last; a press comes back as a Press with the
	// button's Action and Value.
	Buttons []Button
}

// Link is a labelled URL.
type Link struct {
	Text string
	URL  string
}

// Button is an interactive button.
type Button struct {
	Label string
	// Action and Value come back in the Press; together they stay under 48
	// bytes (Telegram allows 64 bytes of callback data).
	Action string
	Value  string
	Style  Style
}

// Style is how a button looks.
type Style string

// Button styles.
const (
	StyleDefault Style = ""
	StylePrimary Style = "primary"
	StyleDanger  Style = "danger"
)

// Actions of the buttons the service makes.
const (
	ActionApprove = "approve"
	ActionDeny    = "deny"
)

// Ref identifies a message the platform posted (a Slack ts, a Telegram
// message id), so that it can be edited.
type Ref string

// File is an attachment: a turn's output too long for a message.
type File struct {
	Name    string
	Title   string
	Content []byte
}

// Channel is a chat platform, as the service drives it. Every method may be
// retried: an error that wraps ErrPermanent is not retried, one that has a
// RetryAfter() method is retried after that long, and any other is retried
// with backoff.
type Channel interface {
	// Platform names the platform, as in Thread.Platform.
	Platform() string
	// Post posts m in th and returns a reference to it.
	Post(ctx context.Context, th Thread, m Message) (Ref, error)
	// Edit replaces the content of a message posted in th.
	Edit(ctx context.Context, th Thread, ref Ref, m Message) error
	// Upload attaches f to th, with a short comment.
	Upload(ctx context.Context, th Thread, f File, comment string) error
	// Whisper tells one user something in th: privately where the
	// platform can (Slack's ephemeral messages), else as a reply.
	Whisper(ctx context.Context, th Thread, to User, text string) error
}

// Opener is a Channel that starts a new thread for a session started by a
// command (Slack: a new message in the channel, whose thread it becomes).
// A Channel that is not an Opener binds the command's thread itself.
type Opener interface {
	Open(ctx context.Context, where Thread, m Message) (Thread, error)
}

// Emails is a Channel that can tell a user's verified email address, for
// identity mapping by email domain (Identity.Workspaces).
type Emails interface {
	// VerifiedEmail returns the user's email if the platform has verified
	// it, and "" if it has not or the user is not a person (a bot, a
	// deactivated account, a guest).
	VerifiedEmail(ctx context.Context, workspace, userID string) (string, error)
}

// ErrPermanent marks an error of a Channel that retrying cannot fix (the
// channel was deleted, the bot was removed from it): the message is dropped
// and the error logged.
var ErrPermanent = errors.New("channel: permanent failure")

// Permanent wraps err so that it is not retried.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrPermanent, err)
}

// RateLimited is an error of a platform that asks to be called again after
// a delay (HTTP 429 with Retry-After).
type RateLimited struct {
	After time.Duration
	Err   error
}

// Error implements error.
func (e *RateLimited) Error() string {
	return fmt.Sprintf("rate limited: retry after %s: %v", e.After, e.Err)
}

// Unwrap returns the platform's error.
func (e *RateLimited) Unwrap() error { return e.Err }

// RetryAfter returns how long to wait before trying again.
func (e *RateLimited) RetryAfter() time.Duration { return e.After }

// Incoming is a message a person sent in a thread.
type Incoming struct {
	Thread Thread
	User   User
	// Text is the message without the mention of the bot.
	Text string
	// EventID is the platform's unique id of the event; the service handles
	// each id once however often it is delivered. "" turns dedupe off.
	EventID string
	// Start lets the message start a session when the thread has none: it
	// mentions the bot, or it is a direct message.
	Start bool
}

// Press is a button press.
type Press struct {
	Thread Thread
	User   User
	Action string
	Value  string
	// EventID, if set, makes a redelivered press count once.
	EventID string
}

// Command is a slash command or its equivalent: "/atrium new fix the
// build" is Name "new", Args "fix the build".
type Command struct {
	// Thread is where it was typed. Slack does not say in which thread a
	// slash command was typed: its Thread.ID is "".
	Thread Thread
	User   User
	Name   string
	Args   string
	// Prefix is how commands are typed on the platform, for help texts:
	// "/atrium " on Slack, "/" on Telegram.
	Prefix string
	// EventID, if set, makes a redelivered command count once.
	EventID string
}
