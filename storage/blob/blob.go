// Package blob is Atrium's object store: a flat namespace of keys holding
// immutable byte streams, with conditional writes for the few objects that
// are updated in place (workspace manifests, history checkpoints). Store is
// the interface; S3 implements it over any S3-compatible service
// (github.com/minio/minio-go/v7), Dir over a local directory (the embedded
// default). Both pass the contract suite in blob/blobtest.
//
// # Keys
//
// A key is a slash-separated path such as "sessions/s1/workspace/manifest.json":
// no empty, "." or ".." segment, no leading or trailing slash, no NUL, and the
// first segment may not be ".atrium" (Dir keeps its own files there). Keys
// outside these rules fail with ErrInvalidKey in every implementation, so
// code tested against Dir behaves the same against S3.
//
// # Conditional writes
//
// PutOptions.IfNoneMatch creates an object only if the key is free;
// PutOptions.IfMatch replaces it only if its ETag is still the one the caller
// read. A write that loses fails with ErrPrecondition and changes nothing.
// S3 honours these conditions on single-part uploads only (multipart
// completion drops them), so S3.Put sends a conditional write as one request
// (at most 5 GiB on AWS; of unknown size, at most one part): use conditions
// on small objects such as manifests, and write-once keys for everything
// else.
//
// # Errors
//
// Errors match ErrNotFound, ErrPrecondition, ErrInvalidKey or ErrUnavailable
// (the store could not be reached or failed on its side: connection refused,
// timeouts, 5xx) with errors.Is, and name the key and, for S3, the endpoint.
package blob

import (
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"strings"
	"time"
)

// Sentinel errors of every Store.
var (
	// ErrNotFound means the key holds no object.
	ErrNotFound = errors.New("blob: not found")
	// ErrPrecondition means a conditional write lost: the object existed
	// (IfNoneMatch) or no longer had the expected ETag (IfMatch).
	ErrPrecondition = errors.New("blob: precondition failed")
	// ErrInvalidKey means a key breaks the rules in the package doc.
	ErrInvalidKey = errors.New("blob: invalid key")
	// ErrUnavailable means the object store could not be reached or failed
	// on its side; retrying later may succeed.
	ErrUnavailable = errors.New("blob: object store unavailable")
)

// Info describes a stored object.
type Info struct {
	Key  string
	Size int64
	// ETag identifies the object's content: an S3 ETag (the MD5 of a
	// single-part object), or the hex SHA-256 of a Dir object. Compare it
	// only with ETags of the same store, and pass it to PutOptions.IfMatch.
	ETag        string
	Modified    time.Time
	ContentType string
}

// PutOptions are the optional parts of a Put.
type PutOptions struct {
	// IfNoneMatch writes only if the key holds no object.
	IfNoneMatch bool
	// IfMatch, when not empty, writes only if the object's ETag equals it;
	// a missing object fails the condition too.
	IfMatch string
	// ContentType is stored with the object; empty means
	// application/octet-stream.
	ContentType string
}

// conditional reports whether o asks for a conditional write.
func (o PutOptions) conditional() bool { return o.IfNoneMatch || o.IfMatch != "" }

// Store is an object store. Implementations are safe for concurrent use.
type Store interface {
	// Put stores the bytes of r under key, replacing any object there
	// (subject to opts' conditions). size is the exact length of r, or -1
	// when unknown. If r fails or ends early, Put fails and no object is
	// created or replaced.
	Put(ctx context.Context, key string, r io.Reader, size int64, opts PutOptions) (Info, error)
	// Get opens the object at key. The caller closes the reader; reading
	// it fails if ctx ends first.
	Get(ctx context.Context, key string) (io.ReadCloser, Info, error)
	// Stat describes the object at key.
	Stat(ctx context.Context, key string) (Info, error)
	// Delete removes the object at key. Deleting a missing key succeeds.
	Delete(ctx context.Context, key string) error
	// List yields every object whose key starts with prefix, in
	// lexicographic key order. An error ends the sequence.
	List(ctx context.Context, prefix string) iter.Seq2[Info, error]
}

// Presigner makes URLs that grant one operation on one key for a limited
// time, so a process without credentials (a sandbox VM) can move an object
// with plain HTTP: GET the URL to download, PUT the bytes with a
// Content-Length to upload.
type Presigner interface {
	PresignGet(ctx context.Context, key string, ttl time.Duration) (string, error)
	PresignPut(ctx context.Context, key string, ttl time.Duration) (string, error)
}

// reserved is the first key segment Dir keeps for its own files.
const reserved = ".atrium"

// ValidKey reports whether key follows the rules in the package doc, with
// an error matching ErrInvalidKey that says which rule it breaks.
func ValidKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	case len(key) > 1024:
		return fmt.Errorf("%w: %.40q… is longer than 1024 bytes", ErrInvalidKey, key)
	case strings.HasPrefix(key, "/") || strings.HasSuffix(key, "/"):
		return fmt.Errorf("%w: %q starts or ends with a slash", ErrInvalidKey, key)
	case strings.ContainsRune(key, 0):
		return fmt.Errorf("%w: %q contains NUL", ErrInvalidKey, key)
	}
	for i, seg := range strings.Split(key, "/") {
		switch {
		case seg == "" || seg == "." || seg == "..":
			return fmt.Errorf("%w: %q has an empty, \".\" or \"..\" segment", ErrInvalidKey, key)
		case i == 0 && seg == reserved:
			return fmt.Errorf("%w: %q: keys under %s/ are reserved", ErrInvalidKey, key, reserved)
		}
	}
	return nil
}

// validPrefix checks a List prefix: empty, or a key or the start of one.
func validPrefix(prefix string) error {
	if prefix == "" {
		return nil
	}
	if err := ValidKey(strings.TrimSuffix(prefix, "/")); err != nil {
		return fmt.Errorf("list prefix: %w", err)
	}
	return nil
}

// unavailable wraps err, a failure to reach the store at endpoint, so that it
// matches ErrUnavailable and still unwraps to the cause.
func unavailable(endpoint string, err error) error {
	return &unavailableError{endpoint: endpoint, err: err}
}

type unavailableError struct {
	endpoint string
	err      error
}

func (e *unavailableError) Error() string {
	return fmt.Sprintf("object store %s unavailable: %v", e.endpoint, e.err)
}

func (e *unavailableError) Is(target error) bool { return target == ErrUnavailable }
func (e *unavailableError) Unwrap() error        { return e.err }

// errorSeq returns a sequence yielding only err.
func errorSeq(err error) iter.Seq2[Info, error] {
	return func(yield func(Info, error) bool) { yield(Info{}, err) }
}
