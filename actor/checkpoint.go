package actor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	proto "github.com/asynkron/protoactor-go/actor"

	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/blob"
)

// Checkpoints (DESIGN §4): a consistent copy of a session's history file in
// Config.Checkpoints under sessions/<id>/history/, written at hibernation,
// every CheckpointInterval while active and when the node drains. The
// manifest (sessions/<id>/history/manifest.json) names the newest copy and
// is written conditionally, like compute/mount's workspace manifests
// (If-None-Match for the first, If-Match on the ETag read for the next), in
// one request: a writer whose fence is older than the manifest's is refused
// with errFenced and its session stops, so a node that lost its lease never
// writes over the new owner's checkpoint.

// checkpointVersion is the manifest format this node writes and reads.
const checkpointVersion = 1

// maxCheckpointManifest bounds the manifest a node reads.
const maxCheckpointManifest = 64 << 10

// checkpointManifest says which copy is the newest checkpoint of a session.
type checkpointManifest struct {
	Version int         `json:"version"`
	Fence   int64       `json:"fence"`
	LastSeq session.Seq `json:"last_seq"`
	Epoch   string      `json:"epoch"`
	// StreamSeq is an events-stream sequence such that every event after
	// LastSeq was stored after it: replay starts just past it.
	StreamSeq uint64    `json:"stream_seq"`
	Object    string    `json:"object"` // key of the database copy
	Node      string    `json:"node"`
	Saved     time.Time `json:"saved"`
}

// errFenced means a checkpoint was refused: a newer owner wrote the manifest.
var errFenced = errors.New("actor: checkpoint fenced by a newer owner")

// backuper is a History that can write a consistent copy of itself, such as
// storage/sqlite.Log; it returns the seq of the last event in the copy.
type backuper interface {
	Backup(ctx context.Context, w io.Writer) (session.Seq, error)
}

// restorer is a Histories that can replace a history with a copy Backup
// wrote, such as storage/sqlite.Dir.
type restorer interface {
	Restore(ctx context.Context, id session.ID, r io.Reader) error
}

func historyPrefix(id session.ID) string { return "sessions/" + string(id) + "/history/" }
func manifestKey(id session.ID) string   { return historyPrefix(id) + "manifest.json" }

// readCheckpoint returns id's checkpoint manifest and its ETag; nil if
// there is none.
func (h *Host) readCheckpoint(ctx context.Context, id session.ID) (*checkpointManifest, string, error) {
	rc, info, err := h.cfg.Checkpoints.Get(ctx, manifestKey(id))
	if errors.Is(err, blob.ErrNotFound) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("read checkpoint manifest: %w", err)
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, maxCheckpointManifest))
	if err != nil {
		return nil, "", fmt.Errorf("read checkpoint manifest: %w", err)
	}
	var m checkpointManifest
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, "", fmt.Errorf("read checkpoint manifest: %w", err)
	}
	if m.Version != checkpointVersion {
		return nil, "", fmt.Errorf("read checkpoint manifest: version %d, this atrium reads version %d", m.Version, checkpointVersion)
	}
	return &m, info.ETag, nil
}

// checkpoint writes a copy of hist as id's newest checkpoint with fence.
// streamSeq is the committer's acked sequence read before the copy is made.
// It writes nothing when the newest checkpoint is already this fence's at
// the same seq. A newer fence in the manifest fails with errFenced. Before
// the copy and again before the manifest, l must still be valid (its check
// sees the node lease's age): a node paused past its lease writes nothing.
// l is nil only in tests of the object store's own fence. It returns the
// last seq the checkpoint holds.
func (h *Host) checkpoint(ctx context.Context, id session.ID, epoch string, hist History, fence int64, streamSeq uint64, l *lease) (session.Seq, error) {
	guard := func() error { return nil }
	if l != nil {
		guard = l.check
	}
	last, err := h.writeCheckpoint(ctx, id, epoch, hist, fence, streamSeq, guard)
	if err != nil {
		return 0, fmt.Errorf("checkpoint session %s: %w", id, err)
	}
	return last, nil
}

