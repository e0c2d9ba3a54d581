package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"math/bits"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/atriumhq/atrium/session"
)

// pageSize is SQLite's default page size, which every history uses; MaxBytes
// becomes PRAGMA max_page_count = MaxBytes/pageSize.
const pageSize = 4096

// readers is the size of each Log's read connection pool.
const readers = 4

// walAutoCheckpoint is the WAL size, in pages, past which a commit copies
// the WAL into the database file (with SyncNormal, syncing both): 16 MiB,
// four times SQLite's default. A busy session checkpoints a quarter as
// often, and the pages its commits rewrite (index leaves, interior pages)
// are copied once per checkpoint instead of once per 1,000 frames:
// BenchmarkAppendMessages 14.1–14.7 → 13.4–13.8 CPU µs per event. Close
// still checkpoints and truncates the WAL, so a hibernated session keeps
// none.
const walAutoCheckpoint = 4000

// migrations[i] brings a history from schema version i (PRAGMA user_version)
// to i+1.
var migrations = []string{
	`CREATE TABLE events (seq INTEGER PRIMARY KEY, kind TEXT NOT NULL, json BLOB NOT NULL);
	 CREATE INDEX events_kind_seq ON events (kind, seq);
	 CREATE TABLE meta (key TEXT PRIMARY KEY, value BLOB);`,
	// events_prompt finds a prompt by who sent it and its client_id (see
	// PromptSeq), so a session can acknowledge a retried prompt with its
	// original seq after waking. Only message events are indexed: an insert
	// of any other kind costs nothing more.
	`CREATE INDEX events_prompt ON events (json_extract(json, '$.by'), json_extract(json, '$.data.client_id'), seq) WHERE kind = 'message';`,
	// events_prompt indexes two plain columns instead of two json_extract
	// expressions: Append fills them from what it reads of a message event
	// anyway (notePromptsLocked), where SQLite parsed the event's JSON twice
	// per insert (~1.3 µs of a message event's ~15, BenchmarkAppendMessages).
	// A row has both or neither: a message event whose by and
	// data.client_id are both strings, the only prompts a lookup can find.
	`ALTER TABLE events ADD COLUMN prompt_by TEXT;
	 ALTER TABLE events ADD COLUMN prompt_client_id TEXT;
	 UPDATE events SET prompt_by = json_extract(json, '$.by'), prompt_client_id = json_extract(json, '$.data.client_id')
	  WHERE kind = 'message' AND json_type(json, '$.by') = 'text' AND json_type(json, '$.data.client_id') = 'text';
	 DROP INDEX events_prompt;
	 CREATE INDEX events_prompt ON events (prompt_by, prompt_client_id, seq) WHERE prompt_client_id IS NOT NULL;`,
}

// exactRows and maxChunk shape Append's INSERT statements. A batch of up to
// exactRows events is one INSERT of that many rows; a larger one is INSERTs
// of the largest power of two of rows that fits, at most maxChunk, until up
// to exactRows are left for a last one. Each statement is prepared once per
// Log, so there are at most exactRows+3 of them. The bound parameters, 3 per
// row, stay far below SQLite's limit (SQLITE_MAX_VARIABLE_NUMBER, 32766);
// larger statements save little per row but cost more to prepare after every
// Open.
const (
	exactRows = 16
	maxChunk  = 1 << 7
)

// Log is one open session history. One goroutine appends to it (the session
// actor) while any number of others read. Append, SetMeta and the point reads
// (Meta, LastOfKind, PromptSeq, a Range of one event) go through a single
// writer connection, so waking a session opens one connection; a longer
// Range, which may read megabytes, goes through a small pool of read
// connections, connected on first use, which WAL mode lets run alongside the
// writer.
type Log struct {
	id       session.ID
	path     string // the database file
	maxBytes int64
	writer   *sql.DB      // one connection
	readers  *sql.DB      // for Range; connects lazily
	lastSeq  atomic.Int64 // seq of the last committed event

	mu      sync.Mutex        // serializes writes and Close
	inserts map[int]*sql.Stmt // by number of rows; guarded by mu, prepared on first use
	prompt  *sql.Stmt         // PromptSeq's query; guarded by mu, prepared on first use
	prompts *promptSet        // guarded by mu; nil until built (see promptSetAfter)
	lookups int               // guarded by mu: PromptSeq calls so far
	closed  bool              // guarded by mu
	// quietStart: the next commit may run without syncs (quietstart.go);
	// guarded by mu.
	quietStart bool
}

