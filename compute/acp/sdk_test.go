package acp

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"

	sdk "github.com/coder/acp-go-sdk"

	"github.com/atriumhq/atrium/session"
)

// sdkAgent is an ACP agent written with github.com/coder/acp-go-sdk, the
// protocol's Go implementation: the client must interoperate with it, its
// typed decoding of the client's requests and answers included.
type sdkAgent struct {
	conn    *sdk.AgentSideConnection
	outcome chan string   // what the permission request was answered
	waiting chan struct{} // closed once a "wait" prompt waits
	mode    string
}

var _ sdk.Agent = (*sdkAgent)(nil)
var _ sdk.AgentLoader = (*sdkAgent)(nil)

func (a *sdkAgent) Authenticate(context.Context, sdk.AuthenticateRequest) (sdk.AuthenticateResponse, error) {
	return sdk.AuthenticateResponse{}, nil
}

func (a *sdkAgent) Initialize(_ context.Context, p sdk.InitializeRequest) (sdk.InitializeResponse, error) {
	if p.ClientCapabilities.Terminal || p.ClientCapabilities.Fs.ReadTextFile || p.ClientCapabilities.Fs.WriteTextFile {
		return sdk.InitializeResponse{}, fmt.Errorf("client advertised capabilities it lacks: %+v", p.ClientCapabilities)
	}
	return sdk.InitializeResponse{ProtocolVersion: sdk.ProtocolVersionNumber, AgentCapabilities: sdk.AgentCapabilities{LoadSession: true}}, nil
}

func (a *sdkAgent) Cancel(context.Context, sdk.CancelNotification) error { return nil }

func (a *sdkAgent) NewSession(_ context.Context, p sdk.NewSessionRequest) (sdk.NewSessionResponse, error) {
	if p.Cwd != "/workspace" {
		return sdk.NewSessionResponse{}, fmt.Errorf("cwd %q", p.Cwd)
	}
	return sdk.NewSessionResponse{SessionId: "sdk-1"}, nil
}

func (a *sdkAgent) LoadSession(ctx context.Context, p sdk.LoadSessionRequest) (sdk.LoadSessionResponse, error) {
	_ = a.conn.SessionUpdate(ctx, sdk.SessionNotification{SessionId: p.SessionId, Update: sdk.UpdateAgentMessageText("replayed")})
	return sdk.LoadSessionResponse{}, nil
}

func (a *sdkAgent) SetSessionMode(_ context.Context, p sdk.SetSessionModeRequest) (sdk.SetSessionModeResponse, error) {
	a.mode = string(p.ModeId)
	return sdk.SetSessionModeResponse{}, nil
}

func (a *sdkAgent) ListSessions(context.Context, sdk.ListSessionsRequest) (sdk.ListSessionsResponse, error) {
	return sdk.ListSessionsResponse{}, nil
}

func (a *sdkAgent) ResumeSession(context.Context, sdk.ResumeSessionRequest) (sdk.ResumeSessionResponse, error) {
	return sdk.ResumeSessionResponse{}, nil
}

func (a *sdkAgent) CloseSession(context.Context, sdk.CloseSessionRequest) (sdk.CloseSessionResponse, error) {
	return sdk.CloseSessionResponse{}, nil
}

func (a *sdkAgent) SetSessionConfigOption(context.Context, sdk.SetSessionConfigOptionRequest) (sdk.SetSessionConfigOptionResponse, error) {
	return sdk.SetSessionConfigOptionResponse{}, nil
}

func (a *sdkAgent) Prompt(ctx context.Context, p sdk.PromptRequest) (sdk.PromptResponse, error) {
	send := func(u sdk.SessionUpdate) {
		_ = a.conn.SessionUpdate(ctx, sdk.SessionNotification{SessionId: p.SessionId, Update: u})
	}
	if len(p.Prompt) != 1 || p.Prompt[0].Text == nil {
		return sdk.PromptResponse{}, fmt.Errorf("prompt %+v", p.Prompt)
	}
	switch p.Prompt[0].Text.Text {
	case "work":
		send(sdk.UpdateAgentThoughtText("thinking"))
		send(sdk.UpdateAgentMessageText("Let me "))
		send(sdk.UpdateAgentMessageText("edit."))
		send(sdk.StartToolCall("c1", "Edit a.go", sdk.WithStartKind(sdk.ToolKindEdit), sdk.WithStartStatus(sdk.ToolCallStatusPending),
			sdk.WithStartContent([]sdk.ToolCallContent{sdk.ToolDiffContent("/workspace/a.go", "new", "old")}),
			sdk.WithStartLocations([]sdk.ToolCallLocation{{Path: "/workspace/a.go", Line: sdk.Ptr(3)}})))
		resp, err := a.conn.RequestPermission(ctx, sdk.RequestPermissionRequest{
			SessionId: p.SessionId,
			ToolCall:  sdk.ToolCallUpdate{ToolCallId: "c1", Title: sdk.Ptr("Edit a.go"), Kind: sdk.Ptr(sdk.ToolKindEdit)},
			Options: []sdk.PermissionOption{
				{Kind: sdk.PermissionOptionKindAllowOnce, Name: "Allow", OptionId: "allow"},
				{Kind: sdk.PermissionOptionKindRejectAlways, Name: "Never", OptionId: "never"},
			},
		})
		switch {
		case err != nil:
			a.outcome <- "error: " + err.Error()
		case resp.Outcome.Selected != nil:
			a.outcome <- "selected " + string(resp.Outcome.Selected.OptionId)
		default:
			a.outcome <- "cancelled"
		}
		send(sdk.UpdateToolCall("c1", sdk.WithUpdateStatus(sdk.ToolCallStatusCompleted),
			sdk.WithUpdateContent([]sdk.ToolCallContent{sdk.ToolContent(sdk.TextBlock("ok"))})))
		send(sdk.UpdatePlan(sdk.PlanEntry{Content: "ship", Priority: sdk.PlanEntryPriorityHigh, Status: sdk.PlanEntryStatusPending}))
		send(sdk.UpdateAgentMessageText("Done."))
		return sdk.PromptResponse{StopReason: sdk.StopReasonEndTurn}, nil
	case "wait":
		send(sdk.UpdateAgentMessageText("waiting"))
		close(a.waiting)
		// The SDK cancels the prompt's context on session/cancel.
		<-ctx.Done()
		return sdk.PromptResponse{StopReason: sdk.StopReasonCancelled}, nil
	}
	return sdk.PromptResponse{StopReason: sdk.StopReasonRefusal}, nil
}

