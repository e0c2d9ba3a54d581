package blob

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// Defaults of S3Config.
const (
	// DefaultPartSize is the size of each part of a multipart upload, and
	// the most a single upload buffers in memory. minio-go's own default
	// for uploads of unknown size is about 537 MiB per part.
	DefaultPartSize = 16 << 20
	// DefaultRegion is the region used when S3Config.Region is empty.
	DefaultRegion = "us-east-1"
	// DefaultMaxRetries is how many times a failed request is tried again
	// (with backoff of at most a second) before the error is returned.
	DefaultMaxRetries = 3
)

// S3Config configures an S3 store.
type S3Config struct {
	// Endpoint is host:port of the S3 service, without a scheme. Required.
	Endpoint string
	// Bucket holds every object. Required.
	Bucket string
	// Prefix is prepended to every key, e.g. "atrium/"; List returns keys
	// without it. Optional; when set it must end with "/".
	Prefix string
	// AccessKey and SecretKey are the credentials. Required.
	AccessKey string
	SecretKey string
	// Region defaults to DefaultRegion.
	Region string
	// Secure uses HTTPS.
	Secure bool
	// PartSize is the multipart part size in bytes, at least 5 MiB;
	// 0 means DefaultPartSize. Uploads buffer at most one part at a time.
	PartSize int64
	// MaxRetries of each request; 0 means DefaultMaxRetries, -1 none.
	MaxRetries int
	// CreateBucket makes Bucket at OpenS3 if it does not exist.
	CreateBucket bool
}

// S3 is a Store on an S3-compatible service (AWS S3, MinIO, versitygw,
// Ceph RGW, R2...), through github.com/minio/minio-go/v7. It implements
// Presigner, so remote sandboxes can move objects without credentials.
//
// Every upload passes an explicit part size: an upload larger than PartSize
// is sent in parts of PartSize, buffering at most one part. A conditional
// upload is always sent as one request, streamed when its size is known
// (S3 accepts up to 5 GiB in one request) and buffered when it is not, up to
// PartSize (see the package doc).
type S3 struct {
	cfg       S3Config
	client    *minio.Client
	transport *http.Transport
	endpoint  string // scheme://host:port, for error messages
}

var (
	_ Store     = (*S3)(nil)
	_ Presigner = (*S3)(nil)
)

