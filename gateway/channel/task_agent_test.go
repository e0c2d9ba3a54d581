package channel

import "testing"

// TestParseTask_Agent: "--agent NAME" (or --agent=NAME) picks the coding
// agent of a chat task, before or after --base; a missing name is no task.
func TestParseTask_Agent(t *testing.T) {
	for args, want := range map[string]TaskRequest{
		"https://github.com/acme/widgets --agent claude fix it":             {Repo: "https://github.com/acme/widgets", Base: "main", Agent: "claude", Prompt: "fix it"},
		"https://github.com/acme/widgets --base dev --agent=codex fix it":   {Repo: "https://github.com/acme/widgets", Base: "dev", Agent: "codex", Prompt: "fix it"},
		"<https://github.com/acme/widgets> --agent gemini --base=v2 fix it": {Repo: "https://github.com/acme/widgets", Base: "v2", Agent: "gemini", Prompt: "fix it"},
		"https://github.com/acme/widgets fix it --agent claude":             {Repo: "https://github.com/acme/widgets", Base: "main", Prompt: "fix it --agent claude"},
	} {
		got, ok := parseTask(args)
		if !ok || got != want {
			t.Errorf("parseTask(%q) = %+v, %v; want %+v", args, got, ok, want)
		}
	}
	for _, args := range []string{
		"https://github.com/acme/widgets --agent",
		"https://github.com/acme/widgets --agent claude",
		"https://github.com/acme/widgets --agent --base dev fix it",
	} {
		if got, ok := parseTask(args); ok {
			t.Errorf("parseTask(%q) = %+v, want no task", args, got)
		}
	}
}
