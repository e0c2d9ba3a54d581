package telegram

import (
	"strings"
	"testing"

	"github.com/atriumhq/atrium/gateway/channel"
)

func TestRender(t *testing.T) {
	got := render(channel.Message{Text: "1 < 2 & it's", Code: "<b>out</b>", Link: &channel.Link{Text: "Open", URL: `https://a.test/s/x?a=1&b="2"`}})
	want := "1 &lt; 2 &amp; it's\n<pre>&lt;b&gt;out&lt;/b&gt;</pre>\n<a href=\"https://a.test/s/x?a=1&amp;b=&#34;2&#34;\">Open</a>"
	if got != want {
		t.Fatalf("render =\n%s\nwant\n%s", got, want)
	}
	if got := render(channel.Message{Code: strings.Repeat("é", maxCode+10)}); !strings.Contains(got, "<pre>…") {
		t.Fatalf("long code not cut from the start: %.40s", got)
	}
	kb := keyboard(channel.Message{Buttons: []channel.Button{{Label: "Approve", Action: "approve", Value: "12"}}})
	if row := kb["inline_keyboard"].([][]map[string]string)[0]; row[0]["callback_data"] != "approve:12" {
		t.Fatalf("keyboard %v", kb)
	}
	if got := removeFold("hey @Atrium_Bot do it", "@atrium_bot"); got != "hey  do it" {
		t.Fatalf("removeFold = %q", got)
	}
}

func TestNew_Validates(t *testing.T) {
	svc := &channel.Service{}
	for name, cfg := range map[string]Config{
		"no token":         {SecretToken: "abc", Service: svc},
		"token without id": {Token: "abc:def", SecretToken: "abc", Service: svc},
		"bad secret":       {Token: "1:x", SecretToken: "has space", Service: svc},
		"no service":       {Token: "1:x", SecretToken: "abc"},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("%s: New accepted it", name)
		}
	}
}