// OpenS3 connects to the service of cfg. It checks that the bucket exists
// (creating it if cfg.CreateBucket is set), so a wrong endpoint or wrong
// credentials fail here rather than at the first save. It is NewS3 then
// Check.
func OpenS3(ctx context.Context, cfg S3Config) (*S3, error) {
	s, err := NewS3(cfg)
	if err != nil {
		return nil, err
	}
	if err := s.Check(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// NewS3 makes a store for cfg without contacting the service: it fails only
// on a configuration error. A process that must start while the store is
// down uses it and calls Check until the store answers; every operation
// meanwhile fails with ErrUnavailable and succeeds again once the service
// is back, with no need to reopen.
func NewS3(cfg S3Config) (*S3, error) {
	switch {
	case cfg.Endpoint == "":
		return nil, errors.New("open s3: no endpoint: set host:port of the S3 service")
	case strings.Contains(cfg.Endpoint, "://"):
		return nil, fmt.Errorf("open s3: endpoint %q must be host:port without a scheme; use Secure for https", cfg.Endpoint)
	case cfg.Bucket == "":
		return nil, errors.New("open s3: no bucket")
	case cfg.AccessKey == "" || cfg.SecretKey == "":
		return nil, errors.New("open s3: no access key or secret key")
	case cfg.Prefix != "" && !strings.HasSuffix(cfg.Prefix, "/"):
		return nil, fmt.Errorf("open s3: prefix %q must end with /", cfg.Prefix)
	}
	if cfg.Prefix != "" {
		if err := ValidKey(strings.TrimSuffix(cfg.Prefix, "/")); err != nil {
			return nil, fmt.Errorf("open s3: prefix: %w", err)
		}
	}
	if cfg.Region == "" {
		cfg.Region = DefaultRegion
	}
	if cfg.PartSize == 0 {
		cfg.PartSize = DefaultPartSize
	}
	if cfg.PartSize < 5<<20 {
		return nil, fmt.Errorf("open s3: part size %d is below the S3 minimum of 5 MiB", cfg.PartSize)
	}
	retries := cfg.MaxRetries
	switch {
	case retries == 0:
		retries = DefaultMaxRetries
	case retries < 0:
		retries = 0
	}
	transport, err := minio.DefaultTransport(cfg.Secure)
	if err != nil {
		return nil, fmt.Errorf("open s3: %w", err)
	}
	client, err := minio.New(cfg.Endpoint, &minio.Options{
		Creds:        credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, ""),
		Secure:       cfg.Secure,
		Region:       cfg.Region,
		Transport:    transport,
		BucketLookup: minio.BucketLookupPath,
		MaxRetries:   retries + 1, // minio-go counts the first attempt.
	})
	if err != nil {
		return nil, fmt.Errorf("open s3: %w", err)
	}
	scheme := "http"
	if cfg.Secure {
		scheme = "https"
	}
	return &S3{cfg: cfg, client: client, transport: transport, endpoint: scheme + "://" + cfg.Endpoint}, nil
}

// Check asks the service whether the bucket exists, creating it if
// CreateBucket is set. An error matching ErrUnavailable means the service
// could not be reached (try again later); any other is a configuration
// problem (no bucket, refused credentials) that retrying will not fix.
func (s *S3) Check(ctx context.Context) error {
	ok, err := s.client.BucketExists(ctx, s.cfg.Bucket)
	if err != nil {
		return fmt.Errorf("open s3: check bucket %s: %w", s.cfg.Bucket, s.mapErr(err))
	}
	if !ok && !s.cfg.CreateBucket {
		return fmt.Errorf("open s3: bucket %s does not exist at %s: create it, or set CreateBucket", s.cfg.Bucket, s.endpoint)
	}
	if !ok {
		err := s.client.MakeBucket(ctx, s.cfg.Bucket, minio.MakeBucketOptions{Region: s.cfg.Region})
		if err != nil && !isCode(err, "BucketAlreadyOwnedByYou", "BucketAlreadyExists") {
			return fmt.Errorf("open s3: create bucket %s: %w", s.cfg.Bucket, s.mapErr(err))
		}
	}
	return nil
}

// Close releases idle connections. The store must not be used afterwards;
// Close is safe to call twice.
func (s *S3) Close() error {
	s.transport.CloseIdleConnections()
	return nil
}

// Endpoint returns the service's URL, for messages.
func (s *S3) Endpoint() string { return s.endpoint }

// PartSize returns the multipart part size in use.
func (s *S3) PartSize() int64 { return s.cfg.PartSize }

// Put implements Store.
func (s *S3) Put(ctx context.Context, key string, r io.Reader, size int64, opts PutOptions) (Info, error) {
	if err := ValidKey(key); err != nil {
		return Info{}, fmt.Errorf("put: %w", err)
	}
	po := minio.PutObjectOptions{
		ContentType: orDefault(opts.ContentType, defaultContentType),
		PartSize:    uint64(s.cfg.PartSize),
		NumThreads:  1, // One part buffered at a time: memory stays at PartSize.
	}
	if opts.conditional() {
		// Conditions survive single-part uploads only.
		po.DisableMultipart = true
		if opts.IfNoneMatch {
			po.SetMatchETagExcept("*")
		}
		if opts.IfMatch != "" {
			po.SetMatchETag(opts.IfMatch)
		}
		if size < 0 {
			// One request needs a length: buffer, up to one part.
			buf, err := io.ReadAll(io.LimitReader(r, s.cfg.PartSize+1))
			if err != nil {
				return Info{}, fmt.Errorf("put %s: read: %w", key, err)
			}
			if int64(len(buf)) > s.cfg.PartSize {
				return Info{}, fmt.Errorf("put %s: a conditional write of unknown size must fit one part (%d bytes); pass the size", key, s.cfg.PartSize)
			}
			r, size = bytes.NewReader(buf), int64(len(buf))
		}
	}
	// minio-go reports the reader's own failures as request errors; the
	// tracker tells them apart from the store's.
	body := &trackedReader{r: r, size: size}
	var in io.Reader = body
	if seeker, ok := r.(io.Seeker); ok {
		in = &trackedSeeker{body, seeker} // Seekable bodies are retried.
	}
	up, err := s.client.PutObject(ctx, s.cfg.Bucket, s.cfg.Prefix+key, in, size, po)
	if body.err != nil {
		return Info{}, fmt.Errorf("put %s: read: %w", key, body.err)
	}
	if err != nil {
		err = s.mapErr(err)
		if opts.IfMatch != "" && errors.Is(err, ErrNotFound) {
			err = fmt.Errorf("if-match %s: object is missing: %w", opts.IfMatch, ErrPrecondition)
		}
		return Info{}, fmt.Errorf("put %s: %w", key, err)
	}
	if size >= 0 && up.Size != size {
		return Info{}, fmt.Errorf("put %s: stored %d bytes, want %d", key, up.Size, size)
	}
	mod := up.LastModified
	if mod.IsZero() {
		mod = time.Now()
	}
	return Info{Key: key, Size: up.Size, ETag: up.ETag, Modified: mod, ContentType: po.ContentType}, nil
}

// Get implements Store.
func (s *S3) Get(ctx context.Context, key string) (io.ReadCloser, Info, error) {
	if err := ValidKey(key); err != nil {
		return nil, Info{}, fmt.Errorf("get: %w", err)
	}
	obj, err := s.client.GetObject(ctx, s.cfg.Bucket, s.cfg.Prefix+key, minio.GetObjectOptions{})
	if err != nil {
		return nil, Info{}, fmt.Errorf("get %s: %w", key, s.mapErr(err))
	}
	st, err := obj.Stat() // Sends the GET and reads the response headers.
	if err != nil {
		obj.Close()
		return nil, Info{}, fmt.Errorf("get %s: %w", key, s.mapErr(err))
	}
	return &s3Reader{obj: obj, s: s, key: key}, s.info(key, st), nil
}

// Stat implements Store.
func (s *S3) Stat(ctx context.Context, key string) (Info, error) {
	if err := ValidKey(key); err != nil {
		return Info{}, fmt.Errorf("stat: %w", err)
	}
	st, err := s.client.StatObject(ctx, s.cfg.Bucket, s.cfg.Prefix+key, minio.StatObjectOptions{})
	if err != nil {
		return Info{}, fmt.Errorf("stat %s: %w", key, s.mapErr(err))
	}
	return s.info(key, st), nil
}

// Delete implements Store.
func (s *S3) Delete(ctx context.Context, key string) error {
	if err := ValidKey(key); err != nil {
		return fmt.Errorf("delete: %w", err)
	}
	err := s.client.RemoveObject(ctx, s.cfg.Bucket, s.cfg.Prefix+key, minio.RemoveObjectOptions{})
	if err != nil && !errors.Is(s.mapErr(err), ErrNotFound) {
		return fmt.Errorf("delete %s: %w", key, s.mapErr(err))
	}
	return nil
}

// List implements Store.
func (s *S3) List(ctx context.Context, prefix string) iter.Seq2[Info, error] {
	if err := validPrefix(prefix); err != nil {
		return errorSeq(err)
	}
	return func(yield func(Info, error) bool) {
		// Cancelling stops minio-go's listing goroutine when the caller
		// stops early.
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		opts := minio.ListObjectsOptions{Prefix: s.cfg.Prefix + prefix, Recursive: true}
		for o := range s.client.ListObjectsIter(ctx, s.cfg.Bucket, opts) {
			if o.Err != nil {
				yield(Info{}, fmt.Errorf("list %q: %w", prefix, s.mapErr(o.Err)))
				return
			}
			key := strings.TrimPrefix(o.Key, s.cfg.Prefix)
			if strings.HasSuffix(key, "/") {
				continue // A directory marker some servers list.
			}
			if !yield(s.info(key, o), nil) {
				return
			}
		}
	}
}

// PresignGet implements Presigner.
func (s *S3) PresignGet(ctx context.Context, key string, ttl time.Duration) (string, error) {
	if err := ValidKey(key); err != nil {
		return "", fmt.Errorf("presign get: %w", err)
	}
	u, err := s.client.PresignedGetObject(ctx, s.cfg.Bucket, s.cfg.Prefix+key, ttl, url.Values{})
	if err != nil {
		return "", fmt.Errorf("presign get %s: %w", key, s.mapErr(err))
	}
	return u.String(), nil
}

// PresignPut implements Presigner. The URL accepts one single-part PUT (at
// most 5 GiB on AWS) with a Content-Length.
func (s *S3) PresignPut(ctx context.Context, key string, ttl time.Duration) (string, error) {
	if err := ValidKey(key); err != nil {
		return "", fmt.Errorf("presign put: %w", err)
	}
	u, err := s.client.PresignedPutObject(ctx, s.cfg.Bucket, s.cfg.Prefix+key, ttl)
	if err != nil {
		return "", fmt.Errorf("presign put %s: %w", key, s.mapErr(err))
	}
	return u.String(), nil
}

func (s *S3) info(key string, o minio.ObjectInfo) Info {
	return Info{Key: key, Size: o.Size, ETag: strings.Trim(o.ETag, `"`), Modified: o.LastModified, ContentType: o.ContentType}
}

// mapErr turns a minio-go error into one matching this package's sentinels.
func (s *S3) mapErr(err error) error {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	resp := minio.ToErrorResponse(err)
	switch {
	case resp.StatusCode == http.StatusNotFound || resp.Code == "NoSuchKey":
		return fmt.Errorf("%w (%s)", ErrNotFound, orDefault(resp.Code, "404"))
	case resp.StatusCode == http.StatusPreconditionFailed || resp.Code == "PreconditionFailed":
		return fmt.Errorf("%w (%s)", ErrPrecondition, orDefault(resp.Code, "412"))
	case resp.StatusCode == http.StatusForbidden:
		return fmt.Errorf("access denied by %s (%s): check the access key, secret key and bucket policy", s.endpoint, resp.Code)
	case resp.StatusCode >= 500 || resp.StatusCode == http.StatusRequestTimeout || resp.StatusCode == http.StatusTooManyRequests:
		return unavailable(s.endpoint, fmt.Errorf("%d %s: %s", resp.StatusCode, resp.Code, resp.Message))
	}
	var netErr net.Error
	var urlErr *url.Error
	if errors.As(err, &netErr) || errors.As(err, &urlErr) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return unavailable(s.endpoint, err)
	}
	return err
}

