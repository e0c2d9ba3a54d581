package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/atriumhq/atrium/gateway/client"
	"github.com/atriumhq/atrium/gateway/tarball"
	"github.com/atriumhq/atrium/session"
)

// fileCommands returns the workspace commands: cp, files, diff and fork.
func fileCommands(env *cliEnv) []*cobra.Command {
	cmds := []*cobra.Command{newCpCmd(env), newFilesCmd(env), newDiffCmd(env), newForkCmd(env)}
	for _, c := range cmds {
		setFlagErrors(c)
	}
	return cmds
}

// remoteRef splits "ID:PATH"; ok is false for a local path.
func remoteRef(arg string) (id session.ID, p string, ok bool) {
	before, after, found := strings.Cut(arg, ":")
	if !found || before == "" || strings.ContainsAny(before, "/\\.") {
		return "", "", false
	}
	if session.ID(before).Validate() != nil {
		return "", "", false
	}
	return session.ID(before), strings.Trim(strings.TrimPrefix(after, "/workspace"), "/"), true
}

func newCpCmd(env *cliEnv) *cobra.Command {
	var conn connFlags
	cmd := &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy files into or out of a session's workspace",
		Long: `Copy a file or a folder between this machine and a session's workspace. One side is
ID:PATH, a path relative to the session's /workspace ("ID:" is the workspace itself);
the other is a local path, or - for stdin or stdout.

A local folder is sent as an archive and unpacked into PATH (its contents, not the folder
itself); a workspace folder comes back the same way, unpacked into the local folder.
Writes need the driver role and wait for the session's running turn; a copy that fails
midway changes nothing. Reading a session whose sandbox sleeps does not wake it.`,
		Example: `  atrium cp ./agent s_3kq7xq4m2fdh2dnbw5ad:agent      # a folder, into /workspace/agent
  atrium cp input.json s_3kq7xq4m2fdh2dnbw5ad:         # a file, into /workspace/input.json
  atrium cp s_3kq7xq4m2fdh2dnbw5ad:out/result.json .    # a file, out
  atrium cp s_3kq7xq4m2fdh2dnbw5ad:out ./results        # a folder, out
  atrium cp s_3kq7xq4m2fdh2dnbw5ad:log.txt - | less`,
		Args: exactArgs("SRC", "DST"),
		RunE: func(cmd *cobra.Command, args []string) error {
			sid, spath, sRemote := remoteRef(args[0])
			did, dpath, dRemote := remoteRef(args[1])
			if sRemote == dRemote {
				return usageError(cmd, "exactly one of SRC and DST must be a session path ID:PATH")
			}
			c, err := conn.client(cmd, env)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			if dRemote {
				err = copyIn(ctx, env, c, args[0], did, dpath)
			} else {
				err = copyOut(ctx, env, c, sid, spath, args[1])
			}
			return explain(err, conn.server)
		},
	}
	conn.register(cmd)
	return cmd
}

// copyIn copies the local src (a file, a folder or - for stdin) to p of
// session id.
func copyIn(ctx context.Context, env *cliEnv, c *client.Client, src string, id session.ID, p string) error {
	if src == "-" {
		if p == "" {
			return cliError{msg: "give the file's path in the session: ID:PATH"}
		}
		return c.WriteFile(ctx, id, p, env.stdin, -1, 0)
	}
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		if p == "" || strings.HasSuffix(p, "/") {
			p += filepath.Base(src)
		}
		f, err := os.Open(src)
		if err != nil {
			return err
		}
		defer f.Close()
		pr := newProgress(env.stderr, "upload "+src, fi.Size())
		defer pr.done()
		return c.WriteFile(ctx, id, p, pr.reader(f), fi.Size(), fi.Mode().Perm())
	}
	r, w := io.Pipe()
	go func() { w.CloseWithError(tarball.Write(w, src)) }()
	defer r.Close()
	pr := newProgress(env.stderr, "upload "+src, -1)
	defer pr.done()
	return c.WriteArchive(ctx, id, p, pr.reader(r), -1)
}