func (h *Host) writeCheckpoint(ctx context.Context, id session.ID, epoch string, hist History, fence int64, streamSeq uint64, guard func() error) (session.Seq, error) {
	if h.cfg.Checkpoints == nil {
		return 0, nil
	}
	b, ok := hist.(backuper)
	if !ok {
		return 0, nil
	}
	if err := guard(); err != nil {
		return 0, err
	}
	cur, etag, err := h.readCheckpoint(ctx, id)
	if err != nil {
		return 0, err
	}
	if cur != nil && cur.Fence > fence {
		return 0, fmt.Errorf("%w (fence %d > %d)", errFenced, cur.Fence, fence)
	}
	if last, err := hist.LastSeq(ctx); err == nil && cur != nil && cur.Fence == fence && cur.LastSeq == last {
		return last, nil // Nothing new.
	}
	var sp spool
	defer sp.close()
	last, err := b.Backup(ctx, &sp)
	if err != nil {
		return 0, err
	}
	copyR, size, err := sp.reader()
	if err != nil {
		return 0, err
	}
	m := checkpointManifest{
		Version: checkpointVersion, Fence: fence, LastSeq: last, Epoch: epoch, StreamSeq: streamSeq,
		Object: historyPrefix(id) + strconv.FormatInt(fence, 10) + "-" + strconv.FormatInt(int64(last), 10) + "-" + randomHex() + ".db",
		Node:   h.cfg.NodeID, Saved: time.Now().UTC(),
	}
	if _, err := h.cfg.Checkpoints.Put(ctx, m.Object, copyR, size, blob.PutOptions{IfNoneMatch: true}); err != nil {
		return 0, fmt.Errorf("upload copy: %w", err)
	}
	data, _ := json.Marshal(m)
	if err := guard(); err != nil {
		h.cfg.Checkpoints.Delete(context.WithoutCancel(ctx), m.Object)
		return 0, err
	}
	put := func(etag string) error {
		opts := blob.PutOptions{ContentType: "application/json", IfMatch: etag, IfNoneMatch: etag == ""}
		_, err := h.cfg.Checkpoints.Put(ctx, manifestKey(id), bytes.NewReader(data), int64(len(data)), opts)
		return err
	}
	err = put(etag)
	if errors.Is(err, blob.ErrPrecondition) {
		// Written meanwhile. By a newer owner: fenced. By an older one
		// (a write it began before its lease expired, landing late):
		// ours supersedes it.
		now, nowETag, rerr := h.readCheckpoint(ctx, id)
		switch {
		case rerr == nil && now != nil && now.Fence > fence:
			err = fmt.Errorf("%w (fence %d > %d)", errFenced, now.Fence, fence)
		case rerr == nil && now != nil && now.Fence < fence:
			cur = now
			err = put(nowETag)
		}
	}
	if errors.Is(err, blob.ErrPrecondition) {
		err = fmt.Errorf("another writer wrote the manifest meanwhile: %w", err)
	}
	if err != nil && !errors.Is(err, errFenced) {
		err = fmt.Errorf("write manifest: %w", err)
	}
	if err != nil {
		h.cfg.Checkpoints.Delete(context.WithoutCancel(ctx), m.Object)
		return 0, err
	}
	if cur != nil && cur.Object != m.Object {
		if err := h.cfg.Checkpoints.Delete(ctx, cur.Object); err != nil {
			h.log.Warn("delete old checkpoint", "session", id, "err", err)
		}
	}
	h.log.Debug("checkpointed", "session", id, "last_seq", last, "fence", fence, "bytes", size)
	return last, nil
}

// spoolMemory is how much of a checkpoint copy a spool keeps in memory;
// larger copies go to a temporary file. Most histories are far smaller, and
// creating and deleting a file per checkpoint is what costs on a busy node.
const spoolMemory = 4 << 20

// spool collects a checkpoint copy: in memory up to spoolMemory bytes, in
// a temporary file beyond.
type spool struct {
	buf bytes.Buffer
	f   *os.File
}

func (s *spool) Write(p []byte) (int, error) {
	if s.f == nil && s.buf.Len()+len(p) <= spoolMemory {
		return s.buf.Write(p)
	}
	if s.f == nil {
		f, err := os.CreateTemp("", "atrium-checkpoint-*")
		if err != nil {
			return 0, fmt.Errorf("spool checkpoint copy: %w", err)
		}
		s.f = f
		if _, err := s.buf.WriteTo(f); err != nil {
			return 0, fmt.Errorf("spool checkpoint copy: %w", err)
		}
	}
	return s.f.Write(p)
}

