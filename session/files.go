package session

// Wire types of a session's workspace (DESIGN §7 "More REST"): files, the
// changes of a turn, and forks. The gateway serves them over REST; the node
// answers OpFiles and OpFork on the Cmd subject. File bytes do not fit in
// one NATS message: they move as a stream of chunks on an inbox (see
// FileChunk), each chunk a request that the receiver answers once it has
// taken it, so a slow reader slows the sender down and nothing is buffered
// without bound.

// Command ops of the workspace.
const (
	// OpFiles is a file operation (Command.Files): reads need the viewer
	// role, writes the driver role → Reply.Files.
	OpFiles Op = "files"
	// OpFork prepares a fork (Command.Fork) on the parent session (viewer):
	// it checks the seq and gives the new session its workspace as of
	// then → Reply.Fork. The gateway then creates the new session with
	// PlaceRequest.Fork.
	OpFork Op = "fork"
)

// FileOp is the operation of a FilesRequest.
type FileOp string

// File operations.
const (
	FileList       FileOp = "list"        // Path (a directory), Recursive → Entries
	FileRead       FileOp = "read"        // Path, Stream → File, then the bytes on Stream
	FileWrite      FileOp = "write"       // Path, Size, Mode → Stream: send the bytes there
	FileDelete     FileOp = "delete"      // Path → ok
	FileArchiveOut FileOp = "archive_out" // Path (a directory), Stream → the tar.gz on Stream
	FileArchiveIn  FileOp = "archive_in"  // Path (a directory) → Stream: send the tar.gz there
	FileChanges    FileOp = "changes"     // Turn → Changes
)

// IsWrite reports whether op changes the workspace (driver role).
func (op FileOp) IsWrite() bool {
	return op == FileWrite || op == FileDelete || op == FileArchiveIn
}

// FilesRequest is Command.Files.
type FilesRequest struct {
	Op FileOp `json:"op"`
	// Path is relative to /workspace; "" is the workspace itself.
	Path      string `json:"path,omitempty"`
	Recursive bool   `json:"recursive,omitempty"`
	// Size is the length of the bytes a write sends, -1 if unknown.
	Size int64 `json:"size,omitempty"`
	// Mode is the permission bits of a written file (0 means 0644).
	Mode uint32 `json:"mode,omitempty"`
	// Stream is the inbox where the node sends the bytes of a read.
	Stream string `json:"stream,omitempty"`
	// Turn is the turn of FileChanges.
	Turn int64 `json:"turn,omitempty"`
}

// FilesReply is Reply.Files.
type FilesReply struct {
	Entries []FileEntry `json:"entries,omitempty"`
	// File describes the file a read streams.
	File *FileEntry `json:"file,omitempty"`
	// Stream is the node's inbox for the bytes of a write.
	Stream  string       `json:"stream,omitempty"`
	Changes []FileChange `json:"changes,omitempty"`
}

// FileEntry is one entry of GET /v1/sessions/{id}/files: Type is "file",
// "dir" or "symlink", Mode the permission bits in octal ("0644"), Target a
// symbolic link's target.
type FileEntry struct {
	Path   string `json:"path"`
	Type   string `json:"type"`
	Size   int64  `json:"size"`
	Mode   string `json:"mode"`
	MTime  Time   `json:"mtime"`
	Target string `json:"target,omitempty"`
}

// FileListing is the body of GET /v1/sessions/{id}/files.
type FileListing struct {
	Entries []FileEntry `json:"entries"`
}

// FileChange is one file of GET /v1/sessions/{id}/turns/{n}/changes: Status
// is "added", "modified" or "deleted"; Diff is a unified diff for text files
// up to MaxDiffFileBytes, omitted otherwise.
type FileChange struct {
	Path   string `json:"path"`
	Status string `json:"status"`
	Diff   string `json:"diff,omitempty"`
}

// TurnChanges is the body of GET /v1/sessions/{id}/turns/{n}/changes.
type TurnChanges struct {
	Files []FileChange `json:"files"`
}

// MaxDiffFileBytes is the largest file (old or new) the changes of a turn
// carry a diff for; the diffs of one turn total at most MaxDiffBytes.
const (
	MaxDiffFileBytes = 256 << 10
	MaxDiffBytes     = 1 << 20
)

// ForkRequest is Command.Fork (and the body of POST .../fork, with Title).
type ForkRequest struct {
	// AtSeq is the last event of the parent the fork keeps; 0 means the
	// parent's last event.
	AtSeq Seq    `json:"at_seq,omitempty"`
	Title string `json:"title,omitempty"`
	// Child is the new session's id (chosen by the gateway).
	Child ID `json:"child,omitempty"`
}

// ForkReply is Reply.Fork: what the new session starts from.
type ForkReply struct {
	Seq     Seq     `json:"seq"`
	Title   string  `json:"title"`
	Harness Harness `json:"harness,omitzero"`
}

// ForkedFrom is where a fork came from: session_created's forked_from and
// PlaceRequest.Fork.
type ForkedFrom struct {
	Session ID  `json:"session"`
	Seq     Seq `json:"seq"`
}

// Headers of FileChunk messages.
const (
	// HeaderChunkEnd is "1" on the last message of a stream (it may carry
	// bytes too).
	HeaderChunkEnd = "Atrium-Chunk-End"
	// HeaderChunkError carries an Error as JSON on a message that aborts a
	// stream; its sender sends nothing more.
	HeaderChunkError = "Atrium-Chunk-Error"
)

// FileChunk: a byte stream of a file operation is a sequence of NATS
// requests to the receiver's inbox, each carrying at most MaxChunkBytes, the
// last one with HeaderChunkEnd. The receiver answers each once it has taken
// the bytes: an empty reply to continue, or a Reply with Error to stop the
// sender. The answer to the last chunk of a write comes when the write is
// applied (it waits for the running turn), with the Reply of the operation.
const MaxChunkBytes = 256 << 10

// CodeInsufficientStorage means a quota is full (HTTP 507); the message
// names the quota.
const CodeInsufficientStorage Code = "insufficient_storage"

// ErrInsufficientStorage matches errors with CodeInsufficientStorage.
var ErrInsufficientStorage = &Error{Code: CodeInsufficientStorage} // session: insufficient storage
