package vmhost

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// template is a booted, paused guest saved to disk: its memory (mem, a
// QEMU migration stream) and its workspace disk (disk). Clones restore
// the memory onto a copy of the disk, then get their own configuration.
type template struct {
	mem, disk string

	once sync.Once
	err  error
}

// template returns the snapshot template of memMiB, making it on first
// use: a cold boot up to the point where the guest waits for its
// configuration, then a migration to a file.
func (s *Server) template(ctx context.Context, memMiB int) (*template, error) {
	s.tplMu.Lock()
	t := s.templates[memMiB]
	if t == nil {
		// Sandbox IDs cannot start with a dot.
		dir := filepath.Join(s.cfg.StateDir, ".template-"+strconv.Itoa(memMiB))
		t = &template{mem: filepath.Join(dir, "mem"), disk: filepath.Join(dir, "disk.img")}
		s.templates[memMiB] = t
	}
	s.tplMu.Unlock()
	t.once.Do(func() {
		start := time.Now()
		t.err = s.makeTemplate(ctx, t, memMiB)
		if t.err == nil {
			s.log.Info("snapshot template made", "memory_mib", memMiB, "took", time.Since(start).Round(time.Millisecond))
		}
	})
	if t.err != nil {
		// Try again next time.
		s.tplMu.Lock()
		if s.templates[memMiB] == t {
			delete(s.templates, memMiB)
		}
		s.tplMu.Unlock()
		return nil, t.err
	}
	return t, nil
}

func (s *Server) makeTemplate(ctx context.Context, t *template, memMiB int) error {
	dir := filepath.Dir(t.mem)
	os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	v := &vm{id: "template", dir: dir, memMiB: memMiB, done: make(chan struct{})}
	defer v.stop()
	if err := makeDisk(ctx, t.disk, s.cfg.DiskBytes); err != nil {
		return fmt.Errorf("template disk: %w", err)
	}
	if err := s.startQEMU(v, ""); err != nil {
		return err
	}
	// The guest is ready when its init waits for the configuration.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		b, _ := os.ReadFile(filepath.Join(dir, "console.log"))
		if strings.Contains(string(b), "waiting for the configuration") {
			break
		}
		select {
		case <-v.done:
			return fmt.Errorf("template VM exited: %v (console: %s)", v.err, consoleTail(v))
		case <-ctx.Done():
			return fmt.Errorf("template VM did not boot: %w (console: %s)", ctx.Err(), consoleTail(v))
		case <-tick.C:
		}
	}
	if err := v.saveTo(ctx, t.mem); err != nil {
		os.Remove(t.mem)
		return fmt.Errorf("template snapshot: %w", err)
	}
	return nil
}

// saveTo pauses v and writes its memory and device state to path.
func (v *vm) saveTo(ctx context.Context, path string) error {
	if _, err := v.qmp(ctx, "stop", nil); err != nil {
		return err
	}
	if _, err := v.qmp(ctx, "migrate", map[string]any{"uri": "exec:cat > " + path}); err != nil {
		return err
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		raw, err := v.qmp(ctx, "query-migrate", nil)
		if err != nil {
			return err
		}
		var st struct {
			Status    string `json:"status"`
			ErrorDesc string `json:"error-desc"`
		}
		json.Unmarshal(raw, &st)
		switch st.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("migration %s: %s", st.Status, st.ErrorDesc)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-v.done:
			return errors.New("QEMU exited while saving")
		case <-tick.C:
		}
	}
}

// resume waits until v's QEMU has loaded its incoming state, then runs it.
func resume(ctx context.Context, v *vm) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		raw, err := v.qmp(ctx, "query-status", nil)
		if err == nil {
			var st struct {
				Status string `json:"status"`
			}
			json.Unmarshal(raw, &st)
			switch st.Status {
			case "inmigrate":
			case "running":
				return nil
			case "paused", "postmigrate", "prelaunch":
				_, err := v.qmp(ctx, "cont", nil)
				return err
			default:
				return fmt.Errorf("restore: QEMU is %s", st.Status)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("restore: %w", ctx.Err())
		case <-v.done:
			return fmt.Errorf("restore: QEMU exited: %v", v.err)
		case <-tick.C:
		}
	}
}

// copySparse copies a disk image, keeping it sparse (or sharing its blocks
// where the file system can).
func copySparse(ctx context.Context, src, dst string) error {
	if out, err := command(ctx, "", "cp", "--reflink=auto", "--sparse=always", src, dst); err != nil {
		return fmt.Errorf("cp: %w: %s", err, out)
	}
	return nil
}
