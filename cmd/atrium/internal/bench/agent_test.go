package bench

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/compute/agents"
	"github.com/atriumhq/atrium/compute/modelgw"
)

// startAgentTestServer is cmd/atrium's bench deployment: the scripted agent
// offered as AgentName.
func startAgentTestServer(ctx context.Context, o ServerOptions) (Server, error) {
	return server.Start(ctx, server.Config{Listen: "127.0.0.1:0", DataDir: o.DataDir, HibernateAfter: o.HibernateAfter,
		DrainGrace: time.Second, Logger: o.Logger, AgentsDir: o.AgentsDir,
		Agents: []agents.Spec{{Name: AgentName, Package: "atrium-bench-scripted-agent", Version: "1.0.0", Bin: "acpagent",
			Env:             []string{"FAKE_ACP_STATE=/workspace/.fakeacp"},
			Model:           agents.Model{API: agents.APIAnthropic},
			PermissionModes: map[agents.Mode]agents.Settings{agents.ModeAsk: {}}}},
		Models: modelgw.Config{Providers: []modelgw.Provider{{Name: "anthropic", Kind: modelgw.KindAnthropic, BaseURL: "http://127.0.0.1:9", APIKey: "unused"}}},
	})
}

// TestRun_Agent runs the agent scenario with the actor's scripted ACP agent
// in bubblewrap sandboxes: the first-delta latency is measured over every
// warm turn, and a turn's durable rows do not grow with the chunks streamed.
func TestRun_Agent(t *testing.T) {
	if _, err := exec.LookPath("bwrap"); err != nil {
		t.Fatal("bubblewrap is missing: run .ci/deps")
	}
	bin := filepath.Join(t.TempDir(), "acpagent")
	build := exec.Command("go", "build", "-o", bin, "../../../../actor/testdata/acpagent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the scripted agent: %v: %s", err, out)
	}
	var progress bytes.Buffer
	rep, err := Run(t.Context(), Config{
		Start:      startAgentTestServer,
		Scenarios:  []string{ScenarioAgent},
		AgentBin:   bin,
		AgentTurns: 20,
		Sandboxed:  true,
		DataDir:    t.TempDir(),
		Progress:   &progress,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + progress.String())
	if rep.Failed() || len(rep.Results) != 4 {
		t.Fatalf("results %+v", rep.Results)
	}
	lat := rep.Results[0]
	if lat.Samples != 20 || lat.Median <= 0 || lat.P99 < lat.Median {
		t.Errorf("first delta row %+v: want 20 samples, 0 < p50 <= p99", lat)
	}
	for _, row := range rep.Results[1:] {
		if row.Value < 2 || row.Met == nil || !*row.Met {
			t.Errorf("durable rows row %+v: want the same rows (turn_started, agent_message, turn_finished) whatever the chunks", row)
		}
	}
	if !strings.Contains(rep.Results[3].Measure, "2000 chunks") {
		t.Errorf("last row %+v: want the 2000-chunk turn", rep.Results[3])
	}
}

// TestRun_AgentNeedsBin: asked for without a scripted agent, the agent
// scenario reports a precise error, and the default run leaves it out.
func TestRun_AgentNeedsBin(t *testing.T) {
	rep, err := Run(t.Context(), Config{Start: startAgentTestServer, Scenarios: []string{ScenarioAgent}, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 1 || !strings.Contains(rep.Results[0].Error, "--agent-bin") {
		t.Errorf("results %+v: want one error naming --agent-bin", rep.Results)
	}
}