// open opens the existing file path as the history of id and migrates it;
// create makes the file a WAL database first. (The journal mode is stored in
// the file, so Open need not set it again.)
func (d *Dir) open(ctx context.Context, path string, id session.ID, create bool) (_ *Log, err error) {
	syncMode, err := d.syncMode()
	if err != nil {
		return nil, err
	}
	l := &Log{id: id, path: path, maxBytes: d.MaxBytes}
	if l.maxBytes <= 0 {
		l.maxBytes = DefaultMaxBytes
	}
	dsn := func(pragmas ...string) string {
		q := url.Values{"mode": {"rw"}, "_pragma": append([]string{"busy_timeout(5000)"}, pragmas...)}
		q.Set("_txlock", "immediate")
		return (&url.URL{Scheme: "file", OmitHost: true, Path: path, RawQuery: q.Encode()}).String()
	}
	pragmas := []string{"synchronous(" + syncMode + ")", fmt.Sprintf("wal_autocheckpoint(%d)", walAutoCheckpoint),
		fmt.Sprintf("max_page_count(%d)", max(l.maxBytes/pageSize, 1))}
	if create {
		pragmas = append(pragmas, "journal_mode(WAL)")
	}
	if l.writer, err = openDB(dsn(pragmas...)); err != nil {
		return nil, err
	}
	l.writer.SetMaxOpenConns(1)
	if l.readers, err = openDB(dsn("query_only(1)")); err != nil {
		l.writer.Close()
		return nil, err
	}
	l.readers.SetMaxOpenConns(readers)
	defer func() {
		if err != nil {
			l.readers.Close()
			l.writer.Close()
		}
	}()
	if err := l.migrate(ctx, d); err != nil {
		return nil, l.classify(err, "migrate", 0)
	}
	var last int64
	if err := l.writer.QueryRowContext(ctx, `SELECT coalesce(max(seq), 0) FROM events`).Scan(&last); err != nil {
		return nil, l.classify(err, "read last seq of", 0)
	}
	l.lastSeq.Store(last)
	l.quietStart = syncMode == "NORMAL" && walEmpty(path)
	return l, nil
}

// syncMode returns the value of PRAGMA synchronous for d.Sync.
func (d *Dir) syncMode() (string, error) {
	switch d.Sync {
	case "", SyncNormal:
		return "NORMAL", nil
	case SyncFull:
		return "FULL", nil
	}
	return "", fmt.Errorf("sync mode %q: want %q or %q", d.Sync, SyncNormal, SyncFull)
}

// openDB returns a pool of connections to dsn that keep the WAL files (see
// keepWAL).
func openDB(dsn string) (*sql.DB, error) {
	c, err := sqlite.NewConnector(dsn)
	if err != nil {
		return nil, err
	}
	return sql.OpenDB(keepWAL{c}), nil
}

// keepWAL is a driver.Connector that sets SQLITE_FCNTL_PERSIST_WAL on every
// connection it opens. SQLite then keeps the -wal and -shm files when the
// last connection to a history closes (it still checkpoints, and Log.Close
// truncates the WAL to nothing first), so waking and hibernating a history
// again creates and deletes no file: on a busy node those creates and
// deletes were most of the cost of a wake, all of it kernel time spent in the
// filesystem's inode allocator and under the directory's lock. Every
// connection carries the flag because whichever closes last decides.
type keepWAL struct{ driver.Connector }

func (c keepWAL) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	fc, ok := conn.(sqlite.FileControl)
	if !ok {
		conn.Close()
		return nil, fmt.Errorf("keep WAL files: driver connection %T has no file control", conn)
	}
	if _, err := fc.FileControlPersistWAL("main", 1); err != nil {
		conn.Close()
		return nil, fmt.Errorf("keep WAL files: %w", err)
	}
	return conn, nil
}

func (l *Log) migrate(ctx context.Context, d *Dir) error {
	var v int
	if err := l.writer.QueryRowContext(ctx, `PRAGMA user_version`).Scan(&v); err != nil {
		return err
	}
	if v > len(migrations) {
		return fmt.Errorf("schema version %d is newer than this atrium supports (%d)", v, len(migrations))
	}
	for ; v < len(migrations); v++ {
		tx, err := l.writer.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, migrations[v])
		if err == nil {
			_, err = tx.ExecContext(ctx, fmt.Sprintf(`PRAGMA user_version = %d`, v+1))
		}
		if err == nil {
			err = tx.Commit()
		}
		if err != nil {
			tx.Rollback()
			return fmt.Errorf("to schema version %d: %w", v+1, err)
		}
		d.logger().Debug("migrated history", "session", l.id, "version", v+1)
	}
	return nil
}