// reader returns the copy and its size.
func (s *spool) reader() (io.Reader, int64, error) {
	if s.f == nil {
		return bytes.NewReader(s.buf.Bytes()), int64(s.buf.Len()), nil
	}
	size, err := s.f.Seek(0, io.SeekCurrent)
	if err == nil {
		_, err = s.f.Seek(0, io.SeekStart)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("spool checkpoint copy: %w", err)
	}
	return s.f, size, nil
}

// close removes the temporary file, if any.
func (s *spool) close() {
	if s.f != nil {
		s.f.Close()
		os.Remove(s.f.Name())
	}
}

// deleteCheckpoints removes every checkpoint of a deleted session.
func (h *Host) deleteCheckpoints(ctx context.Context, id session.ID) error {
	if h.cfg.Checkpoints == nil {
		return nil
	}
	var errs []error
	if err := h.cfg.Checkpoints.Delete(ctx, manifestKey(id)); err != nil {
		errs = append(errs, err)
	}
	for info, err := range h.cfg.Checkpoints.List(ctx, historyPrefix(id)) {
		if err != nil {
			errs = append(errs, err)
			break
		}
		if err := h.cfg.Checkpoints.Delete(ctx, info.Key); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("delete checkpoints: %w", err)
	}
	return nil
}

// restoreCheckpoint replaces id's local history with the newest
// checkpoint m.
func (h *Host) restoreCheckpoint(ctx context.Context, id session.ID, m *checkpointManifest) error {
	r, ok := h.cfg.Histories.(restorer)
	if !ok {
		return fmt.Errorf("restore checkpoint of session %s: this node's history store cannot restore", id)
	}
	rc, _, err := h.cfg.Checkpoints.Get(ctx, m.Object)
	if err != nil {
		return fmt.Errorf("restore checkpoint of session %s: %w", id, err)
	}
	defer rc.Close()
	if err := r.Restore(ctx, id, rc); err != nil {
		return fmt.Errorf("restore checkpoint of session %s: %w", id, err)
	}
	return nil
}

// armCheckpoint starts the periodic checkpoint timer of an active session.
func (s *sessionActor) armCheckpoint() {
	if s.h.cfg.Checkpoints == nil || s.timers.ckptTimer != nil || s.act.lost {
		return
	}
	s.timers.ckptTimer = time.AfterFunc(s.h.cfg.CheckpointInterval, func() { s.send(&checkpointTick{}) })
}

func (s *sessionActor) stopCheckpointTimer() {
	if s.timers.ckptTimer != nil {
		s.timers.ckptTimer.Stop()
		s.timers.ckptTimer = nil
	}
}

// startCheckpoint writes a checkpoint off the actor if anything was
// committed since the last one; checkpointDone follows.
func (s *sessionActor) startCheckpoint() {
	if s.act.phase != phaseActive || s.hist == nil || s.events.committer == nil || s.ckptRunning {
		return
	}
	if s.events.durable == s.ckptSeq || s.events.committer.uncaptured.Load() {
		s.armCheckpoint()
		return
	}
	s.ckptRunning = true
	hist, fence, epoch, acked, l := s.hist, s.fence, s.events.meta.Epoch, s.events.committer.acked.Load(), s.lease
	s.readsWG.Add(1) // close waits for it before closing hist.
	s.spawn(func() {
		defer s.readsWG.Done()
		ctx, cancel := context.WithTimeout(s.h.ctx, openTimeout)
		defer cancel()
		var seq session.Seq
		var err error
		if l.valid() {
			seq, err = s.h.checkpoint(ctx, s.id, epoch, hist, fence, acked, l)
		}
		s.send(&checkpointDone{seq: seq, err: err})
	})
}

func (s *sessionActor) onCheckpointDone(ctx proto.Context, m *checkpointDone) {
	s.ckptRunning = false
	switch {
	case errors.Is(m.err, errFenced):
		s.onLeaseLost(ctx, "a newer owner wrote its checkpoint")
		return
	case m.err != nil:
		s.log.Warn("checkpoint", "err", m.err)
	default:
		s.ckptSeq = m.seq
		if s.lease != nil && s.h.cfg.Checkpoints != nil {
			s.lease.checkpointed.Store(int64(m.seq))
		}
	}
	if s.act.phase == phaseActive {
		s.armCheckpoint()
	}
}
