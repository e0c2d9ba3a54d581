package actor

// The session's workspace as files (DESIGN §7 "More REST"): list, read,
// write, delete, archives out and in, the changes of a turn, and forks.
//
// Reads come from the saved workspace in the object store (compute/mount),
// never from the sandbox: the workspace is saved at the end of every turn,
// after every write and every SaveInterval during a turn, so between turns
// the saved copy is the workspace, and a session whose sandbox sleeps is
// read without waking anything (the actor is activated, which takes
// milliseconds, but the sandbox is not). During a turn a read sees the
// workspace as of the turn's last periodic save.
//
// Writes are ordered with turns: the bytes are received into a temporary
// file first (so an interrupted upload changes nothing), then the write
// waits in the actor's file queue until no turn and no other sandbox
// operation runs, and runs before the next queued turn. With an awake local
// sandbox it changes the workspace directory and saves it; otherwise it
// uploads the content and rewrites the saved manifest, and the sandbox
// restores it when it next wakes. Each write is logged as files_changed and
// recorded as a mark (compute/mount.Mark) like the end of a turn.

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/atriumhq/atrium/compute/mount"
	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/blob"
)

// Defaults of FilesConfig.
const (
	// DefaultMaxFileBytes is the largest file (and uploaded archive) a
	// write accepts.
	DefaultMaxFileBytes = 1 << 30
	// DefaultStreamTimeout is how long a byte stream waits for its peer's
	// next chunk or answer.
	DefaultStreamTimeout = 30 * time.Second
)

// maxChangedPaths bounds the paths one files_changed event lists.
const maxChangedPaths = 1000

// FilesConfig limits the file operations of sessions' workspaces.
type FilesConfig struct {
	// MaxFileBytes is the largest file a write accepts, and the largest
	// archive an archive upload accepts; DefaultMaxFileBytes if zero.
	MaxFileBytes int64
	// Quota is the largest workspace (total bytes of its files) that
	// writes may make; zero means no quota.
	Quota int64
	// StreamTimeout is how long a byte stream waits for its peer;
	// DefaultStreamTimeout if zero.
	StreamTimeout time.Duration
	// TempDir is where uploads are received before they are applied;
	// os.TempDir() if empty.
	TempDir string
}

func (c FilesConfig) maxFile() int64 {
	if c.MaxFileBytes > 0 {
		return c.MaxFileBytes
	}
	return DefaultMaxFileBytes
}

func (c FilesConfig) streamTimeout() time.Duration {
	if c.StreamTimeout > 0 {
		return c.StreamTimeout
	}
	return DefaultStreamTimeout
}

// fileQueue is the actor's state of file writes: those received and
// waiting for the running turn, and the uploads still being received.
type fileQueue struct {
	pending []*fileOp
	staging int
	reading int // reads being answered or streamed
	// ctx ends the uploads being received and the reads being sent when
	// the actor stops.
	ctx    context.Context
	cancel context.CancelFunc
}

// context returns the context of uploads, cancelled by abort.
func (q *fileQueue) context(parent context.Context) context.Context {
	if q.ctx == nil {
		q.ctx, q.cancel = context.WithCancel(parent)
	}
	return q.ctx
}

// abort ends the uploads being received and answers the queued writes
// unavailable: the session is stopping (their bytes are discarded).
func (q *fileQueue) abort() {
	if q.cancel != nil {
		q.cancel()
		q.ctx, q.cancel = nil, nil
	}
	for _, op := range q.pending {
		os.Remove(op.staged)
		respond(op.reply, errorReply(session.Errorf(session.CodeUnavailable,
			"the session stopped before the write to %s was applied: nothing was written; try again", displayPath(op.path))))
	}
	q.pending = nil
}

// idle reports whether no write waits or is being received and no read is
// being sent: the session does not hibernate in the middle of a download.
func (q *fileQueue) idle() bool { return len(q.pending) == 0 && q.staging == 0 && q.reading == 0 }

// fileReadDone: a read was answered (and its stream sent).
type fileReadDone struct{}

func (*fileReadDone) handle(s *sessionActor) { s.files.reading-- }

// fileOp is one write: its request, the received bytes and the request to
// answer once it is applied.
type fileOp struct {
	by     string
	req    session.FilesRequest
	path   string
	staged string // the received bytes ("" for a delete)
	size   int64
	reply  *nats.Msg
}

// fileMsg is a message from a file goroutine to its actor.
type fileMsg interface{ handle(s *sessionActor) }

// fileStaged: an upload was received (err nil) or abandoned.
type fileStaged struct {
	op  *fileOp
	err error
}

func (m *fileStaged) handle(s *sessionActor) {
	s.files.staging--
	if m.err == nil && s.act.phase != phaseActive && s.act.phase != phaseDraining && s.act.phase != phaseWaking {
		m.err = session.Errorf(session.CodeUnavailable, "the session stopped before the write was applied: nothing was written; try again")
		respond(m.op.reply, errorReply(m.err))
	}
	if m.err != nil {
		os.Remove(m.op.staged)
		return
	}
	s.files.pending = append(s.files.pending, m.op)
	s.startFileOps()
	s.maybeStartTurn()
}

// fileOpDone: a write was applied (err nil) or failed.
type fileOpDone struct {
	op            *fileOp
	bo            *boxOp
	paths         []string
	before, after *mount.Manifest
	err           error
}

