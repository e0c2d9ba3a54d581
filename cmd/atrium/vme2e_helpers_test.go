package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/atriumhq/atrium/storage/blob/blobtest"
)

// vmHostSetup is a test's `atrium vmhost`: the binary and image it runs,
// where it listens and keeps its state, and the token the node gives it;
// what a restart needs.
type vmHostSetup struct {
	bin, image       string
	listen, state    string
	token, tokenFile string
	args             []string // extra flags, given at every start
}

// newVMHost starts `atrium vmhost` from bin and image on a free loopback
// port, with a short state dir (QMP socket paths are limited) and a fresh
// token (tokenPrefix and the time) written to a file in dir; args are extra
// flags.
func newVMHost(t *testing.T, bin, image, dir, tokenPrefix string, args ...string) (*vmHostSetup, *vmHostProc) {
	t.Helper()
	v := &vmHostSetup{bin: bin, image: image, args: args,
		token: tokenPrefix + strconv.FormatInt(time.Now().UnixNano(), 36), tokenFile: filepath.Join(dir, "vmhost-token")}
	if err := os.WriteFile(v.tokenFile, []byte(v.token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	v.listen = ln.Addr().String()
	ln.Close()
	if v.state, err = os.MkdirTemp("", "vmh"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(v.state) })
	return v, v.start(t)
}

// start starts the VM host (again, after a kill) and waits until it answers.
func (v *vmHostSetup) start(t *testing.T) *vmHostProc {
	t.Helper()
	return startVMHost(t, v.bin, v.image, v.state, v.listen, v.tokenFile, v.args...)
}

// config returns a config's sandbox and storage sections: sandboxes on this
// VM host (sandboxExtra, indented lines such as "  sleep_after: 2s\n",
// added to the sandbox section) and workspaces in s3.
func (v *vmHostSetup) config(s3 *blobtest.S3Server, sandboxExtra string) string {
	return fmt.Sprintf(`sandbox:
  provider: remote
%s  remote:
    vm_hosts:
      - url: http://%s
        token_file: %s
storage:
  type: s3
  s3: {endpoint: %q, bucket: %q, access_key: %q, secret_key: %q, insecure: true}
`, sandboxExtra, v.listen, v.tokenFile, s3.Endpoint, s3.Bucket, s3.AccessKey, s3.SecretKey)
}

// agentDataDir makes dir/data with the agents cache as its agents directory
// (<data>/agents), so `atrium dev` on it runs the pinned agents.
func agentDataDir(t *testing.T, dir string) string {
	t.Helper()
	data := filepath.Join(dir, "data")
	if err := os.MkdirAll(data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(agentsCacheDir(), filepath.Join(data, "agents")); err != nil {
		t.Fatal(err)
	}
	return data
}

// anthropicModels returns a config's agent_mode (auto) and models sections:
// one anthropic provider at baseURL whose key is key, read from
// ATRIUM_TEST_ANTHROPIC_KEY (set for the test).
func anthropicModels(t *testing.T, baseURL, key string) string {
	t.Setenv("ATRIUM_TEST_ANTHROPIC_KEY", key)
	return `agent_mode: auto
models:
  providers:
    - name: anthropic
      kind: anthropic
      base_url: ` + baseURL + `
      api_key_env: ATRIUM_TEST_ANTHROPIC_KEY
`
}
