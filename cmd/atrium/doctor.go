package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/atriumhq/atrium/cmd/atrium/internal/config"
	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/storage/blob"
)

// doctorTimeout bounds each of doctor's network checks.
const doctorTimeout = 10 * time.Second

// doctorCheck is one line of doctor's checklist.
type doctorCheck struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
	// Fix says what to do about a failed check.
	Fix string `json:"fix,omitempty"`
}

func newDoctorCmd(env *cliEnv) *cobra.Command {
	var path string
	var dev, asJSON bool
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check a configuration and this machine before running Atrium",
		Long: `Check a configuration file (as 'atrium config check' does) and the environment
'atrium serve' would run in, for the process's roles: bubblewrap can create a
sandbox and cgroup controllers exist for sandbox limits (node), the data
directory is writable, the embedded NATS store is writable or the external NATS
cluster answers with JetStream, the object store (directory or S3) accepts a
probe object (node), the OIDC issuer answers discovery (gateway), and the
listen address is free.

Each check prints ✓ or ✗, and every ✗ says what to do. Exit status 1 if any
check fails. Nothing is changed, except a probe object put and deleted again.`,
		Example: `  atrium doctor --config /etc/atrium/atrium.yaml
  atrium doctor --config atrium.yaml --json | jq '.[] | select(.ok | not)'
  atrium doctor --dev                     # the defaults of 'atrium dev'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			checks := runDoctor(cmd.Context(), path, dev, env.getenv)
			failed := 0
			for _, c := range checks {
				if !c.OK {
					failed++
				}
			}
			if asJSON {
				b, err := json.MarshalIndent(checks, "", "  ")
				if err != nil {
					return err
				}
				fmt.Fprintf(env.stdout, "%s\n", b)
			} else {
				for _, c := range checks {
					mark := "✓"
					if !c.OK {
						mark = "✗"
					}
					fmt.Fprintf(env.stdout, "%s %-13s %s\n", mark, c.Name, c.Detail)
					if !c.OK && c.Fix != "" {
						fmt.Fprintf(env.stdout, "  %-13s fix: %s\n", "", c.Fix)
					}
				}
			}
			if failed > 0 {
				msg := fmt.Sprintf("%d of %d checks failed", failed, len(checks))
				if asJSON {
					msg = ""
				}
				return exitError{code: 1, msg: msg}
			}
			if !asJSON {
				fmt.Fprintf(env.stdout, "\nAll %d checks passed.\n", len(checks))
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&path, "config", "c", "", "configuration file (YAML); ATRIUM_* variables override it")
	cmd.Flags().BoolVar(&dev, "dev", false, "check for 'atrium dev' (allows the dev identity)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the checks as a JSON array")
	return cmd
}

// runDoctor runs every check of the configuration at path.
func runDoctor(ctx context.Context, path string, dev bool, getenv func(string) string) []doctorCheck {
	f, err := config.Load(path, getenv)
	if err != nil {
		return []doctorCheck{{Name: "config", Detail: err.Error(),
			Fix: "correct the file; see docs/configuration.md for every setting"}}
	}
	where := path
	if where == "" {
		where = "defaults and ATRIUM_* variables"
	}
	cfgCheck := doctorCheck{Name: "config", OK: true, Detail: where + " is valid"}
	if err := f.Validate(dev); err != nil {
		cfgCheck = doctorCheck{Name: "config", Detail: strings.ReplaceAll(err.Error(), "\n", "; "),
			Fix: "correct the settings named; 'atrium config check FILE' prints the effective configuration"}
	}
	checks := []doctorCheck{cfgCheck, {Name: "roles", OK: true, Detail: rolesDetail(f)}}
	dataDir, err := filepath.Abs(f.DataDir)
	if err != nil {
		dataDir = f.DataDir
	}
	node := f.HasRole(config.RoleNode)
	if node && (f.Sandbox.Provider == "" || f.Sandbox.Provider == server.ProviderLocal) {
		if f.Sandbox.UnsafeNoSandbox {
			checks = append(checks, doctorCheck{Name: "bubblewrap", OK: true,
				Detail: "not used: sandbox.unsafe_no_sandbox runs harnesses WITHOUT isolation"})
		} else {
			checks = append(checks, checkBubblewrap(ctx))
		}
		checks = append(checks, checkCgroups(f.Sandbox))
	}
	checks = append(checks, checkWritable("data dir", dataDir))
	if len(f.NATS.URLs) == 0 {
		checks = append(checks, checkWritable("nats store", filepath.Join(dataDir, "nats")))
	} else {
		checks = append(checks, checkNATS(ctx, f))
	}
	if node {
		checks = append(checks, checkStore(ctx, f, dataDir))
		checks = append(checks, checkAgents(dataDir, f.Agents)) // agents.go
	}
	if f.Auth.Mode == config.AuthOIDC && f.HasRole(config.RoleGateway) {
		checks = append(checks, checkIssuer(ctx, f.Auth.OIDC.Issuer))
	}
	checks = append(checks, checkListen(f.Listen))
	return checks
}

// rolesDetail says what a process with f's roles runs.
func rolesDetail(f *config.File) string {
	var what []string
	if f.HasRole(config.RoleGateway) {
		what = append(what, "gateway (clients, web UI)")
	}
	if f.HasRole(config.RoleNode) {
		what = append(what, "node (sessions, sandboxes)")
	}
	nats := "embedded NATS"
	if len(f.NATS.URLs) > 0 {
		nats = fmt.Sprintf("NATS at %s, %d replicas", strings.Join(f.NATS.URLs, ", "), f.NATS.Replicas)
	}
	return fmt.Sprintf("%s as node id %s; %s", strings.Join(what, " + "), f.Node.ID, nats)
}

// checkNATS connects to the external NATS cluster of f and asks JetStream
// for the account's limits.
func checkNATS(ctx context.Context, f *config.File) doctorCheck {
	c := doctorCheck{Name: "nats"}
	n := f.NATS
	nc, err := server.ConnectNATS(server.NATS{
		URLs: n.URLs, CredsFile: n.Creds, NKeyFile: n.NKey, User: n.User, Password: n.Password,
		CAFile: n.TLS.CA, CertFile: n.TLS.Cert, KeyFile: n.TLS.Key, Name: n.Name + "-doctor",
	}, nil)
	if err != nil {
		c.Detail = err.Error()
		c.Fix = "start the NATS cluster (deploy/nats/) or correct nats.urls, and check nats.creds / nats.tls"
		return c
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(ctx, doctorTimeout)
	defer cancel()
	js, err := jetstream.New(nc)
	if err == nil {
		var ai *jetstream.AccountInfo
		if ai, err = js.AccountInfo(ctx); err == nil {
			c.OK = true
			c.Detail = fmt.Sprintf("connected to %s (%s); JetStream storage %s used of %s", nc.ConnectedServerName(),
				nc.ConnectedUrlRedacted(), fmtBytes(int64(ai.Store)), fmtLimit(ai.Limits.MaxStore))
			if known := len(nc.Servers()); n.Replicas > known {
				c.OK = false
				c.Detail += fmt.Sprintf("; but nats.replicas is %d and only %d servers are known", n.Replicas, known)
				c.Fix = fmt.Sprintf("run a cluster of at least %d servers, or lower nats.replicas", n.Replicas)
			}
			return c
		}
	}
	c.Detail = fmt.Sprintf("connected to %s, but JetStream does not answer: %v", nc.ConnectedServerName(), err)
	c.Fix = "enable JetStream on the NATS servers (jetstream {} in their config; see deploy/nats/) and give this account access"
	return c
}

// checkBubblewrap runs a trivial command in a bubblewrap sandbox with the
// namespaces local sandboxes use.
func checkBubblewrap(ctx context.Context) doctorCheck {
	c := doctorCheck{Name: "bubblewrap"}
	bin, err := exec.LookPath("bwrap")
	if err != nil {
		c.Detail = "bwrap is not installed"
		c.Fix = "install bubblewrap (apt-get install bubblewrap; dnf install bubblewrap), or set sandbox.provider remote"
		return c
	}
	ctx, cancel := context.WithTimeout(ctx, doctorTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--unshare-all", "--die-with-parent", "--new-session",
		"--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "/bin/sh", "-c", "echo sandboxed").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "sandboxed" {
		c.Detail = fmt.Sprintf("%s cannot create a sandbox: %v: %s", bin, err, strings.TrimSpace(string(out)))
		c.Fix = "allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1; on Ubuntu 24.04+ " +
			"kernel.apparmor_restrict_unprivileged_userns=0), or run in a container with --security-opt seccomp=unconfined and apparmor=unconfined"
		return c
	}
	c.OK, c.Detail = true, bin+" created a sandbox"
	return c
}

// checkCgroups checks for the memory, pids and cpu controllers that local
// sandboxes' limits use, on a cgroup v2 hierarchy (or v1 hierarchies).
func checkCgroups(sb config.Sandbox) doctorCheck {
	c := doctorCheck{Name: "cgroups"}
	var have []string
	version := "v2"
	if b, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		have = strings.Fields(string(b))
	} else {
		version = "v1"
		for _, ctrl := range []string{"memory", "pids", "cpu"} {
			if fi, err := os.Stat(filepath.Join("/sys/fs/cgroup", ctrl)); err == nil && fi.IsDir() {
				have = append(have, ctrl)
			}
		}
	}
	var missing []string
	for _, want := range []string{"memory", "pids", "cpu"} {
		found := false
		for _, h := range have {
			found = found || h == want
		}
		if !found {
			missing = append(missing, want)
		}
	}
	if len(missing) > 0 {
		c.Detail = fmt.Sprintf("cgroup %s lacks the %s controller(s) (found: %s); sandboxes run without those limits",
			version, strings.Join(missing, ", "), strings.Join(have, " "))
		c.Fix = "on cgroup v2, delegate the controllers (systemd: Delegate=yes, as in deploy/systemd/atrium.service); " +
			"in a container, mount /sys/fs/cgroup read-write (compose: cgroup: host)"
		if sb.MemoryBytes == 0 && sb.Pids == 0 && sb.CPUs == 0 {
			c.Fix += "; or accept it: no limits are configured"
		}
		return c
	}
	c.OK, c.Detail = true, "cgroup "+version+" with the memory, pids and cpu controllers"
	return c
}

// checkWritable checks that dir (or, if it does not exist yet, the nearest
// existing parent, where it would be created) is a writable directory.
func checkWritable(name, dir string) doctorCheck {
	c := doctorCheck{Name: name}
	probe := dir
	for {
		if _, err := os.Stat(probe); err == nil || errors.Is(err, os.ErrNotExist) && filepath.Dir(probe) == probe {
			break
		}
		probe = filepath.Dir(probe)
	}
	if err := server.ProbeDir(probe); err != nil {
		c.Detail = err.Error()
		c.Fix = "make " + probe + " a directory writable by the user atrium runs as (and check the disk is not full)"
		return c
	}
	c.OK = true
	c.Detail = dir + " is writable"
	if probe != dir {
		c.Detail = dir + " will be created in " + probe + ", which is writable"
	}
	var st syscall.Statfs_t
	if syscall.Statfs(probe, &st) == nil {
		free := st.Bavail * uint64(st.Bsize)
		c.Detail += fmt.Sprintf(" (%.1f GiB free)", float64(free)/(1<<30))
		if free < 1<<30 {
			c.OK = false
			c.Fix = "free disk space: less than 1 GiB is left for histories and the NATS store"
		}
	}
	return c
}

// checkStore puts, reads back and deletes a probe object in the configured
// object store.
func checkStore(ctx context.Context, f *config.File, dataDir string) doctorCheck {
	c := doctorCheck{Name: "object store"}
	if f.Storage.Type != server.StorageS3 {
		dir := f.Storage.Dir
		if dir == "" {
			dir = filepath.Join(dataDir, "objects")
		}
		w := checkWritable("object store", dir)
		w.Detail = "directory " + w.Detail
		return w
	}
	s3 := f.Storage.S3
	ctx, cancel := context.WithTimeout(ctx, doctorTimeout)
	defer cancel()
	st, err := blob.OpenS3(ctx, blob.S3Config{Endpoint: s3.Endpoint, Bucket: s3.Bucket, Prefix: s3.Prefix, Region: s3.Region,
		AccessKey: s3.AccessKey, SecretKey: s3.SecretKey, Secure: !s3.Insecure})
	if err == nil {
		err = server.ProbeStore(ctx, st)
		st.Close()
	}
	if err != nil {
		c.Detail = fmt.Sprintf("s3 %s bucket %s: %v", s3.Endpoint, s3.Bucket, err)
		c.Fix = "check storage.s3.endpoint is reachable, the bucket exists, and the access key may put, get and delete objects"
		return c
	}
	c.OK, c.Detail = true, fmt.Sprintf("s3 %s bucket %s accepts a probe object", s3.Endpoint, s3.Bucket)
	return c
}

// checkIssuer fetches the OIDC issuer's discovery document.
func checkIssuer(ctx context.Context, issuer string) doctorCheck {
	c := doctorCheck{Name: "oidc issuer"}
	ctx, cancel := context.WithTimeout(ctx, doctorTimeout)
	defer cancel()
	u := strings.TrimSuffix(issuer, "/") + "/.well-known/openid-configuration"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		c.Detail, c.Fix = fmt.Sprintf("bad issuer URL %q: %v", issuer, err), "set auth.oidc.issuer to the provider's issuer URL"
		return c
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.Detail = fmt.Sprintf("discovery at %s: %v", u, err)
		c.Fix = "check the issuer URL and that this machine can reach it (DNS, proxy, firewall)"
		return c
	}
	defer resp.Body.Close()
	var doc struct {
		Issuer string `json:"issuer"`
	}
	err = json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&doc)
	switch {
	case resp.StatusCode != http.StatusOK:
		c.Detail = fmt.Sprintf("discovery at %s answered %s", u, resp.Status)
	case err != nil:
		c.Detail = fmt.Sprintf("discovery at %s is not JSON: %v", u, err)
	case strings.TrimSuffix(doc.Issuer, "/") != strings.TrimSuffix(issuer, "/"):
		c.Detail = fmt.Sprintf("discovery at %s names issuer %q, not %q", u, doc.Issuer, issuer)
	default:
		c.OK, c.Detail = true, "discovery at "+u+" answers"
		return c
	}
	c.Fix = "set auth.oidc.issuer to exactly the issuer the provider announces"
	return c
}

// checkListen checks that the listen address is free.
func checkListen(addr string) doctorCheck {
	c := doctorCheck{Name: "listen"}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		c.Detail = err.Error()
		c.Fix = "stop what uses " + addr + " (another atrium?) or set listen to another address"
		return c
	}
	ln.Close()
	c.OK, c.Detail = true, addr+" is free"
	return c
}