// copyOut copies p of session id (a file or a folder) to dst (a local
// path, or - for stdout).
func copyOut(ctx context.Context, env *cliEnv, c *client.Client, id session.ID, p, dst string) error {
	isDir := p == ""
	if !isDir {
		_, err := c.ListFiles(ctx, id, p, false)
		var se *session.Error
		switch {
		case err == nil:
			isDir = true
		case errors.As(err, &se) && se.Code == session.CodeConflict:
		default:
			return err
		}
	}
	if !isDir {
		rc, info, err := c.ReadFile(ctx, id, p)
		if err != nil {
			return err
		}
		defer rc.Close()
		if dst == "-" {
			_, err = io.Copy(env.stdout, rc)
			return err
		}
		if fi, err := os.Stat(dst); err == nil && fi.IsDir() {
			dst = filepath.Join(dst, path.Base(p))
		}
		mode := info.Mode
		if mode == 0 {
			mode = 0o644
		}
		pr := newProgress(env.stderr, "download "+p, info.Size)
		defer pr.done()
		return writeLocal(dst, pr.reader(rc), mode)
	}
	rc, err := c.ReadArchive(ctx, id, p)
	if err != nil {
		return err
	}
	defer rc.Close()
	pr := newProgress(env.stderr, "download "+displayRemote(p), -1)
	defer pr.done()
	if dst == "-" {
		_, err = io.Copy(env.stdout, pr.reader(rc))
		return err
	}
	return tarball.Extract(pr.reader(rc), dst, tarball.ExtractOptions{})
}

func displayRemote(p string) string {
	if p == "" {
		return "the workspace"
	}
	return p
}

// writeLocal writes r to dst through a temporary file renamed into place.
func writeLocal(dst string, r io.Reader, mode fs.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".atrium-*")
	if err != nil {
		return err
	}
	_, err = io.Copy(f, r)
	if err == nil {
		err = f.Chmod(mode.Perm())
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), dst)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

// progress prints how much of a transfer is done on stderr, once a second,
// for transfers that last more than a second.
type progress struct {
	w     io.Writer
	what  string
	total int64
	n     int64
	start time.Time
	last  time.Time
	shown bool
}

func newProgress(w io.Writer, what string, total int64) *progress {
	now := time.Now()
	return &progress{w: w, what: what, total: total, start: now, last: now}
}

func (p *progress) reader(r io.Reader) io.Reader { return &progressReader{r: r, p: p} }

type progressReader struct {
	r io.Reader
	p *progress
}

func (pr *progressReader) Read(b []byte) (int, error) {
	n, err := pr.r.Read(b)
	p := pr.p
	p.n += int64(n)
	if now := time.Now(); now.Sub(p.last) >= time.Second {
		p.last = now
		p.print()
	}
	return n, err
}

func (p *progress) print() {
	p.shown = true
	if p.total > 0 {
		fmt.Fprintf(p.w, "\r%s: %s of %s (%d%%)", p.what, humanBytes(p.n), humanBytes(p.total), p.n*100/p.total)
		return
	}
	fmt.Fprintf(p.w, "\r%s: %s", p.what, humanBytes(p.n))
}