func (m *fileOpDone) handle(s *sessionActor) {
	if m.bo == s.sandbox.op {
		s.sandbox.op = nil
	}
	os.Remove(m.op.staged)
	if m.err != nil {
		respond(m.op.reply, errorReply(fileError(m.err)))
	} else {
		paths := m.paths
		if len(paths) > maxChangedPaths {
			paths = paths[:maxChangedPaths]
		}
		data := mustMarshal(session.FilesChangedData{By: m.op.by, Paths: paths})
		var seq session.Seq
		seq = s.events.emit(session.KindFilesChanged, m.op.by, data, func(err error) {
			if err != nil {
				respond(m.op.reply, errorReply(err))
				return
			}
			respond(m.op.reply, session.Reply{Seq: seq})
			h, id, before, after := s.h, s.id, m.before, m.after
			s.spawn(func() {
				ctx, cancel := context.WithTimeout(h.ctx, time.Minute)
				defer cancel()
				h.writeMark(ctx, id, mount.SeqMark(seq), 0, seq, before, after)
			})
		})
	}
	s.maybeStartTurn()
}

// fileCommand handles OpFiles and OpFork; it reports whether c was one.
func (s *sessionActor) fileCommand(msg *nats.Msg, who session.Principal, c *session.Command) bool {
	if c.Op != session.OpFiles && c.Op != session.OpFork {
		return false
	}
	need := session.ActRead
	if c.Op == session.OpFiles && c.Files != nil && c.Files.Op.IsWrite() {
		need = session.ActDrive
	}
	if err := session.Authorize(s.roleOf(who), need); err != nil {
		respond(msg, errorReply(err))
		return true
	}
	if s.h.cfg.Store == nil {
		respond(msg, errorReply(session.Errorf(session.CodeUnavailable,
			"this server keeps no saved workspaces (no object store is configured), so files cannot be read or written")))
		return true
	}
	if c.Op == session.OpFork {
		if c.Fork == nil {
			respond(msg, errorReply(session.Errorf(session.CodeBadRequest, "fork command without fork")))
			return true
		}
		s.opFork(msg, who, c.Fork)
		return true
	}
	if c.Files == nil {
		respond(msg, errorReply(session.Errorf(session.CodeBadRequest, "files command without files")))
		return true
	}
	req := *c.Files
	p, err := mount.CleanPath(req.Path)
	if err != nil {
		respond(msg, errorReply(fileError(err)))
		return true
	}
	switch req.Op {
	case session.FileList, session.FileRead, session.FileArchiveOut, session.FileChanges:
		s.fileRead(msg, req, p)
	case session.FileWrite, session.FileArchiveIn, session.FileDelete:
		// A delete has an empty stream: its last chunk's answer says
		// when it is applied, like a write's.
		s.fileUpload(msg, who.User, req, p)
	default:
		respond(msg, errorReply(session.Errorf(session.CodeBadRequest, "unknown file op %q", req.Op)))
	}
	return true
}

// fileError turns an error of a file operation into a wire error.
func fileError(err error) error {
	var e *session.Error
	switch {
	case errors.As(err, &e):
		return e
	case errors.Is(err, mount.ErrOutside):
		return session.Errorf(session.CodeBadRequest, "%s", strings.TrimPrefix(err.Error(), "mount: "))
	case errors.Is(err, mount.ErrInvalid):
		return session.Errorf(session.CodeBadRequest, "%s", strings.TrimPrefix(err.Error(), "mount: "))
	case errors.Is(err, mount.ErrNoEntry), errors.Is(err, blob.ErrNotFound):
		return session.Errorf(session.CodeNotFound, "%s", strings.TrimPrefix(err.Error(), "mount: "))
	case errors.Is(err, mount.ErrIsDir), errors.Is(err, mount.ErrNotDir):
		return session.Errorf(session.CodeConflict, "%s", strings.TrimPrefix(err.Error(), "mount: "))
	case errors.Is(err, mount.ErrConflict), errors.Is(err, mount.ErrFenced):
		return session.Errorf(session.CodeConflict, "the workspace changed meanwhile: try again")
	case errors.Is(err, blob.ErrUnavailable):
		return session.Errorf(session.CodeUnavailable, "the object store is unavailable: try again shortly")
	}
	return err
}

// --- reads ----------------------------------------------------------------

// fileRead serves a read from the saved workspace on a goroutine.
func (s *sessionActor) fileRead(msg *nats.Msg, req session.FilesRequest, p string) {
	h, id, fctx := s.h, s.id, s.files.context(s.h.ctx)
	s.files.reading++
	s.spawn(func() {
		defer s.send(&fileReadDone{})
		ctx, cancel := context.WithCancel(fctx)
		defer cancel()
		if err := h.serveFileRead(ctx, id, msg, req, p); err != nil {
			respond(msg, errorReply(fileError(err)))
		}
	})
}

