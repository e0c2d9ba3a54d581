package channel

import "testing"

func TestParseTask(t *testing.T) {
	for _, c := range []struct {
		args string
		want TaskRequest
		ok   bool
	}{
		{"https://github.com/acme/widgets fix it", TaskRequest{"https://github.com/acme/widgets", "main", "fix it", ""}, true},
		{"<https://github.com/acme/widgets>  --base develop\nfix it\nand test", TaskRequest{"https://github.com/acme/widgets", "develop", "fix it\nand test", ""}, true},
		{"<https://github.com/acme/widgets|acme/widgets> --base=v2 go", TaskRequest{"https://github.com/acme/widgets", "v2", "go", ""}, true},
		{"https://github.com/acme/widgets", TaskRequest{}, false},
		{"https://github.com/acme/widgets --base develop", TaskRequest{}, false},
		{"", TaskRequest{}, false},
	} {
		got, ok := parseTask(c.args)
		if ok != c.ok || (ok && got != c.want) {
			t.Errorf("parseTask(%q) = %+v, %v; want %+v, %v", c.args, got, ok, c.want, c.ok)
		}
	}
	for text, want := range map[string]bool{
		"task https://github.com/acme/widgets go":   true,
		"Task <https://github.com/acme/widgets> go": true,
		"task list is long, shorten it":             false,
		"tasks https://github.com/acme/widgets":     false,
		"run the task https://x.test/a/b":           false,
	} {
		if got := isTask(text); got != want {
			t.Errorf("isTask(%q) = %v", text, got)
		}
	}
}