// Append commits evs, whose seqs must run on from LastSeq without gaps, in
// one transaction; they are durable when it returns nil. A batch whose seqs
// do not follow fails with an error matching session.ErrConflict, one that
// does not fit in MaxBytes or on the disk with session.ErrUnavailable; either
// way nothing is written and the Log stays usable.
//
// A batch of up to 16 events is one INSERT statement and needs no explicit
// transaction; a larger one takes a few (100 events: 64, 32 and 4 rows) in
// one transaction.
func (l *Log) Append(ctx context.Context, evs []session.Stored) (err error) {
	if len(evs) == 0 {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return fmt.Errorf("append to history %s: closed", l.id)
	}
	last := l.lastSeq.Load()
	var size int64
	for i, ev := range evs {
		if ev.Seq != last+1+int64(i) {
			return fmt.Errorf("append to history %s: %w", l.id, session.Errorf(session.CodeConflict,
				"event %d of the batch has seq %d, want %d", i, ev.Seq, last+1+int64(i)))
		}
		if ev.Kind == "" || len(ev.JSON) == 0 {
			return fmt.Errorf("append to history %s: %w", l.id, session.Errorf(session.CodeBadRequest, "event %d has no kind or no JSON", ev.Seq))
		}
		size += int64(len(ev.JSON) + len(ev.Kind))
	}
	// Prepare the statements first: the transaction will hold the only
	// writer connection.
	for rest := len(evs); rest > 0; rest -= chunkLen(rest) {
		if err := l.prepareInsert(ctx, chunkLen(rest)); err != nil {
			return l.classify(err, "append to", size)
		}
	}
	defer func() {
		if err != nil {
			l.reloadLastSeq() // In case the commit took effect after all.
			l.prompts = nil   // Likewise: what it holds is no longer known.
		}
	}()
	quietEnd, err := l.beginQuietStart(ctx, size)
	if err != nil {
		return l.classify(err, "append to", size)
	}
	if quietEnd != nil {
		defer func() { err = errors.Join(err, quietEnd()) }() // Before the reload above.
	}
	ps := readPrompts(evs)
	if len(evs) == chunkLen(len(evs)) {
		// One statement is its own transaction.
		if _, err := l.insertStmt(len(evs)).ExecContext(ctx, insertArgs(evs, ps)...); err != nil {
			return l.classify(err, "append to", size)
		}
	} else {
		tx, err := l.writer.BeginTx(ctx, nil)
		if err != nil {
			return l.classify(err, "append to", size)
		}
		for rest, restPs := evs, ps; len(rest) > 0; {
			n := chunkLen(len(rest))
			if _, err := tx.StmtContext(ctx, l.insertStmt(n)).ExecContext(ctx, insertArgs(rest[:n], restPs[:n])...); err != nil {
				tx.Rollback()
				return l.classify(err, "append to", size)
			}
			rest, restPs = rest[n:], restPs[n:]
		}
		if err := tx.Commit(); err != nil {
			return l.classify(err, "append to", size)
		}
	}
	l.lastSeq.Store(evs[len(evs)-1].Seq)
	l.notePromptsLocked(ps)
	return nil
}

// chunkLen is the number of rows of the first INSERT of a batch of n events.
func chunkLen(n int) int {
	if n <= exactRows {
		return n
	}
	return min(1<<(bits.Len(uint(n))-1), maxChunk) // The largest power of two that fits.
}

// prepareInsert prepares the statement that inserts n rows unless it is
// prepared already. l.mu must be held.
func (l *Log) prepareInsert(ctx context.Context, n int) error {
	if l.inserts[n] != nil {
		return nil
	}
	// OR ROLLBACK: a statement that fails ends the whole transaction,
	// which Append rolls back anyway, so SQLite keeps no statement journal
	// for the statements of a batch that takes several (a copy of every
	// page each one changes: ~2 µs of a message event's ~15).
	q := `INSERT OR ROLLBACK INTO events (seq, kind, json, prompt_by, prompt_client_id) VALUES ` + strings.Repeat(`(?, ?, ?, ?, ?), `, n-1) + `(?, ?, ?, ?, ?)`
	st, err := l.writer.PrepareContext(ctx, q)
	if err != nil {
		return fmt.Errorf("prepare insert: %w", err)
	}
	if l.inserts == nil {
		l.inserts = make(map[int]*sql.Stmt)
	}
	l.inserts[n] = st
	return nil
}