func TestClient_WithSDKAgent(t *testing.T) {
	toAgentR, toAgentW := io.Pipe()
	fromAgentR, fromAgentW := io.Pipe()
	ag := &sdkAgent{outcome: make(chan string, 1), waiting: make(chan struct{})}
	ag.conn = sdk.NewAgentSideConnection(ag, fromAgentW, toAgentR)
	ag.conn.SetLogger(slog.New(slog.DiscardHandler))
	c := Start(toAgentW, fromAgentR, Config{Logger: slog.New(slog.DiscardHandler)})
	t.Cleanup(func() {
		toAgentW.Close()
		fromAgentW.Close()
		<-ag.conn.Done()
		c.Wait()
	})
	ctx := context.Background()
	info, err := c.Initialize(ctx)
	if err != nil || !info.Capabilities.LoadSession || info.ProtocolVersion != 1 {
		t.Fatalf("initialize: %+v %v", info, err)
	}
	if id, err := c.NewSession(ctx, "/workspace", nil); err != nil || id != "sdk-1" {
		t.Fatalf("session/new: %q %v", id, err)
	}
	if err := c.SetMode(ctx, "ask"); err != nil || ag.mode != "ask" {
		t.Fatalf("set mode: %v (mode %q)", err, ag.mode)
	}

	rec := newRecorder()
	rec.answer = func(p Permission) (string, bool) { return "never", true }
	stop, err := c.Prompt(ctx, 1, "work", rec)
	if err != nil || stop != StopEndTurn {
		t.Fatalf("prompt: %q %v", stop, err)
	}
	if got := <-ag.outcome; got != "selected never" {
		t.Errorf("the SDK agent read the permission answer as %q", got)
	}
	if k := strings.Join(rec.kinds(), " "); k != "agent_thought agent_message tool_call tool_call_update plan agent_message" {
		t.Fatalf("events: %s", k)
	}
	tc := decode[session.ToolCallData](t, rec.events[2].data)
	if tc.ID != "c1" || tc.Kind != "edit" || tc.Status != "pending" || len(tc.Content) != 1 || tc.Content[0].Type != "diff" ||
		tc.Content[0].Path != "/workspace/a.go" || *tc.Content[0].OldText != "old" || tc.Content[0].NewText != "new" ||
		len(tc.Locations) != 1 || *tc.Locations[0].Line != 3 {
		t.Errorf("tool_call = %s", rec.events[2].data)
	}
	if m := decode[session.AgentMessageData](t, rec.events[1].data); m.Text != "Let me edit." {
		t.Errorf("message = %+v", m)
	}
	if p := decode[session.PlanData](t, rec.events[4].data); len(p.Entries) != 1 || p.Entries[0] != (session.PlanEntry{Content: "ship", Status: "pending", Priority: "high"}) {
		t.Errorf("plan = %s", rec.events[4].data)
	}
	perm := <-rec.perms
	if perm.Title != "Edit a.go" || len(perm.Options) != 2 || perm.Options[1] != (session.ApprovalOption{ID: "never", Name: "Never", Kind: "reject_always"}) {
		t.Errorf("permission = %+v", perm)
	}

	// Cancel, through the SDK's typed session/cancel.
	rec = newRecorder()
	done := make(chan string, 1)
	go func() {
		stop, _ := c.Prompt(ctx, 2, "wait", rec)
		done <- stop
	}()
	<-ag.waiting
	if err := c.Cancel(); err != nil {
		t.Fatal(err)
	}
	if stop := <-done; stop != StopCancelled {
		t.Errorf("cancelled prompt stopped with %q", stop)
	}
	if k := strings.Join(rec.kinds(), " "); k != "agent_message" {
		t.Errorf("events: %s", k)
	}

	// A load: the SDK agent's replay is not recorded.
	if err := c.LoadSession(ctx, "sdk-1", "/workspace", nil); err != nil {
		t.Fatalf("session/load: %v", err)
	}
	rec = newRecorder()
	if stop, err := c.Prompt(ctx, 3, "other", rec); err != nil || stop != StopRefusal || len(rec.kinds()) != 0 {
		t.Errorf("prompt after load: %q %v %v", stop, err, rec.kinds())
	}
}
