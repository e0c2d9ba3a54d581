package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestModels_Check(t *testing.T) {
	for name, tc := range map[string]struct {
		yaml string
		want string // "" for valid
	}{
		"ok": {`providers:
  - {name: a, kind: anthropic, api_key_env: K, prices: {claude-x: {input: 3, output: 15}}}
  - {name: l, kind: openai_compatible, base_url: "http://127.0.0.1:11434/v1"}
budgets:
  - {scope: session, period: day, tokens: 100}`, ""},
		"unknown kind": {`providers: [{name: a, kind: azure, api_key_env: K}]`, `models.providers[0]: unknown kind "azure" (one of anthropic, openai, gemini, openai_compatible)`},
		"both keys":    {`providers: [{name: a, kind: openai, api_key_env: K, api_key_file: /f}]`, "set api_key_env or api_key_file, not both"},
		"no key":       {`providers: [{name: a, kind: gemini}]`, "set api_key_env (the environment variable holding the key) or api_key_file"},
		"bad url":      {`providers: [{name: a, kind: openai, base_url: "api.openai.com/v1", api_key_env: K}]`, `base_url "api.openai.com/v1" is not an http(s) URL`},
		"no base url":  {`providers: [{name: a, kind: openai_compatible}]`, "base_url is required for kind openai_compatible"},
		"two names":    {`providers: [{name: a, kind: openai, api_key_env: K}, {name: a, kind: gemini, api_key_env: K}]`, `models.providers[1].name: "a" is used by two providers`},
		"budget": {`providers: [{name: a, kind: openai, api_key_env: K}]
budgets: [{scope: session, period: week, tokens: 1}]`, `models.budgets[0]: unknown period "week" (hour, day or month)`},
		"unknown key": {`providers: [{name: a, kind: openai, api_key: sk-x}]`, "api_key"},
	} {
		t.Run(name, func(t *testing.T) {
			var f File
			err := Parse([]byte("models:\n  "+strings.ReplaceAll(tc.yaml, "\n", "\n  ")+"\n"), &f)
			if err == nil {
				err = errors.Join(f.Models.check()...)
			}
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("valid config refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}

func TestModels_Gateway(t *testing.T) {
	keyFile := filepath.Join(t.TempDir(), "key")
	os.WriteFile(keyFile, []byte("sk-file\n"), 0o600)
	m := Models{Providers: []ModelProvider{
		{Name: "a", Kind: "anthropic", APIKeyEnv: "A_KEY"},
		{Name: "o", Kind: "openai", APIKeyFile: keyFile},
	}, Budgets: []ModelBudget{{Scope: "tenant", Tenant: "acme", Period: "month", CostUSD: 5}}}
	ps, bs, err := m.Gateway(func(k string) string { return map[string]string{"A_KEY": "sk-env"}[k] })
	if err != nil {
		t.Fatal(err)
	}
	if ps[0].APIKey != "sk-env" || ps[1].APIKey != "sk-file" || bs[0].Tenant != "acme" || bs[0].CostUSD != 5 {
		t.Fatalf("providers %+v budgets %+v", ps, bs)
	}
	_, _, err = m.Gateway(func(string) string { return "" })
	if err == nil || !strings.Contains(err.Error(), "the environment variable A_KEY is empty or unset") {
		t.Fatalf("missing key: %v", err)
	}
}