// isCode reports whether err is an S3 error response with one of codes.
func isCode(err error, codes ...string) bool {
	code := minio.ToErrorResponse(err).Code
	for _, c := range codes {
		if code == c {
			return true
		}
	}
	return false
}

// s3Reader is the body of a Get; read errors are mapped like the others.
type s3Reader struct {
	obj *minio.Object
	s   *S3
	key string
}

func (r *s3Reader) Read(p []byte) (int, error) {
	n, err := r.obj.Read(p)
	if err != nil && err != io.EOF {
		err = fmt.Errorf("get %s: %w", r.key, r.s.mapErr(err))
	}
	return n, err
}

func (r *s3Reader) Close() error { return r.obj.Close() }

// trackedReader records how a Put's body failed, if it did.
type trackedReader struct {
	r    io.Reader
	size int64
	n    int64
	err  error // the reader's failure, or its ending before size bytes
}

func (t *trackedReader) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	t.n += int64(n)
	switch {
	case err == io.EOF && t.size >= 0 && t.n < t.size:
		t.err = fmt.Errorf("reader ended after %d of %d bytes", t.n, t.size)
		err = t.err
	case err != nil && err != io.EOF:
		t.err = err
	}
	return n, err
}

// trackedSeeker lets minio-go retry a seekable body, unless the body itself
// failed.
type trackedSeeker struct {
	*trackedReader
	s io.Seeker
}

func (t *trackedSeeker) Seek(offset int64, whence int) (int64, error) {
	if t.err != nil {
		return 0, t.err
	}
	pos, err := t.s.Seek(offset, whence)
	if err == nil {
		t.n = pos
	}
	return pos, err
}
