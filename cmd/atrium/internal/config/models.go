package config

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/atriumhq/atrium/compute/modelgw"
)

// Models configures the node's model gateway (docs/models.md): the model
// providers sandboxes reach through it, with the real API keys the node
// keeps, and the budgets it enforces.
//
//	models:
//	  providers:
//	    - name: anthropic
//	      kind: anthropic            # anthropic, openai, gemini or openai_compatible
//	      api_key_env: ANTHROPIC_API_KEY   # or api_key_file: /run/secrets/anthropic
//	      models: [claude-sonnet-4-5]      # optional allowlist
//	      prices:                          # US dollars per million tokens
//	        claude-sonnet-4-5: {input: 3, output: 15, cached: 0.3}
//	    - name: local
//	      kind: openai_compatible
//	      base_url: http://127.0.0.1:11434/v1
//	  budgets:
//	    - {scope: session, period: day, tokens: 2000000}
//	    - {scope: tenant, tenant: acme, period: month, cost_usd: 500}
type Models struct {
	Providers []ModelProvider `yaml:"providers"`
	Budgets   []ModelBudget   `yaml:"budgets"`
	// MaxBodyBytes caps a model request's body; 0 means the default (32 MiB).
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
}

// ModelProvider is one upstream model API.
type ModelProvider struct {
	Name string `yaml:"name"`
	Kind string `yaml:"kind"`
	// BaseURL is the API's base URL; empty means the vendor's (required for
	// openai_compatible). anthropic and gemini URLs carry no version,
	// openai ones end in /v1.
	BaseURL string `yaml:"base_url"`
	// APIKeyEnv names the environment variable holding the key; APIKeyFile
	// is a file holding it. Exactly one is set, except for an
	// openai_compatible provider that needs no key.
	APIKeyEnv  string                   `yaml:"api_key_env"`
	APIKeyFile string                   `yaml:"api_key_file"`
	Models     []string                 `yaml:"models"`
	Prices     map[string]modelgw.Price `yaml:"prices"`
}

// ModelBudget limits the model spend of each session or tenant.
type ModelBudget struct {
	Scope   string  `yaml:"scope"`  // session or tenant
	Tenant  string  `yaml:"tenant"` // tenant budgets: this tenant only; empty: each tenant
	Period  string  `yaml:"period"` // hour, day or month
	Tokens  int64   `yaml:"tokens"`
	CostUSD float64 `yaml:"cost_usd"`
}

// Enabled reports whether the node runs a model gateway.
func (m Models) Enabled() bool { return len(m.Providers) > 0 }

// check returns the problems of the models section; keys are not read.
func (m Models) check() []error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...)))
	}
	names := map[string]bool{}
	for i, p := range m.Providers {
		key := fmt.Sprintf("models.providers[%d]", i)
		if err := modelgw.ValidateProvider(p.gateway("")); err != nil {
			bad(key, "%v", err)
		}
		if names[p.Name] && p.Name != "" {
			bad(key+".name", "%q is used by two providers", p.Name)
		}
		names[p.Name] = true
		switch {
		case p.APIKeyEnv != "" && p.APIKeyFile != "":
			bad(key, "set api_key_env or api_key_file, not both")
		case p.APIKeyEnv == "" && p.APIKeyFile == "" && p.Kind != string(modelgw.KindOpenAICompatible):
			bad(key, "set api_key_env (the environment variable holding the key) or api_key_file")
		}
	}
	for i, b := range m.Budgets {
		if err := modelgw.ValidateBudget(b.gateway()); err != nil {
			bad(fmt.Sprintf("models.budgets[%d]", i), "%v", err)
		}
	}
	if len(m.Budgets) > 0 && len(m.Providers) == 0 {
		bad("models.budgets", "budgets are set but no provider is: add models.providers")
	}
	if m.MaxBodyBytes < 0 {
		bad("models.max_body_bytes", "%d: want a number of bytes, or 0 for the default", m.MaxBodyBytes)
	}
	return errs
}

func (p ModelProvider) gateway(key string) modelgw.Provider {
	return modelgw.Provider{Name: p.Name, Kind: modelgw.Kind(p.Kind), BaseURL: p.BaseURL, APIKey: key,
		Models: p.Models, Prices: p.Prices}
}

func (b ModelBudget) gateway() modelgw.Budget {
	return modelgw.Budget{Scope: modelgw.Scope(b.Scope), Tenant: b.Tenant, Period: modelgw.Period(b.Period),
		Tokens: b.Tokens, CostUSD: b.CostUSD}
}

// Gateway returns the gateway's providers and budgets, reading each
// provider's key from its environment variable or file (getenv is
// os.Getenv in atrium). A key that is missing or empty is an error naming
// where it was looked for.
func (m Models) Gateway(getenv func(string) string) (providers []modelgw.Provider, budgets []modelgw.Budget, err error) {
	var errs []error
	for i, p := range m.Providers {
		key := ""
		switch {
		case p.APIKeyEnv != "":
			key = strings.TrimSpace(getenv(p.APIKeyEnv))
			if key == "" {
				errs = append(errs, fmt.Errorf("models.providers[%d] (%s): the environment variable %s is empty or unset", i, p.Name, p.APIKeyEnv))
			}
		case p.APIKeyFile != "":
			b, rerr := os.ReadFile(p.APIKeyFile)
			key = strings.TrimSpace(string(b))
			switch {
			case rerr != nil:
				errs = append(errs, fmt.Errorf("models.providers[%d] (%s): read api_key_file: %w", i, p.Name, rerr))
			case key == "":
				errs = append(errs, fmt.Errorf("models.providers[%d] (%s): api_key_file %s is empty", i, p.Name, p.APIKeyFile))
			}
		}
		providers = append(providers, p.gateway(key))
	}
	for _, b := range m.Budgets {
		budgets = append(budgets, b.gateway())
	}
	return providers, budgets, errors.Join(errs...)
}