// insertStmt returns the prepared statement that inserts n rows. l.mu must
// be held.
func (l *Log) insertStmt(n int) *sql.Stmt { return l.inserts[n] }

// insertArgs returns the arguments of the statement that inserts evs,
// whose prompts (readPrompts) are ps.
func insertArgs(evs []session.Stored, ps []prompt) []any {
	args := make([]any, 0, 5*len(evs))
	for i, ev := range evs {
		var by, clientID any // NULL unless the event is a prompt with a client_id
		if p := ps[i]; p.indexed() {
			by, clientID = p.by, p.clientID
		}
		args = append(args, ev.Seq, string(ev.Kind), ev.JSON, by, clientID)
	}
	return args
}

func (l *Log) reloadLastSeq() {
	var last int64
	if l.writer.QueryRow(`SELECT coalesce(max(seq), 0) FROM events`).Scan(&last) == nil {
		l.lastSeq.Store(last)
	}
}

// Range returns the encoded events with seq > after in order: at most limit
// of them (at least 1) and, past the first, no more than maxBytes in total
// (maxBytes <= 0 means no byte limit). more reports whether events beyond the
// last returned exist.
func (l *Log) Range(ctx context.Context, after session.Seq, limit, maxBytes int) (evs []json.RawMessage, more bool, err error) {
	if after >= l.lastSeq.Load() {
		return nil, false, nil
	}
	limit = max(limit, 1)
	if limit == 1 {
		return l.rangeOne(ctx, after)
	}
	rows, err := l.readers.QueryContext(ctx, `SELECT json FROM events WHERE seq > ? ORDER BY seq LIMIT ?`, after, limit+1)
	if err != nil {
		return nil, false, l.classify(err, "read", 0)
	}
	defer rows.Close()
	total := 0
	for rows.Next() {
		var b []byte
		if err := rows.Scan(&b); err != nil {
			return nil, false, l.classify(err, "read", 0)
		}
		total += len(b)
		if len(evs) == limit || (len(evs) > 0 && maxBytes > 0 && total > maxBytes) {
			return evs, true, nil
		}
		evs = append(evs, b)
	}
	if err := rows.Err(); err != nil {
		return nil, false, l.classify(err, "read", 0)
	}
	return evs, false, nil
}

// rangeOne is Range of one event, a point read like LastOfKind: on the
// writer connection, so that a session waking (which reads its last event)
// connects no reader (~0.2 ms).
func (l *Log) rangeOne(ctx context.Context, after session.Seq) ([]json.RawMessage, bool, error) {
	var seq session.Seq
	var b []byte
	err := l.writer.QueryRowContext(ctx, `SELECT seq, json FROM events WHERE seq > ? ORDER BY seq LIMIT 1`, after).Scan(&seq, &b)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, false, nil
	} else if err != nil {
		return nil, false, l.classify(err, "read", 0)
	}
	return []json.RawMessage{b}, seq < l.lastSeq.Load(), nil
}

// LastSeq returns the seq of the last committed event, 0 if none. It is kept
// in memory and never fails.
func (l *Log) LastSeq(context.Context) (session.Seq, error) { return l.lastSeq.Load(), nil }

// LastOfKind returns the newest event of kind, or nil if there is none. Like
// Meta, it is one indexed lookup and runs on the writer connection, so it
// waits for an Append in progress.
func (l *Log) LastOfKind(ctx context.Context, kind session.Kind) (json.RawMessage, error) {
	var b []byte
	err := l.writer.QueryRowContext(ctx, `SELECT json FROM events WHERE kind = ? ORDER BY seq DESC LIMIT 1`, string(kind)).Scan(&b)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	} else if err != nil {
		return nil, l.classify(err, "read", 0)
	}
	return b, nil
}

// promptQuery is PromptSeq's query.
const promptQuery = `SELECT seq FROM events INDEXED BY events_prompt
	WHERE prompt_by = ? AND prompt_client_id = ? ORDER BY seq DESC LIMIT 1`

// PromptSeq returns the seq of the newest message event by user whose
// client_id is clientID, or 0 if there is none. It is one lookup in the
// events_prompt index and, like LastOfKind, runs on the writer connection,
// so it waits for an Append in progress. Its statement is prepared once per
// Log (parsing it again was most of the lookup's cost), and a Log asked
// often keeps the set of prompts it holds in memory (promptSet), so that a
// client_id never sent costs no SQL at all.
func (l *Log) PromptSeq(ctx context.Context, user, clientID string) (session.Seq, error) {
	st, err := l.promptLookup(ctx, user, clientID)
	if err != nil {
		return 0, l.classify(err, "read", 0)
	}
	if st == nil {
		return 0, nil
	}
	var seq session.Seq
	err = st.QueryRowContext(ctx, user, clientID).Scan(&seq)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	} else if err != nil {
		return 0, l.classify(err, "read", 0)
	}
	return seq, nil
}

