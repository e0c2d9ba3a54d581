package main

import (
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/atriumhq/atrium/compute/vmhost"
)

// defaultVMHostDir is where `atrium vmhost` keeps its image and VMs.
const defaultVMHostDir = "/var/lib/atrium-vmhost"

func newVMHostCmd(env *cliEnv) *cobra.Command {
	var (
		listen, tokenFile, dir, host string
		stateDir                     string
		maxVMs, memory               int
		verbose, noSnapshots         bool
		allow                        []string
	)
	cmd := &cobra.Command{
		Use:     "vmhost --listen ADDR --token-file F --dir D",
		GroupID: "server",
		Short:   "Run a VM host: QEMU microVM sandboxes for a node's remote compute provider",
		Long: `Run a VM host whose sandboxes are QEMU microVMs, one per session, each running
'atrium sandbox-agent'. It serves the provisioning-hook API of the remote compute
provider (POST /create and /destroy, as the node's HTTP hook calls them) plus
POST /sleep and /wake, GET /status, and GET /metrics. Every call but /metrics and
/healthz carries 'Authorization: Bearer <token>', the token in --token-file.

Build the guest image first, from Debian packages: 'atrium vmhost image build --dir D'.
QEMU uses KVM when the CPU offers VT-x/AMD-V, software emulation (TCG) otherwise.

See docs/compute.md.`,
		Example: `  atrium vmhost image build --dir /var/lib/atrium-vmhost
  atrium vmhost --listen 10.0.0.5:7000 --token-file /etc/atrium/vmhost-token --dir /var/lib/atrium-vmhost \
      --allow s3.internal:9000 --allow api.github.com
  # on the node: remote compute with an HTTP hook at http://10.0.0.5:7000 and that token`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if listen == "" {
				return errors.New("vmhost: --listen is required, e.g. --listen 10.0.0.5:7000")
			}
			token, err := readTokenFile(tokenFile)
			if err != nil {
				return err
			}
			if host == "" {
				h, _, err := net.SplitHostPort(listen)
				if err != nil {
					return fmt.Errorf("vmhost: --listen %q: %w", listen, err)
				}
				if h == "" || h == "0.0.0.0" || h == "::" {
					return errors.New("vmhost: --listen binds every address: give --host, the address the nodes reach this host's VMs at")
				}
				host = h
			}
			level := slog.LevelInfo
			if verbose {
				level = slog.LevelDebug
			}
			log := slog.New(slog.NewTextHandler(env.stderr, &slog.HandlerOptions{Level: level}))
			srv, err := vmhost.New(vmhost.Config{Dir: dir, StateDir: stateDir, Token: token, Host: host, MaxVMs: maxVMs,
				MemoryMiB: memory, NoSnapshots: noSnapshots, Allow: allow, Version: buildVersion(), Logger: log})
			if err != nil {
				return err
			}
			defer srv.Close()
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("vmhost: listen on %s: %w", listen, err)
			}
			hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
			log.Info("vm host listening", "url", "http://"+ln.Addr().String(), "accel", srv.Accel(),
				"accel_note", map[string]string{"kvm": "hardware virtualization", "tcg": "software emulation: no VT-x/AMD-V here, VMs are slow"}[srv.Accel()],
				"kernel", srv.Manifest().Kernel, "max_vms", maxVMs, "vms_reach", strings.Join(allow, ","))
			if len(allow) == 0 {
				log.Warn("the VMs may reach nothing outside: workspace saves and restores through the object store's presigned URLs will fail; " +
					"give the object store's host:port with --allow")
			}
			ctx := cmd.Context()
			errc := make(chan error, 1)
			go func() { errc <- hs.Serve(ln) }()
			select {
			case err := <-errc:
				return fmt.Errorf("vmhost: %w", err)
			case <-ctx.Done():
			}
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			hs.Shutdown(sctx)
			log.Info("vm host stopped")
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&listen, "listen", "", "address to serve the API on, host:port (required)")
	fl.StringVar(&tokenFile, "token-file", "", "file holding the token nodes authenticate with (required)")
	fl.StringVar(&dir, "dir", defaultVMHostDir, "directory of the image and the VMs' state")
	fl.StringVar(&stateDir, "state-dir", "", "directory of the VMs' disks and saved memory, emptied at start (default DIR/vms)")
	fl.StringVar(&host, "host", "", "address the VMs' agents are forwarded on and nodes reach (default: --listen's host)")
	fl.IntVar(&maxVMs, "max-vms", vmhost.DefaultMaxVMs, "VMs running at once; beyond, creation is refused")
	fl.IntVar(&memory, "memory", vmhost.DefaultMemoryMiB, "memory of each VM in MiB, when the sandbox names none")
	fl.StringSliceVar(&allow, "allow", nil, "what the VMs may reach, besides the nodes' calls coming in: the object store's host:port (presigned URLs) and the hosts sandboxes may be allowed (sandbox.egress_permit); repeat or separate with commas; nothing else")
	fl.BoolVar(&noSnapshots, "no-snapshots", false, "boot every VM cold instead of cloning a snapshot template of its size")
	fl.BoolVarP(&verbose, "verbose", "v", false, "debug logging")
	cmd.AddCommand(newVMHostImageCmd(env), newVMHostStatusCmd(env))
	return cmd
}

