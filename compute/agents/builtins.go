package agents

// Builtins returns the built-in agents, at the versions the real-agent tests
// (agents_e2e_test.go) run. Each entry is what those tests showed the agent
// needs to run offline in a sandbox against the node's model gateway, with
// its own sandboxing off (Atrium's sandbox is the boundary).
func Builtins() []Spec {
	return []Spec{claude(), codex(), gemini(), opencode()}
}

// claude is Claude Code through Zed's ACP adapter.
//
// Claude Code refuses to bypass permissions as root unless IS_SANDBOX=1 (a
// sandbox runs as uid 1000, but --unsafe-no-sandbox runs as the server's
// user). Its permission mode is permissions.defaultMode of the user
// settings in ~/.claude. ANTHROPIC_API_KEY makes its SDK send x-api-key.
func claude() Spec {
	settings := func(mode string) Settings {
		return Settings{Files: map[string]string{
			".claude/settings.json": `{"permissions":{"defaultMode":"` + mode + `"}}` + "\n",
		}}
	}
	return Spec{
		Name:        "claude",
		Description: "Claude Code (Anthropic) through Zed's ACP adapter",
		Package:     "@zed-industries/claude-agent-acp",
		Version:     "0.23.1",
		Bin:         "node_modules/.bin/claude-agent-acp",
		Env: []string{
			"IS_SANDBOX=1",
			"CLAUDE_CONFIG_DIR=" + PHHome + "/.claude",
			"DISABLE_AUTOUPDATER=1",
			"DISABLE_TELEMETRY=1",
			"DISABLE_ERROR_REPORTING=1",
			"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1",
		},
		Model: Model{
			API:        APIAnthropic,
			BaseURLEnv: []string{"ANTHROPIC_BASE_URL"},
			KeyEnv:     []string{"ANTHROPIC_API_KEY"},
		},
		PermissionModes: map[Mode]Settings{
			ModeAsk:      settings("default"),
			ModeAutoEdit: settings("acceptEdits"),
			ModeAuto:     settings("bypassPermissions"),
		},
		Load: true,
		// Claude Code appends the answer to its transcript after it
		// answers session/prompt.
		WritesAfterAnswer: true,
	}
}

// codex is OpenAI's Codex through Zed's ACP adapter (a native program in a
// per-platform package, started directly rather than through its node
// wrapper).
//
// Codex ignores OPENAI_BASE_URL: the gateway is a model provider of its own,
// given with -c, whose key is read from OPENAI_API_KEY. Its own sandbox is
// off (danger-full-access); approval_policy carries the permission mode.
func codex() Spec {
	policy := func(p string) Settings {
		return Settings{Args: []string{"-c", `approval_policy="` + p + `"`}}
	}
	return Spec{
		Name:        "codex",
		Description: "Codex (OpenAI) through Zed's ACP adapter",
		Package:     "@zed-industries/codex-acp",
		Version:     "0.16.0",
		Bin:         "node_modules/@zed-industries/codex-acp-linux-" + PHArch + "/bin/codex-acp",
		Args: []string{
			"-c", `model_provider="atrium"`,
			"-c", `model_providers.atrium.name="Atrium model gateway"`,
			"-c", `model_providers.atrium.base_url="` + PHBaseURL + `"`,
			"-c", `model_providers.atrium.env_key="OPENAI_API_KEY"`,
			"-c", `model_providers.atrium.wire_api="responses"`,
			"-c", `sandbox_mode="danger-full-access"`,
			"-c", `check_for_update_on_startup=false`,
		},
		Env: []string{"CODEX_HOME=" + PHHome + "/.codex"},
		Files: map[string]string{
			// CODEX_HOME must exist.
			".codex/.keep": "",
		},
		Model: Model{
			API:    APIOpenAI,
			KeyEnv: []string{"OPENAI_API_KEY"},
		},
		PermissionModes: map[Mode]Settings{
			ModeAsk:      policy("untrusted"),
			ModeAutoEdit: policy("on-request"),
			ModeAuto:     policy("never"),
		},
		Load: true,
	}
}