// Meta returns the session's metadata.
func (l *Log) Meta(ctx context.Context) (session.Meta, error) {
	var b []byte
	var m session.Meta
	if err := l.writer.QueryRowContext(ctx, `SELECT value FROM meta WHERE key = 'session'`).Scan(&b); err != nil {
		return m, l.classify(err, "read metadata of", 0)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("read metadata of history %s: %w", l.id, err)
	}
	return m, nil
}

// SetMeta replaces the session's metadata; m.ID must be the history's id.
func (l *Log) SetMeta(ctx context.Context, m session.Meta) error {
	if m.ID != l.id {
		return fmt.Errorf("set metadata of history %s: %w", l.id, session.Errorf(session.CodeBadRequest, "metadata is for session %q", m.ID))
	}
	b, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("set metadata of history %s: %w", l.id, err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, err = l.writer.ExecContext(ctx, `INSERT INTO meta (key, value) VALUES ('session', ?)
		ON CONFLICT (key) DO UPDATE SET value = excluded.value`, b)
	return l.classify(err, "set metadata of", int64(len(b)))
}

// Close checkpoints the WAL into the database file, truncates the WAL to
// nothing and closes every connection, so the database file alone holds the
// whole history and no file descriptor stays open. The empty -wal and the
// -shm file stay for the next Open (see keepWAL). It is safe to call twice.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	var errs []error
	for _, st := range l.inserts {
		errs = append(errs, st.Close())
	}
	if l.prompt != nil {
		errs = append(errs, l.prompt.Close())
	}
	errs = append(errs, l.readers.Close()) // Readers first, so the checkpoint can complete.
	// The checkpoint truncates the WAL to nothing; with journal_size_limit
	// 0, so does SQLite's own checkpoint when the writer closes, had this
	// one been kept from completing.
	var busy int
	if err := l.writer.QueryRow(`PRAGMA journal_size_limit = 0`).Scan(new(int64)); err != nil {
		errs = append(errs, fmt.Errorf("limit WAL: %w", err))
	} else if err := l.writer.QueryRow(`PRAGMA wal_checkpoint(TRUNCATE)`).Scan(&busy, new(int), new(int)); err != nil {
		errs = append(errs, fmt.Errorf("checkpoint: %w", err))
	} else if busy != 0 {
		errs = append(errs, errors.New("checkpoint: the WAL is in use"))
	}
	errs = append(errs, l.writer.Close())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close history %s: %w", l.id, err)
	}
	return nil
}

// classify wraps err from the step on this history. A full history or disk
// and I/O errors become session.ErrUnavailable with a message for humans;
// need is the size of what was being written.
func (l *Log) classify(err error, step string, need int64) error {
	var se *sqlite.Error
	if err == nil {
		return nil
	} else if !errors.As(err, &se) {
		return fmt.Errorf("%s history %s: %w", step, l.id, err)
	}
	var msg string
	switch se.Code() & 0xff {
	case sqlite3.SQLITE_FULL:
		// SQLITE_FULL means max_page_count was reached or the disk is full.
		// Tell them apart by how close the file is to the cap. (A reader
		// asks: the writer may still be inside the failed transaction.)
		var pages int64
		l.readers.QueryRow(`PRAGMA page_count`).Scan(&pages)
		if (pages+1)*pageSize+2*need >= l.maxBytes {
			msg = fmt.Sprintf("session history is full (limit %s)", humanBytes(l.maxBytes))
		} else {
			msg = "disk full writing history"
		}
	case sqlite3.SQLITE_IOERR:
		msg = "disk I/O error on history"
	default:
		return fmt.Errorf("%s history %s: %w", step, l.id, err)
	}
	return fmt.Errorf("%s history %s: %w: %w", step, l.id, session.Errorf(session.CodeUnavailable, "%s", msg), err)
}

// humanBytes formats n as "1 GiB", "1.5 MiB", "512 KiB" or "100 B".
func humanBytes(n int64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	f, i := float64(n), 0
	for ; f >= 1024 && i < len(units)-1; i++ {
		f /= 1024
	}
	if f == float64(int64(f)) {
		return fmt.Sprintf("%d %s", int64(f), units[i])
	}
	return fmt.Sprintf("%.1f %s", f, units[i])
}