// serveFileRead answers msg; an error it returns is answered by its caller.
// Once it has answered, it streams the bytes of a read to req.Stream and
// returns nil.
func (h *Host) serveFileRead(ctx context.Context, id session.ID, msg *nats.Msg, req session.FilesRequest, p string) error {
	store, prefix := h.cfg.Store, mount.Prefix(id)
	if req.Op == session.FileChanges {
		changes, err := h.turnChanges(ctx, id, req.Turn)
		if err != nil {
			return err
		}
		respond(msg, session.Reply{Files: &session.FilesReply{Changes: changes}})
		return nil
	}
	m, err := h.manifests.get(ctx, store, id)
	if err != nil {
		return err
	}
	switch req.Op {
	case session.FileList:
		entries, err := m.List(p, req.Recursive)
		if err != nil {
			return err
		}
		if req.Stream == "" {
			out := make([]session.FileEntry, 0, len(entries))
			for _, e := range entries {
				out = append(out, wireEntry(e))
			}
			respond(msg, session.Reply{Files: &session.FilesReply{Entries: out}})
			return nil
		}
		// A listing may be larger than a NATS message: it streams, as
		// the JSON body the gateway serves.
		respond(msg, session.Reply{Files: &session.FilesReply{File: &session.FileEntry{Path: p, Type: string(mount.TypeDir)}}})
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(writeListing(pw, entries)) }()
		h.sendStream(ctx, req.Stream, pr)
		pr.Close()
		return nil
	case session.FileRead:
		if req.Stream == "" {
			return session.Errorf(session.CodeBadRequest, "read without a stream")
		}
		e, err := m.Resolve(p)
		if err != nil {
			return err
		}
		if e.Type == mount.TypeDir {
			return session.Errorf(session.CodeBadRequest, "%s is a folder: list it, or download it as an archive", displayPath(p))
		}
		rc, err := mount.Open(ctx, store, prefix, e)
		if err != nil {
			return err
		}
		defer rc.Close()
		we := wireEntry(e)
		we.Path = p
		respond(msg, session.Reply{Files: &session.FilesReply{File: &we}})
		h.sendStream(ctx, req.Stream, rc)
		return nil
	case session.FileArchiveOut:
		if req.Stream == "" {
			return session.Errorf(session.CodeBadRequest, "archive without a stream")
		}
		entries, err := m.List(p, true)
		if err != nil {
			return err
		}
		respond(msg, session.Reply{Files: &session.FilesReply{File: &session.FileEntry{Path: p, Type: string(mount.TypeDir)}}})
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(writeArchive(ctx, store, prefix, p, entries, pw)) }()
		h.sendStream(ctx, req.Stream, pr)
		pr.Close()
		return nil
	}
	return session.Errorf(session.CodeBadRequest, "unknown file op %q", req.Op)
}

func displayPath(p string) string {
	if p == "" {
		return "the workspace"
	}
	return p
}

// writeListing writes entries as a session.FileListing in JSON, encoded by
// hand: a listing of 10,000 files takes a few milliseconds.
func writeListing(w io.Writer, entries []mount.Entry) error {
	bw := bufio.NewWriterSize(w, 64<<10)
	bw.WriteString(`{"entries":[`)
	b := make([]byte, 0, 256)
	for i, e := range entries {
		b = b[:0]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"path":`...)
		b = appendString(b, e.Path)
		b = append(b, `,"type":"`...)
		b = append(b, e.Type...)
		b = append(b, `","size":`...)
		b = strconv.AppendInt(b, e.Size, 10)
		b = append(b, `,"mode":"`...)
		b = append(b, fmt.Sprintf("%04o", uint32(e.Mode))...)
		b = append(b, `","mtime":"`...)
		b = time.Unix(0, e.MTime).UTC().AppendFormat(b, session.TimeLayout)
		b = append(b, '"')
		if e.Target != "" {
			b = append(b, `,"target":`...)
			b = appendString(b, e.Target)
		}
		b = append(b, '}')
		if _, err := bw.Write(b); err != nil {
			return err
		}
	}
	bw.WriteString("]}\n")
	return bw.Flush()
}

// manifestCache keeps the last manifest read of recent sessions, by ETag,
// so reads of a large workspace do not decode its manifest each time.
type manifestCache struct {
	mu sync.Mutex
	m  map[session.ID]cachedManifest // guarded by mu
}

type cachedManifest struct {
	etag string
	m    *mount.Manifest
}

// maxCachedManifests bounds manifestCache.
const maxCachedManifests = 64

// get returns id's saved manifest: the cached one if its ETag is current.
// Manifests are never changed in place, so sharing one is safe.
func (c *manifestCache) get(ctx context.Context, store blob.Store, id session.ID) (*mount.Manifest, error) {
	prefix := mount.Prefix(id)
	info, err := store.Stat(ctx, prefix+mount.ManifestKey)
	if errors.Is(err, blob.ErrNotFound) {
		return &mount.Manifest{Version: mount.Version, Entries: []mount.Entry{}}, nil
	}
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	cm, ok := c.m[id]
	c.mu.Unlock()
	if ok && cm.etag == info.ETag {
		return cm.m, nil
	}
	m, etag, err := mount.ReadManifest(ctx, store, prefix)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = make(map[session.ID]cachedManifest)
	}
	if len(c.m) >= maxCachedManifests {
		for k := range c.m { // Evict one at random.
			delete(c.m, k)
			break
		}
	}
	c.m[id] = cachedManifest{etag: etag, m: m}
	return m, nil
}

// wireEntry is the wire form of a workspace entry.
func wireEntry(e mount.Entry) session.FileEntry {
	return session.FileEntry{
		Path: e.Path, Type: string(e.Type), Size: e.Size, Mode: fmt.Sprintf("%04o", uint32(e.Mode)),
		MTime: session.Time{Time: time.Unix(0, e.MTime).UTC()}, Target: e.Target,
	}
}