func readTokenFile(path string) (string, error) {
	if path == "" {
		return "", errors.New("vmhost: --token-file is required")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("vmhost: read token: %w", err)
	}
	t := strings.TrimSpace(string(b))
	if len(t) < 16 {
		return "", fmt.Errorf("vmhost: the token in %s is shorter than 16 characters: make one with head -c 24 /dev/urandom | base64 > %s", path, path)
	}
	return t, nil
}

func newVMHostImageCmd(env *cliEnv) *cobra.Command {
	img := &cobra.Command{Use: "image", Short: "Manage the VM host's guest image"}
	var dir, atrium, agentsDir, node string
	build := &cobra.Command{
		Use:   "build --dir D [--agents DIR]",
		Short: "Build the guest image (kernel and initramfs) from Debian packages",
		Long: `Build the guest image from Debian packages only: apt-get download of Debian's cloud
kernel, busybox-static and bubblewrap with its libraries, and an initramfs holding
them, a static atrium (--atrium, default this executable when statically linked) and
an init that runs 'atrium sandbox-agent'. The same inputs give the same image; an
image already built from them is kept.

With --agents (a node's agents install: DATA_DIR/agents after 'atrium agents install',
/var/cache/atrium-agents in CI), the image also gets a read-only tools disk holding
those agents and node (--node, default the node on PATH), which every VM mounts at
` + vmhost.ToolsPath + ` (node also at /usr/local/bin/node).`,
		Example: `  atrium vmhost image build --dir /var/lib/atrium-vmhost
  atrium vmhost image build --dir /var/lib/atrium-vmhost --agents /var/lib/atrium/agents`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if atrium == "" {
				exe, err := os.Executable()
				if err != nil {
					return err
				}
				if !isStatic(exe) {
					return errors.New("vmhost image build: this atrium is dynamically linked: give --atrium, a static build (CGO_ENABLED=0 go build -o atrium-static ./cmd/atrium)")
				}
				atrium = exe
			}
			_, err := vmhost.Build(cmd.Context(), vmhost.BuildConfig{Dir: dir, Atrium: atrium, Version: buildVersion(),
				Agents: agentsDir, Node: node, Progress: env.stderr})
			return err
		},
	}
	build.Flags().StringVar(&dir, "dir", defaultVMHostDir, "directory of the image")
	build.Flags().StringVar(&atrium, "atrium", "", "static atrium binary for the guest (default: this executable)")
	build.Flags().StringVar(&agentsDir, "agents", "", "a node's agents install to put on the image's tools disk, with node")
	build.Flags().StringVar(&node, "node", "", "node binary for the tools disk (default: node on PATH)")
	img.AddCommand(build)
	return img
}

func isStatic(path string) bool {
	f, err := elf.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return false
		}
	}
	return true
}

func newVMHostStatusCmd(env *cliEnv) *cobra.Command {
	var url, tokenFile string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status --url URL --token-file F",
		Short: "Show a VM host's VMs",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			token, err := readTokenFile(tokenFile)
			if err != nil {
				return err
			}
			req, err := http.NewRequestWithContext(cmd.Context(), http.MethodGet, strings.TrimSuffix(url, "/")+"/status", nil)
			if err != nil {
				return err
			}
			req.Header.Set("Authorization", "Bearer "+token)
			resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
			if err != nil {
				return fmt.Errorf("vmhost status: %w", err)
			}
			defer resp.Body.Close()
			var st vmhost.Status
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("vmhost status: %s answered %s", url, resp.Status)
			}
			if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
				return fmt.Errorf("vmhost status: %w", err)
			}
			if asJSON {
				enc := json.NewEncoder(env.stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(st)
			}
			fmt.Fprintf(env.stdout, "accelerator %s, kernel %s, image atrium %s, %d of %d VMs\n", st.Accel, st.Kernel, st.Version, len(st.VMs), st.MaxVMs)
			tw := tabwriter.NewWriter(env.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tSESSION\tSTATE\tADDR\tMEMORY\tRSS\tBOOT")
			for _, v := range st.VMs {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d MiB\t%d MiB\t%d ms\n", v.ID, v.Session, v.State, v.Addr, v.MemoryMiB, v.RSSBytes>>20, v.BootMs)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVar(&url, "url", "http://127.0.0.1:7000", "the VM host's API")
	cmd.Flags().StringVar(&tokenFile, "token-file", "", "file holding the VM host's token (required)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
