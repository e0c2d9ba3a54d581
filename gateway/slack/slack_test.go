package slack

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/gateway/channel"
	"github.com/slack-go/slack"
)

func TestBlocks(t *testing.T) {
	bs := blocks(channel.Message{
		Text: "<!channel> & friends", Code: "a ``` b\n" + strings.Repeat("z", 5000),
		Link:    &channel.Link{Text: "Open", URL: "https://atrium.test/s/s_1"},
		Buttons: []channel.Button{{Label: "Approve", Action: "approve", Value: "7", Style: channel.StylePrimary}},
	})
	b, err := json.Marshal(bs)
	if err != nil {
		t.Fatal(err)
	}
	// Undo JSON's escaping of <, > and &, to read the mrkdwn as Slack does.
	s := strings.NewReplacer(`\u003c`, "<", `\u003e`, ">", `\u0026`, "&").Replace(string(b))
	for _, want := range []string{`&lt;!channel&gt; &amp; friends`, `<https://atrium.test/s/s_1|Open>`, `"action_id":"atrium_approve"`, `"value":"7"`, `"style":"primary"`} {
		if !strings.Contains(s, want) {
			t.Errorf("blocks lack %s: %s", want, s)
		}
	}
	if strings.Contains(s, "<!channel>") || strings.Count(s, "```") != 2 {
		t.Errorf("unescaped text or code fences in %s", s)
	}
	for _, blk := range bs {
		if sec, ok := blk.(*slack.SectionBlock); ok && len(sec.Text.Text) > maxBlockText {
			t.Errorf("a section of %d characters", len(sec.Text.Text))
		}
	}
}

func TestClassify(t *testing.T) {
	for name, tc := range map[string]struct {
		err       error
		permanent bool
		after     time.Duration
	}{
		"429":               {&slack.RateLimitedError{RetryAfter: 3 * time.Second}, false, 3 * time.Second},
		"503":               {slack.StatusCodeError{Code: http.StatusServiceUnavailable, Status: "503"}, false, 0},
		"404":               {slack.StatusCodeError{Code: http.StatusNotFound, Status: "404"}, true, 0},
		"channel_not_found": {slack.SlackErrorResponse{Err: "channel_not_found"}, true, 0},
		"internal_error":    {slack.SlackErrorResponse{Err: "internal_error"}, false, 0},
		"network":           {errors.New("connection refused"), false, 0},
	} {
		t.Run(name, func(t *testing.T) {
			err := classify("chat.postMessage", tc.err)
			if errors.Is(err, channel.ErrPermanent) != tc.permanent {
				t.Fatalf("%v: permanent %v, want %v", err, !tc.permanent, tc.permanent)
			}
			var rl *channel.RateLimited
			if tc.after > 0 && (!errors.As(err, &rl) || rl.RetryAfter() != tc.after) {
				t.Fatalf("%v: want retry after %s", err, tc.after)
			}
		})
	}
	if classify("x", nil) != nil {
		t.Fatal("classify(nil) is not nil")
	}
}