// gemini is Google's Gemini CLI in its ACP mode.
//
// It authenticates with the gemini-api-key method, reading GEMINI_API_KEY
// and GOOGLE_GEMINI_BASE_URL; its approval mode is a flag.
func gemini() Spec {
	approval := func(m string) Settings {
		return Settings{Args: []string{"--approval-mode", m}}
	}
	return Spec{
		Name:        "gemini",
		Description: "Gemini CLI (Google) in ACP mode",
		Package:     "@google/gemini-cli",
		Version:     "0.61.0",
		Bin:         "node_modules/.bin/gemini",
		// An explicit model: in its "auto" mode Gemini CLI first asks a
		// small model to route each prompt, and retries with backoff
		// (over a minute) when the answer is not the JSON it expects.
		Args: []string{"--acp", "--model", PHModel},
		Env: []string{
			"GEMINI_SANDBOX=false",
			"GEMINI_TELEMETRY_ENABLED=false",
			"GEMINI_CLI_NO_RELAUNCH=true",
		},
		Model: Model{
			API:        APIGemini,
			BaseURLEnv: []string{"GOOGLE_GEMINI_BASE_URL"},
			KeyEnv:     []string{"GEMINI_API_KEY"},
			Name:       "gemini-2.5-pro",
		},
		Files: map[string]string{
			// An untrusted folder runs in the default approval mode
			// whatever the flag says.
			".gemini/trustedFolders.json": `{"` + PHWorkspace + `":"TRUST_FOLDER"}` + "\n",
		},
		Authenticate: "gemini-api-key",
		PermissionModes: map[Mode]Settings{
			ModeAsk:      approval("default"),
			ModeAutoEdit: approval("auto_edit"),
			ModeAuto:     approval("yolo"),
		},
		// Gemini CLI 0.61.0 advertises loadSession, but a new process
		// starts the session's chat record afresh (a header and the
		// session context, which hide the conversation from its session
		// list) while it looks the session up, and then often answers
		// "No previous sessions found for this project": a race seen
		// both ways in TestRealAgents/gemini. A new process is
		// re-hydrated from the history instead.
		Load: false,
	}
}

// opencode is OpenCode in its ACP mode, with the gateway as an
// Anthropic-compatible provider given in OPENCODE_CONFIG_CONTENT (the key
// is read from the environment by OpenCode's {env:…} substitution).
func opencode() Spec {
	perm := func(edit, bash string) Settings {
		return Settings{Env: []string{`OPENCODE_PERMISSION={"edit":"` + edit + `","bash":"` + bash + `","webfetch":"` + bash + `"}`}}
	}
	return Spec{
		Name:        "opencode",
		Description: "OpenCode in ACP mode",
		Package:     "opencode-ai",
		Version:     "1.18.33",
		Bin:         "node_modules/.bin/opencode",
		Args:        []string{"acp"},
		Env: []string{
			`OPENCODE_CONFIG_CONTENT={"$schema":"https://opencode.ai/config.json","autoupdate":false,"share":"disabled",` +
				`"model":"anthropic/` + PHModel + `","provider":{"anthropic":{"options":{"baseURL":"` + PHBaseURL + `/v1","apiKey":"{env:ANTHROPIC_API_KEY}"}}}}`,
			"OPENCODE_DISABLE_AUTOUPDATE=true",
			"OPENCODE_DISABLE_MODELS_FETCH=true",
			"OPENCODE_DISABLE_LSP_DOWNLOAD=true",
		},
		Model: Model{
			API:    APIAnthropic,
			KeyEnv: []string{"ANTHROPIC_API_KEY"},
			Name:   "claude-sonnet-4-5",
		},
		PermissionModes: map[Mode]Settings{
			ModeAsk:      perm("ask", "ask"),
			ModeAutoEdit: perm("allow", "ask"),
			ModeAuto:     perm("allow", "allow"),
		},
		Load: true,
	}
}