func (p *progress) done() {
	if p.shown {
		p.print()
		fmt.Fprintln(p.w)
	}
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func newFilesCmd(env *cliEnv) *cobra.Command {
	var (
		conn      connFlags
		recursive bool
		asJSON    bool
	)
	cmd := &cobra.Command{
		Use:   "files ID [PATH]",
		Short: "List the files of a session's workspace",
		Long: `List a folder of a session's workspace (its root without PATH): mode, size, time
of last change and path of each entry. A session whose sandbox sleeps is listed from its
saved workspace without waking it.`,
		Example: `  atrium files s_3kq7xq4m2fdh2dnbw5ad
  atrium files s_3kq7xq4m2fdh2dnbw5ad src -r
  atrium files s_3kq7xq4m2fdh2dnbw5ad --json | jq '.[].path'`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 1 || len(args) > 2 {
				return usageError(cmd, "files takes ID and an optional PATH (got %d arguments)", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := conn.client(cmd, env)
			if err != nil {
				return err
			}
			dir := ""
			if len(args) == 2 {
				dir = strings.Trim(strings.TrimPrefix(args[1], "/workspace"), "/")
			}
			entries, err := c.ListFiles(cmd.Context(), session.ID(args[0]), dir, recursive)
			if err != nil {
				return explain(err, conn.server)
			}
			if asJSON {
				if entries == nil {
					entries = []session.FileEntry{}
				}
				return writeJSON(env.stdout, entries)
			}
			tw := tabwriter.NewWriter(env.stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
			now := time.Now()
			for _, e := range entries {
				name := e.Path
				switch e.Type {
				case "dir":
					name += "/"
				case "symlink":
					name += " -> " + e.Target
				}
				size := strconv.FormatInt(e.Size, 10)
				if e.Type != "file" {
					size = "-"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t %s\n", e.Mode, size, clock(e.MTime, now), name)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVarP(&recursive, "recursive", "r", false, "list everything below PATH")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the entries as JSON")
	conn.register(cmd)
	return cmd
}

func newDiffCmd(env *cliEnv) *cobra.Command {
	var (
		conn   connFlags
		turn   int64
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "diff ID",
		Short: "Show what a turn changed in a session's workspace",
		Long: `Show the files a turn added (A), modified (M) and deleted (D) in the workspace, with a
unified diff of each small text file. The changes come from the workspace as saved before
and after the turn, not from what the agent reported. Without --turn, the last finished
turn.`,
		Example: `  atrium diff s_3kq7xq4m2fdh2dnbw5ad
  atrium diff s_3kq7xq4m2fdh2dnbw5ad --turn 3
  atrium diff s_3kq7xq4m2fdh2dnbw5ad --json`,
		Args: exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := conn.client(cmd, env)
			if err != nil {
				return err
			}
			id := session.ID(args[0])
			if turn == 0 {
				if turn, err = lastTurn(cmd.Context(), c, id); err != nil {
					return explain(err, conn.server)
				}
				if turn == 0 {
					return cliError{msg: "no turn of " + string(id) + " has finished yet", hint: "send it a prompt: atrium send " + string(id) + " 'make something' --wait"}
				}
			}
			files, err := c.TurnChanges(cmd.Context(), id, turn)
			if err != nil {
				return explain(err, conn.server)
			}
			if asJSON {
				if files == nil {
					files = []session.FileChange{}
				}
				return writeJSON(env.stdout, files)
			}
			if len(files) == 0 {
				fmt.Fprintf(env.stdout, "turn %d changed no files\n", turn)
				return nil
			}
			for _, f := range files {
				fmt.Fprintf(env.stdout, "%s %s\n", strings.ToUpper(f.Status[:1]), f.Path)
			}
			for _, f := range files {
				if f.Diff != "" {
					fmt.Fprintf(env.stdout, "\n%s", f.Diff)
				}
			}
			return nil
		},
	}
	cmd.Flags().Int64Var(&turn, "turn", 0, "the turn to show (default: the last finished)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the changes as JSON")
	conn.register(cmd)
	return cmd
}

// lastTurn returns the number of id's last finished turn, 0 if none.
func lastTurn(ctx context.Context, c *client.Client, id session.ID) (int64, error) {
	var last int64
	after := session.Seq(0)
	for {
		page, err := c.Events(ctx, id, after, 1000)
		if err != nil {
			return 0, err
		}
		for _, ev := range page.Events {
			after = ev.Seq
			if ev.Kind == session.KindTurnFinished {
				var d session.TurnFinishedData
				if err := json.Unmarshal(ev.Data, &d); err == nil {
					last = d.Turn
				}
			}
		}
		if len(page.Events) == 0 || after >= page.LastSeq {
			return last, nil
		}
	}
}

func newForkCmd(env *cliEnv) *cobra.Command {
	var (
		conn  connFlags
		at    int64
		title string
	)
	cmd := &cobra.Command{
		Use:   "fork ID",
		Short: "Copy a session, history and workspace, into a new one of yours",
		Long: `Make a new session owned by you from another you can read: its history up to --at
(default: all of it; its first event says where it came from) and its workspace as of
then. The workspace is shared by content, not copied, so a fork is quick whatever its size.
Prints the new session's id.`,
		Example: `  atrium fork s_3kq7xq4m2fdh2dnbw5ad
  atrium fork s_3kq7xq4m2fdh2dnbw5ad --at 42 --title "try another way"`,
		Args: exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if at < 0 {
				return usageError(cmd, "--at must be a seq of the session, 1 or more")
			}
			c, err := conn.client(cmd, env)
			if err != nil {
				return err
			}
			s, err := c.Fork(cmd.Context(), session.ID(args[0]), client.ForkRequest{AtSeq: at, Title: title})
			if err != nil {
				return explain(err, conn.server)
			}
			fmt.Fprintln(env.stdout, s.ID)
			return nil
		},
	}
	cmd.Flags().Int64Var(&at, "at", 0, "the last event (seq) of the session the fork keeps")
	cmd.Flags().StringVar(&title, "title", "", "the fork's title (default: the session's)")
	conn.register(cmd)
	return cmd
}