// writeArchive writes the entries under dir as a tar.gz to w, with names
// relative to dir.
func writeArchive(ctx context.Context, store blob.Store, prefix, dir string, entries []mount.Entry, w io.Writer) error {
	gz := gzip.NewWriter(w)
	tw := tar.NewWriter(gz)
	for _, e := range entries {
		name := e.Path
		if dir != "" {
			name = strings.TrimPrefix(e.Path, dir+"/")
		}
		hdr := &tar.Header{Name: name, Mode: int64(e.Mode), ModTime: time.Unix(0, e.MTime), Format: tar.FormatPAX}
		switch e.Type {
		case mount.TypeDir:
			hdr.Typeflag, hdr.Name = tar.TypeDir, name+"/"
		case mount.TypeSymlink:
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, e.Target
		default:
			hdr.Typeflag, hdr.Size = tar.TypeReg, e.Size
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if e.Type == mount.TypeFile && e.Size > 0 {
			rc, err := mount.Open(ctx, store, prefix, e)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, rc)
			rc.Close()
			if err != nil {
				return err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return gz.Close()
}

// --- byte streams -----------------------------------------------------------

// chunkSize is the payload of one stream message.
func (h *Host) chunkSize() int {
	return min(session.MaxChunkBytes, int(h.cfg.NATS.MaxPayload())-4096)
}

// sendStream sends r to subject as a FileChunk stream; a failure to read r
// is sent as an error chunk. It stops when the receiver answers with an
// error or does not answer within the stream timeout.
func (h *Host) sendStream(ctx context.Context, subject string, r io.Reader) {
	buf := make([]byte, h.chunkSize())
	for {
		n, err := io.ReadFull(r, buf)
		msg := nats.NewMsg(subject)
		switch {
		case err == io.EOF || err == io.ErrUnexpectedEOF:
			msg.Data = buf[:n]
			msg.Header.Set(session.HeaderChunkEnd, "1")
		case err != nil:
			msg.Header.Set(session.HeaderChunkError, string(mustMarshal(session.AsError(fileError(err)))))
			h.log.Warn("read a workspace file for a client", "err", err)
		default:
			msg.Data = buf[:n]
		}
		rctx, cancel := context.WithTimeout(ctx, h.cfg.Files.streamTimeout())
		resp, rerr := h.cfg.NATS.RequestMsgWithContext(rctx, msg)
		cancel()
		if rerr != nil || err != nil || msg.Header.Get(session.HeaderChunkEnd) != "" {
			return
		}
		if len(resp.Data) > 0 {
			var rep session.Reply
			if json.Unmarshal(resp.Data, &rep) != nil || rep.Error != nil {
				return
			}
		}
	}
}

// fileUpload opens an inbox for the bytes of a write and receives them
// into a temporary file on a goroutine.
func (s *sessionActor) fileUpload(msg *nats.Msg, user string, req session.FilesRequest, p string) {
	maxBytes := s.h.cfg.Files.maxFile()
	if req.Op != session.FileArchiveIn && p == "" {
		respond(msg, errorReply(session.Errorf(session.CodeBadRequest, "give the path of a file, not the workspace itself")))
		return
	}
	if req.Size > maxBytes {
		respond(msg, errorReply(tooLarge(req.Size, maxBytes)))
		return
	}
	if req.Mode&^0o777 != 0 {
		respond(msg, errorReply(session.Errorf(session.CodeBadRequest, "mode %o has more than permission bits", req.Mode)))
		return
	}
	f, err := os.CreateTemp(s.h.cfg.Files.TempDir, "atrium-upload-*")
	if err != nil {
		respond(msg, errorReply(session.Errorf(session.CodeUnavailable, "no room to receive the upload on this node: %v", err)))
		return
	}
	sub, err := s.h.cfg.NATS.SubscribeSync(nats.NewInbox())
	if err == nil {
		err = s.h.cfg.NATS.Flush()
	}
	if err != nil {
		f.Close()
		os.Remove(f.Name())
		respond(msg, errorReply(session.Errorf(session.CodeUnavailable, "open a stream for the upload: %v", err)))
		return
	}
	op := &fileOp{by: user, req: req, path: p, staged: f.Name()}
	s.files.staging++
	respond(msg, session.Reply{Files: &session.FilesReply{Stream: sub.Subject}})
	h, ctx := s.h, s.files.context(s.h.ctx)
	s.spawn(func() {
		defer sub.Unsubscribe()
		err := h.receiveStream(ctx, sub, f, maxBytes, op)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		s.send(&fileStaged{op: op, err: err})
	})
}

func tooLarge(size, limit int64) error {
	return session.Errorf(session.CodePayloadTooLarge, "the upload has %d bytes, more than this server's limit of %d bytes per file", size, limit)
}

// receiveStream writes the chunks of sub to w until the last one, whose
// message becomes op.reply (answered once the write is applied). A stream
// longer than limit is refused with payload_too_large.
func (h *Host) receiveStream(ctx context.Context, sub *nats.Subscription, w io.Writer, limit int64, op *fileOp) error {
	for {
		ctx, cancel := context.WithTimeout(ctx, h.cfg.Files.streamTimeout())
		msg, err := sub.NextMsgWithContext(ctx)
		cancel()
		if err != nil {
			return fmt.Errorf("receive upload: %w", err)
		}
		if e := msg.Header.Get(session.HeaderChunkError); e != "" {
			return fmt.Errorf("the sender aborted the upload: %s", e)
		}
		op.size += int64(len(msg.Data))
		if op.size > limit {
			err := tooLarge(op.size, limit)
			respond(msg, errorReply(err))
			return err
		}
		if _, err := w.Write(msg.Data); err != nil {
			err = session.Errorf(session.CodeUnavailable, "no room to receive the upload on this node: %v", err)
			respond(msg, errorReply(err))
			return err
		}
		if msg.Header.Get(session.HeaderChunkEnd) != "" {
			if op.req.Size >= 0 && op.req.Op == session.FileWrite && op.req.Size != op.size && op.req.Size != 0 {
				err := session.Errorf(session.CodeBadRequest, "the upload ended after %d of its %d bytes", op.size, op.req.Size)
				respond(msg, errorReply(err))
				return err
			}
			op.reply = msg
			return nil
		}
		if err := msg.Respond(nil); err != nil {
			return fmt.Errorf("receive upload: %w", err)
		}
	}
}

// --- writes ---------------------------------------------------------------

// startFileOps runs the next queued write if neither a turn nor a sandbox
// operation runs. maybeStartTurn calls it first, so a write received while
// a turn ran goes before the next queued turn.
func (s *sessionActor) startFileOps() {
	if len(s.files.pending) == 0 || s.queue.runner != nil || s.sandbox.op != nil || s.act.shutting ||
		(s.act.phase != phaseActive && s.act.phase != phaseDraining && s.act.phase != phaseWaking) {
		return
	}
	op := s.files.pending[0]
	s.files.pending = s.files.pending[1:]
	if s.sandbox.box == nil {
		s.sandbox.box = s.h.boxes.lookup(s.id)
	}
	b, h, id, fence := s.sandbox.box, s.h, s.id, s.fence
	ctx, cancel := context.WithCancel(h.ctx)
	bo := &boxOp{cancel: cancel}
	s.sandbox.op = bo
	s.spawn(func() {
		defer cancel()
		done := &fileOpDone{op: op, bo: bo}
		note := func(state session.SandboxState, detail string, err *session.ErrorData) {
			s.send(&sandboxNote{state: state, detail: detail, err: err})
		}
		done.paths, done.before, done.after, done.err = h.applyFileOp(ctx, id, b, fence, op, note)
		s.send(done)
	})
}

// change is one entry a write sets, with the file holding its content.
type change struct {
	e    mount.Entry
	open func() (io.ReadCloser, error) // nil for directories and links
}

// applyFileOp applies a write: to the live workspace of an awake local
// sandbox (then saved), or to the saved workspace. It runs on the box op's
// goroutine, holding b.
func (h *Host) applyFileOp(ctx context.Context, id session.ID, b *box, fence int64, op *fileOp, note noteFunc) (paths []string, before, after *mount.Manifest, err error) {
	changes, err := h.planWrite(op)
	if err != nil {
		return nil, nil, nil, err
	}
	if fence == 0 {
		if fence, err = h.leaseFence(id); err != nil {
			return nil, nil, nil, err
		}
	}
	if b != nil && b.vol != nil && b.ws != nil && h.boxes.isAwake(b) {
		if dir, ok := b.ws.(*mount.Dir); ok {
			return h.applyLive(ctx, b, dir, op, changes)
		}
		// A remote sandbox: save and put it to sleep, then change the
		// saved copy, which it restores when it wakes.
		h.sleepBox(ctx, b, "files are being written to its saved workspace", note)
	}
	return h.applySaved(ctx, id, fence, op, changes)
}

// planWrite lists what op sets, checking every path and size before
// anything is changed, so an archive is applied whole or not at all.
func (h *Host) planWrite(op *fileOp) ([]change, error) {
	now := time.Now().UnixNano()
	switch op.req.Op {
	case session.FileDelete:
		return nil, nil
	case session.FileWrite:
		mode := fs.FileMode(op.req.Mode)
		if mode == 0 {
			mode = 0o644
		}
		staged := op.staged
		return []change{{
			e:    mount.Entry{Path: op.path, Type: mount.TypeFile, Mode: mode, Size: op.size, MTime: now},
			open: func() (io.ReadCloser, error) { return os.Open(staged) },
		}}, nil
	}
	// An archive: read it once to check it and list its entries, with
	// each file's offset in the decompressed stream.
	f, err := os.Open(op.staged)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		return nil, session.Errorf(session.CodeBadRequest, "the upload is not a tar.gz archive: %v", err)
	}
	tr := tar.NewReader(gz)
	var out []change
	seen := map[string]bool{}
	var total int64
	for i := 0; ; i++ {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, session.Errorf(session.CodeBadRequest, "the archive is damaged: %v", err)
		}
		name := strings.TrimPrefix(hdr.Name, "./")
		if strings.TrimSuffix(name, "/") == "" || name == "." {
			continue
		}
		if strings.HasPrefix(name, "/") {
			return nil, session.Errorf(session.CodeBadRequest, "the archive's entry %q is absolute: it would leave the workspace", hdr.Name)
		}
		p, err := mount.CleanPath(path.Join(op.path, strings.TrimSuffix(name, "/")))
		if err != nil || p == "" || (op.path != "" && !strings.HasPrefix(p, op.path+"/")) {
			return nil, session.Errorf(session.CodeBadRequest, "the archive's entry %q leaves the folder it is unpacked into", hdr.Name)
		}
		if seen[p] {
			continue
		}
		seen[p] = true
		mode := fs.FileMode(hdr.Mode) & fs.ModePerm
		mt := hdr.ModTime.UnixNano()
		switch hdr.Typeflag {
		case tar.TypeDir:
			out = append(out, change{e: mount.Entry{Path: p, Type: mount.TypeDir, Mode: mode, MTime: mt}})
		case tar.TypeSymlink:
			if hdr.Linkname == "" {
				return nil, session.Errorf(session.CodeBadRequest, "the archive's link %q has no target", hdr.Name)
			}
			out = append(out, change{e: mount.Entry{Path: p, Type: mount.TypeSymlink, Mode: 0o777, MTime: mt, Target: hdr.Linkname}})
		case tar.TypeReg:
			if hdr.Size > h.cfg.Files.maxFile() {
				return nil, tooLarge(hdr.Size, h.cfg.Files.maxFile())
			}
			total += hdr.Size
			staged, index := op.staged, i
			out = append(out, change{
				e:    mount.Entry{Path: p, Type: mount.TypeFile, Mode: mode, Size: hdr.Size, MTime: mt},
				open: func() (io.ReadCloser, error) { return openArchived(staged, index) },
			})
		default:
			return nil, session.Errorf(session.CodeBadRequest, "the archive's entry %q is neither a file, a folder nor a symbolic link", hdr.Name)
		}
	}
	if q := h.cfg.Files.Quota; q > 0 && total > q {
		return nil, quotaError(q, total)
	}
	return out, nil
}

// openArchived opens the content of the index-th entry of a staged tar.gz.
func openArchived(staged string, index int) (io.ReadCloser, error) {
	f, err := os.Open(staged)
	if err != nil {
		return nil, err
	}
	gz, err := gzip.NewReader(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	tr := tar.NewReader(gz)
	for i := 0; ; i++ {
		if _, err := tr.Next(); err != nil {
			f.Close()
			return nil, err
		}
		if i == index {
			return struct {
				io.Reader
				io.Closer
			}{tr, f}, nil
		}
	}
}

func quotaError(quota, size int64) error {
	return session.Errorf(session.CodeInsufficientStorage,
		"the workspace quota of %d bytes is full: the workspace would hold %d bytes; delete files or ask the operator for a larger quota", quota, size)
}

// checkQuota fails when entries, with changes applied, exceed the quota.
func (h *Host) checkQuota(entries []mount.Entry, changes []change) error {
	q := h.cfg.Files.Quota
	if q <= 0 {
		return nil
	}
	sizes := make(map[string]int64, len(entries))
	var total int64
	for _, e := range entries {
		sizes[e.Path] = e.Size
		total += e.Size
	}
	for _, c := range changes {
		total += c.e.Size - sizes[c.e.Path]
		sizes[c.e.Path] = c.e.Size
	}
	if total > q {
		return quotaError(q, total)
	}
	return nil
}

// applySaved applies a write to the saved workspace.
func (h *Host) applySaved(ctx context.Context, id session.ID, fence int64, op *fileOp, changes []change) ([]string, *mount.Manifest, *mount.Manifest, error) {
	store, prefix := h.cfg.Store, mount.Prefix(id)
	// Upload the content first: objects nothing references yet.
	for i := range changes {
		c := &changes[i]
		if c.open == nil {
			continue
		}
		rc, err := c.open()
		if err != nil {
			return nil, nil, nil, err
		}
		e, err := mount.PutContent(ctx, store, prefix, rc, c.e.Size)
		rc.Close()
		if err != nil {
			return nil, nil, nil, err
		}
		c.e.Blob, c.e.Hash = e.Blob, e.Hash
	}
	var old []mount.Entry
	now := time.Now().UnixNano()
	after, err := mount.Update(ctx, store, prefix, fence, func(entries []mount.Entry) ([]mount.Entry, error) {
		old = entries
		if op.req.Op == session.FileDelete {
			if _, err := (&mount.Manifest{Entries: entries}).Resolve(path.Dir(op.path)); err != nil && path.Dir(op.path) != "." {
				return nil, err
			}
			out, found := mount.RemoveEntry(entries, op.path)
			if !found {
				return nil, fmt.Errorf("%w: %s", mount.ErrNoEntry, op.path)
			}
			return out, nil
		}
		if err := h.checkQuota(entries, changes); err != nil {
			return nil, err
		}
		var err error
		for _, c := range changes {
			if entries, err = mount.SetEntry(entries, c.e, now); err != nil {
				return nil, err
			}
		}
		return entries, nil
	})
	if err != nil {
		return nil, nil, nil, err
	}
	before := &mount.Manifest{Entries: old}
	return changedPaths(op, before, after), before, after, nil
}

// applyLive applies a write to an awake local sandbox's workspace and saves
// it. The save records the result; the Volume's mark moves past it, so the
// next turn's changes do not include it.
func (h *Host) applyLive(ctx context.Context, b *box, dir *mount.Dir, op *fileOp, changes []change) ([]string, *mount.Manifest, *mount.Manifest, error) {
	_, base := b.vol.Mark()
	var cur []mount.Entry
	if base != nil {
		cur = base.Entries
	}
	if err := h.checkQuota(cur, changes); err != nil {
		return nil, nil, nil, err
	}
	if op.req.Op == session.FileDelete {
		if err := dir.Remove(ctx, op.path); err != nil {
			return nil, nil, nil, err
		}
	}
	for _, c := range changes {
		var err error
		switch c.e.Type {
		case mount.TypeDir:
			err = dir.Mkdir(ctx, c.e.Path, c.e.Mode)
		case mount.TypeSymlink:
			err = dir.Symlink(ctx, c.e.Path, c.e.Target)
		default:
			var rc io.ReadCloser
			if rc, err = c.open(); err == nil {
				err = dir.WriteFile(ctx, c.e.Path, rc, c.e.Mode)
				rc.Close()
			}
		}
		if err != nil {
			return nil, nil, nil, err
		}
	}
	if err := h.saveBox(ctx, b); err != nil {
		code := session.CodeUnavailable
		if errors.Is(err, session.ErrInsufficientStorage) { // the tenant's object-store quota
			code = session.CodeInsufficientStorage
		}
		return nil, nil, nil, session.Errorf(code, "the file was written to the sandbox but not saved: %v", err)
	}
	before, after := b.vol.Mark()
	return changedPaths(op, before, after), before, after, nil
}

// changedPaths lists the paths a write changed.
func changedPaths(op *fileOp, before, after *mount.Manifest) []string {
	var paths []string
	for _, c := range mount.Diff(entriesOf(before), entriesOf(after)) {
		paths = append(paths, c.Path)
	}
	if len(paths) == 0 && op.path != "" {
		paths = []string{op.path}
	}
	return paths
}

func entriesOf(m *mount.Manifest) []mount.Entry {
	if m == nil {
		return nil
	}
	return m.Entries
}

// --- marks and changes ----------------------------------------------------

// saveTurn saves the workspace at the end of turn and records the turn's
// changes: the difference between the manifest the workspace held when the
// turn began (the Volume's mark) and the one just saved. When nothing
// changed, the save writes nothing and the mark lists no changes.
func (h *Host) saveTurn(ctx context.Context, b *box, turn int64) error {
	if err := h.saveBox(ctx, b); err != nil {
		return err
	}
	if b.vol == nil || h.cfg.Store == nil {
		return nil
	}
	before, after := b.vol.Mark()
	h.writeMark(ctx, b.id, mount.TurnMark(turn), turn, 0, before, after)
	return nil
}

// writeMark keeps the after manifest and records a mark; a failure is
// logged (the work itself is saved; only its record of changes is lost).
func (h *Host) writeMark(ctx context.Context, id session.ID, name string, turn int64, seq session.Seq, before, after *mount.Manifest) {
	store, prefix := h.cfg.Store, mount.Prefix(id)
	mk := &mount.Mark{Turn: turn, Seq: seq, Saved: time.Now().UTC()}
	if before != nil {
		mk.Before = before.ID
	}
	if after != nil {
		mk.After = after.ID
	}
	if mk.Before != mk.After || mk.Before == "" {
		mk.Changes = mount.Diff(entriesOf(before), entriesOf(after))
	}
	if after != nil && after.ID != "" {
		if err := mount.KeepManifest(ctx, store, prefix, after); err != nil {
			h.log.Warn("keep the workspace manifest", "session", id, "err", err)
			return
		}
	}
	if err := mount.WriteMark(ctx, store, prefix, name, mk); err != nil {
		h.log.Warn("record the workspace's changes", "session", id, "mark", name, "err", err)
	}
}

// turnChanges reads the changes of turn n with diffs of text files.
func (h *Host) turnChanges(ctx context.Context, id session.ID, n int64) ([]session.FileChange, error) {
	if n < 1 {
		return nil, session.Errorf(session.CodeBadRequest, "turn must be 1 or more, not %d", n)
	}
	store, prefix := h.cfg.Store, mount.Prefix(id)
	mk, err := mount.ReadMark(ctx, store, prefix, mount.TurnMark(n))
	if errors.Is(err, blob.ErrNotFound) {
		return nil, session.Errorf(session.CodeNotFound,
			"turn %d has no recorded workspace changes: it has not finished, did not run in a sandbox, or its workspace could not be saved", n)
	}
	if err != nil {
		return nil, err
	}
	out := make([]session.FileChange, 0, len(mk.Changes))
	budget := session.MaxDiffBytes
	for _, c := range mk.Changes {
		fc := session.FileChange{Path: c.Path, Status: c.Status}
		if budget > 0 {
			if d, ok := h.diffOf(ctx, prefix, c); ok && len(d) <= budget {
				fc.Diff = d
				budget -= len(d)
			}
		}
		out = append(out, fc)
	}
	return out, nil
}

// diffOf returns the unified diff of a changed text file, if both sides are
// small text files.
func (h *Host) diffOf(ctx context.Context, prefix string, c mount.Change) (string, bool) {
	read := func(e *mount.Entry) ([]byte, bool) {
		if e == nil {
			return nil, true
		}
		if e.Type != mount.TypeFile || e.Size > session.MaxDiffFileBytes {
			return nil, false
		}
		rc, err := mount.Open(ctx, h.cfg.Store, prefix, *e)
		if err != nil {
			return nil, false
		}
		defer rc.Close()
		b, err := io.ReadAll(rc)
		return b, err == nil
	}
	a, ok := read(c.Old)
	if !ok {
		return "", false
	}
	b, ok := read(c.New)
	if !ok {
		return "", false
	}
	return mount.UnifiedDiff(c.Path, a, b)
}

// --- forks ----------------------------------------------------------------

// opFork forks this session: it checks the seq, reads the history up to it
// and the workspace as of then, gives the new session that workspace
// (sharing content), and has the manager create the new session with the
// history, answering msg with the new Session.
func (s *sessionActor) opFork(msg *nats.Msg, who session.Principal, req *session.ForkRequest) {
	last := s.events.durable
	at := req.AtSeq
	if at == 0 {
		at = last
	}
	if at < 1 || at > last {
		respond(msg, errorReply(session.Errorf(session.CodeBadRequest,
			"seq %d does not exist: this session's events are 1 to %d", req.AtSeq, last)))
		return
	}
	if err := req.Child.Validate(); err != nil {
		respond(msg, errorReply(session.Errorf(session.CodeBadRequest, "fork needs a valid child id")))
		return
	}
	title := req.Title
	if title == "" {
		title = s.events.meta.Title
	}
	if len(title) > session.MaxTitleBytes {
		respond(msg, errorReply(session.Errorf(session.CodeBadRequest, "title is longer than %d bytes", session.MaxTitleBytes)))
		return
	}
	h, id, hist, child := s.h, s.id, s.hist, req.Child
	place := session.PlaceRequest{
		Op: session.PlaceCreate, Session: child, Title: title, Harness: s.events.meta.Harness,
		Egress: slices.Clone(s.events.meta.Egress), Fork: &session.ForkedFrom{Session: id, Seq: at},
	}
	s.readsWG.Add(1)
	s.spawn(func() {
		ctx, cancel := context.WithTimeout(h.ctx, 5*time.Minute)
		defer cancel()
		evs, err := h.forkHistory(ctx, hist, at)
		s.readsWG.Done()
		if err == nil {
			err = h.forkWorkspace(ctx, id, child, at, at == last, evs)
		}
		if err != nil {
			respond(msg, errorReply(fileError(err)))
			return
		}
		h.system.Root.Send(h.manager, &placeMsg{msg: msg, req: place, user: who, seed: evs})
	})
}

// forkHistory reads the events 1 to at.
func (h *Host) forkHistory(ctx context.Context, hist History, at session.Seq) ([]json.RawMessage, error) {
	var out []json.RawMessage
	for after := session.Seq(0); after < at; {
		evs, _, err := hist.Range(ctx, after, int(min(at-after, maxHistoryLimit)), 4<<20)
		if err != nil {
			return nil, fmt.Errorf("read history to fork: %w", err)
		}
		if len(evs) == 0 {
			break
		}
		out = append(out, evs...)
		after += session.Seq(len(evs))
	}
	return out, nil
}

// forkWorkspace gives child the workspace of id as of seq at: the current
// saved copy when at is the last seq, else the one recorded by the newest
// turn or file write at or before at.
func (h *Host) forkWorkspace(ctx context.Context, id, child session.ID, at session.Seq, latest bool, evs []json.RawMessage) error {
	store, prefix := h.cfg.Store, mount.Prefix(id)
	var m *mount.Manifest
	if latest {
		var err error
		if m, _, err = mount.ReadManifest(ctx, store, prefix); err != nil {
			return err
		}
	} else {
		// The marks that may hold the workspace as of at, newest first.
		var names []string
		for _, raw := range evs {
			var ev struct {
				Seq  session.Seq     `json:"seq"`
				Kind session.Kind    `json:"kind"`
				Data json.RawMessage `json:"data"`
			}
			if json.Unmarshal(raw, &ev) != nil {
				continue
			}
			switch ev.Kind {
			case session.KindTurnFinished:
				var d session.TurnFinishedData
				if json.Unmarshal(ev.Data, &d) == nil {
					names = append(names, mount.TurnMark(d.Turn))
				}
			case session.KindFilesChanged:
				names = append(names, mount.SeqMark(ev.Seq))
			}
		}
		for i := len(names) - 1; i >= 0 && m == nil; i-- {
			mk, err := mount.ReadMark(ctx, store, prefix, names[i])
			if errors.Is(err, blob.ErrNotFound) {
				continue
			}
			if err != nil {
				return err
			}
			if m, err = mount.ReadAt(ctx, store, prefix, mk.After); err != nil {
				return err
			}
		}
	}
	if m == nil {
		return nil // An empty workspace.
	}
	return mount.ForkTo(ctx, store, prefix, m, mount.Prefix(child), string(child))
}

// forkEvents returns the first events of a fork created by p: its own
// session_created (saying where it came from) and the parent's events 2 to
// the fork's seq, in the fork's epoch. A turn still running at that seq is
// finished as cancelled.
func forkEvents(p *placeMsg, m session.Meta, now time.Time) ([]session.Stored, error) {
	from := p.req.Fork
	evs := []session.Stored{encodeEvent(1, m.Epoch, now, session.KindSessionCreated, p.user.User,
		mustMarshal(session.SessionCreatedData{Title: m.Title, ForkedFrom: from}))}
	var open int64 // a turn started and not finished
	var openStart time.Time
	for _, raw := range p.seed {
		var ev session.Event
		if err := json.Unmarshal(raw, &ev); err != nil {
			return nil, fmt.Errorf("decode event to fork: %w", err)
		}
		if ev.Seq <= 1 || ev.Seq > from.Seq {
			continue
		}
		if ev.Seq != evs[len(evs)-1].Seq+1 {
			return nil, fmt.Errorf("the history to fork has a gap before seq %d", ev.Seq)
		}
		switch ev.Kind {
		case session.KindTurnStarted:
			var d session.TurnStartedData
			_ = json.Unmarshal(ev.Data, &d)
			open, openStart = d.Turn, ev.Time.Time
		case session.KindTurnFinished:
			open = 0
		}
		evs = append(evs, encodeEvent(ev.Seq, m.Epoch, ev.Time.Time, ev.Kind, ev.By, ev.Data))
	}
	if open > 0 {
		n := evs[len(evs)-1].Seq
		evs = append(evs,
			encodeEvent(n+1, m.Epoch, now, session.KindError, session.BySystem, mustMarshal(session.ErrorData{
				Code: session.CodeConflict, Message: fmt.Sprintf("turn %d was still running at seq %d, where this session was forked from %s", open, from.Seq, from.Session),
			})),
			encodeEvent(n+2, m.Epoch, now, session.KindTurnFinished, session.BySystem, mustMarshal(session.TurnFinishedData{
				Turn: open, Status: session.TurnCancelled, ExitCode: -1, DurationMS: max(now.Sub(openStart).Milliseconds(), 0),
			})))
	}
	return evs, nil
}
