package sqlite_test

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/sqlite"
)

// crashEnv names the history directory a crash child writes to.
const crashEnv = "ATRIUM_SQLITE_CRASH_DIR"

// TestLog_CrashSafety kills -9 a process that is appending and checks that
// every append it acknowledged survived, with no gap and no corruption.
func TestLog_CrashSafety(t *testing.T) {
	if dir := os.Getenv(crashEnv); dir != "" {
		crashChild(dir)
		return
	}
	ctx := context.Background()
	d := newDir(t)
	l := mustCreate(t, d, "s_crash")
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(os.Args[0], "-test.run=^TestLog_CrashSafety$")
	cmd.Env = append(os.Environ(), crashEnv+"="+d.Path)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var acked session.Seq
	sc := bufio.NewScanner(out)
	for acked < 3000 && sc.Scan() {
		if s, ok := strings.CutPrefix(sc.Text(), "acked "); ok {
			acked, _ = strconv.ParseInt(s, 10, 64)
		}
	}
	cmd.Process.Kill() // SIGKILL, mid-stream.
	cmd.Wait()
	if acked < 3000 {
		t.Fatalf("child acknowledged only %d events", acked)
	}

	l, err = d.Open(ctx, "s_crash")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	last, _ := l.LastSeq(ctx)
	if last < acked {
		t.Fatalf("LastSeq = %d, but %d was acknowledged", last, acked)
	}
	evs, more, err := l.Range(ctx, 0, int(last)+1, 0)
	if err != nil || more || !slices.Equal(seqs(t, evs), seqRange(1, last)) {
		t.Fatalf("Range after crash: %d events, more %v, err %v; want 1..%d", len(evs), more, err, last)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if res := integrityCheck(t, filepath.Join(d.Path, "s_crash.db")); res != "ok" {
		t.Errorf("integrity_check: %s", res)
	}
	t.Logf("acknowledged %d, recovered %d", acked, last)
}

// crashChild appends batches of 1 to 16 events to s_crash and prints the last
// acknowledged seq after each, until it is killed (or a minute passes).
func crashChild(dir string) {
	ctx := context.Background()
	d := &sqlite.Dir{Path: dir}
	l, err := d.Open(ctx, "s_crash")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	w := bufio.NewWriter(os.Stdout)
	deadline := time.Now().Add(time.Minute)
	for next, n := session.Seq(1), 1; time.Now().Before(deadline); next, n = next+session.Seq(n), n%16+1 {
		if err := l.Append(ctx, batch(next, n, 300)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		fmt.Fprintf(w, "acked %d\n", next+session.Seq(n)-1)
		w.Flush()
	}
	os.Exit(3)
}

func integrityCheck(t *testing.T, path string) string {
	t.Helper()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var res string
	if err := db.QueryRow(`PRAGMA integrity_check`).Scan(&res); err != nil {
		t.Fatal(err)
	}
	return res
}

// journalMode returns the journal mode of a database file as a connection
// that does not set it sees.
func journalMode(t *testing.T, path string) string {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var mode string
	if err := db.QueryRow(`PRAGMA journal_mode`).Scan(&mode); err != nil {
		t.Fatal(err)
	}
	return mode
}

func setUserVersion(t *testing.T, path string, v int) {
	t.Helper()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(fmt.Sprintf(`PRAGMA user_version = %d`, v)); err != nil {
		t.Fatal(err)
	}
}

// diskFullEnv names the small tmpfs a disk-full child writes to.
const diskFullEnv = "ATRIUM_SQLITE_DISKFULL_DIR"

// TestLog_DiskFull fills a real 1 MiB tmpfs, mounted in a private mount
// namespace of a child process, and checks the error and the recovery.
func TestLog_DiskFull(t *testing.T) {
	if dir := os.Getenv(diskFullEnv); dir != "" {
		diskFullChild(t, dir)
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a tmpfs")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("needs unshare(1)")
	}
	dir := t.TempDir()
	cmd := exec.Command("unshare", "-m", "sh", "-c", `mount -t tmpfs -o size=1m tmpfs "$1" && exec "$2" -test.run='^TestLog_DiskFull$' -test.v`,
		"sh", dir, os.Args[0])
	cmd.Env = append(os.Environ(), diskFullEnv+"="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestLog_DiskFull") {
		t.Fatalf("disk-full child: %v\n%s", err, out)
	}
	t.Logf("child:\n%s", out)
}

func diskFullChild(t *testing.T, dir string) {
	ctx := context.Background()
	filler := filepath.Join(dir, "filler")
	if err := os.WriteFile(filler, make([]byte, 256<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	d := &sqlite.Dir{Path: dir}
	l := mustCreate(t, d, "s_a")
	var err error
	next := session.Seq(1)
	for ; next < 100000 && err == nil; next += 16 {
		err = l.Append(ctx, batch(next, 16, 300))
	}
	next -= 16
	if !errors.Is(err, session.ErrUnavailable) || !strings.Contains(err.Error(), "disk full writing history") {
		t.Fatalf("Append on a full disk: %v", err)
	}
	t.Log(err)
	if evs, _, err := l.Range(ctx, 0, 100000, 0); err != nil || !slices.Equal(seqs(t, evs), seqRange(1, next-1)) {
		t.Fatalf("Range on a full disk: %d events, %v; want 1..%d", len(evs), err, next-1)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	mustAppend(t, l, batch(next, 16, 300)...)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}
