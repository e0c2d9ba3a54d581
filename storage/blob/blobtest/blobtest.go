// Package blobtest tests object stores: TestStore is the contract suite every
// blob.Store passes (as testing/fstest is for file systems), and StartS3
// runs a real S3 server, versitygw, on loopback for the tests of code that
// uses S3.
package blobtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/atriumhq/atrium/storage/blob"
)

// TestStore runs the contract suite against the stores open returns; each
// subtest opens its own, empty, store.
func TestStore(t *testing.T, open func(t *testing.T) blob.Store) {
	ctx := context.Background()
	t.Run("put and get", func(t *testing.T) {
		s := open(t)
		for _, size := range []int{0, 1, 1000, 1 << 20} {
			key := fmt.Sprintf("sized/%d", size)
			data := Random(size)
			info, err := s.Put(ctx, key, bytes.NewReader(data), int64(size), blob.PutOptions{ContentType: "application/x-test"})
			if err != nil {
				t.Fatalf("put %d bytes: %v", size, err)
			}
			if info.Key != key || info.Size != int64(size) || info.ETag == "" {
				t.Errorf("put %d bytes: info %+v", size, info)
			}
			got, ginfo := MustGet(t, s, key)
			if !bytes.Equal(got, data) {
				t.Errorf("get %s: %d bytes differ from the %d put", key, len(got), size)
			}
			if ginfo.Size != int64(size) || ginfo.ETag != info.ETag || ginfo.ContentType != "application/x-test" {
				t.Errorf("get %s: info %+v, put returned %+v", key, ginfo, info)
			}
			st, err := s.Stat(ctx, key)
			if err != nil || st.Size != int64(size) || st.ETag != info.ETag || st.Modified.IsZero() {
				t.Errorf("stat %s = %+v, %v", key, st, err)
			}
		}
	})
	t.Run("unknown size", func(t *testing.T) {
		s := open(t)
		data := Random(300 << 10)
		info, err := s.Put(ctx, "unknown", struct{ io.Reader }{bytes.NewReader(data)}, -1, blob.PutOptions{})
		if err != nil {
			t.Fatalf("put: %v", err)
		}
		if info.Size != int64(len(data)) {
			t.Errorf("put size %d, want %d", info.Size, len(data))
		}
		if got, _ := MustGet(t, s, "unknown"); !bytes.Equal(got, data) {
			t.Error("content differs")
		}
	})
	t.Run("overwrite", func(t *testing.T) {
		s := open(t)
		a := MustPut(t, s, "k", []byte("first"), blob.PutOptions{})
		b := MustPut(t, s, "k", []byte("second"), blob.PutOptions{})
		if a.ETag == b.ETag {
			t.Errorf("ETag %q unchanged by new content", a.ETag)
		}
		if got, _ := MustGet(t, s, "k"); string(got) != "second" {
			t.Errorf("get = %q", got)
		}
	})
	t.Run("not found", func(t *testing.T) {
		s := open(t)
		if _, _, err := s.Get(ctx, "missing/key"); !errors.Is(err, blob.ErrNotFound) {
			t.Errorf("get missing: %v, want ErrNotFound", err)
		}
		if _, err := s.Stat(ctx, "missing"); !errors.Is(err, blob.ErrNotFound) {
			t.Errorf("stat missing: %v, want ErrNotFound", err)
		}
		if err := s.Delete(ctx, "missing"); err != nil {
			t.Errorf("delete missing: %v", err)
		}
	})
	t.Run("delete", func(t *testing.T) {
		s := open(t)
		MustPut(t, s, "d/x", []byte("x"), blob.PutOptions{})
		MustPut(t, s, "d/y", []byte("y"), blob.PutOptions{})
		if err := s.Delete(ctx, "d/x"); err != nil {
			t.Fatalf("delete: %v", err)
		}
		if _, err := s.Stat(ctx, "d/x"); !errors.Is(err, blob.ErrNotFound) {
			t.Errorf("stat after delete: %v", err)
		}
		if keys := Keys(t, s, ""); !slices.Equal(keys, []string{"d/y"}) {
			t.Errorf("list after delete = %q", keys)
		}
	})
	t.Run("list", func(t *testing.T) {
		s := open(t)
		all := []string{"a-b", "a/1", "a/2", "a/b/3", "ab", "b"}
		for _, k := range slices.Backward(all) {
			MustPut(t, s, k, []byte(k), blob.PutOptions{})
		}
		for prefix, want := range map[string][]string{
			"":     all,
			"a/":   {"a/1", "a/2", "a/b/3"},
			"a":    {"a-b", "a/1", "a/2", "a/b/3", "ab"},
			"a/b":  {"a/b/3"},
			"a/b/": {"a/b/3"},
			"c":    nil,
			"c/d/": nil,
		} {
			if got := Keys(t, s, prefix); !slices.Equal(got, want) {
				t.Errorf("list %q = %q, want %q", prefix, got, want)
			}
		}
		for info, err := range s.List(ctx, "a/") {
			if err != nil || info.Key != "a/1" || info.Size != 3 || info.ETag == "" {
				t.Errorf("first listed = %+v, %v", info, err)
			}
			break // Stopping early must not leak or block.
		}
	})
	t.Run("if none match", func(t *testing.T) {
		s := open(t)
		MustPut(t, s, "m", []byte("one"), blob.PutOptions{IfNoneMatch: true})
		_, err := s.Put(ctx, "m", bytes.NewReader([]byte("two")), 3, blob.PutOptions{IfNoneMatch: true})
		if !errors.Is(err, blob.ErrPrecondition) {
			t.Errorf("second create: %v, want ErrPrecondition", err)
		}
		if got, _ := MustGet(t, s, "m"); string(got) != "one" {
			t.Errorf("after a lost create the object holds %q", got)
		}
	})
	t.Run("if match", func(t *testing.T) {
		s := open(t)
		v1 := MustPut(t, s, "m", []byte("v1"), blob.PutOptions{})
		v2 := MustPut(t, s, "m", []byte("v2"), blob.PutOptions{IfMatch: v1.ETag})
		_, err := s.Put(ctx, "m", bytes.NewReader([]byte("v3")), 2, blob.PutOptions{IfMatch: v1.ETag})
		if !errors.Is(err, blob.ErrPrecondition) {
			t.Errorf("put with a stale ETag: %v, want ErrPrecondition", err)
		}
		if got, info := MustGet(t, s, "m"); string(got) != "v2" || info.ETag != v2.ETag {
			t.Errorf("object holds %q (%s), want v2 (%s)", got, info.ETag, v2.ETag)
		}
		_, err = s.Put(ctx, "other", bytes.NewReader([]byte("x")), 1, blob.PutOptions{IfMatch: v2.ETag})
		if !errors.Is(err, blob.ErrPrecondition) {
			t.Errorf("if-match on a missing key: %v, want ErrPrecondition", err)
		}
		if _, err := s.Stat(ctx, "other"); !errors.Is(err, blob.ErrNotFound) {
			t.Errorf("a failed if-match created the object: %v", err)
		}
	})
	t.Run("conditional race", func(t *testing.T) {
		s := open(t)
		v0 := MustPut(t, s, "base", []byte("v0"), blob.PutOptions{})
		for name, opts := range map[string]blob.PutOptions{
			"create": {IfNoneMatch: true},
			"update": {IfMatch: v0.ETag},
		} {
			key := map[string]string{"create": "new", "update": "base"}[name]
			var wins atomic.Int32
			var wg sync.WaitGroup
			for i := range 8 {
				wg.Go(func() {
					body := []byte("writer " + strconv.Itoa(i))
					_, err := s.Put(ctx, key, bytes.NewReader(body), int64(len(body)), opts)
					switch {
					case err == nil:
						wins.Add(1)
					case !errors.Is(err, blob.ErrPrecondition):
						t.Errorf("%s: writer %d: %v, want ErrPrecondition", name, i, err)
					}
				})
			}
			wg.Wait()
			if n := wins.Load(); n != 1 {
				t.Errorf("%s: %d of 8 conditional writers won, want exactly 1", name, n)
			}
		}
	})
	t.Run("failed reader", func(t *testing.T) {
		s := open(t)
		MustPut(t, s, "keep", []byte("old"), blob.PutOptions{})
		for name, reader := range map[string]func() io.Reader{
			"error": func() io.Reader { return io.MultiReader(bytes.NewReader(Random(100<<10)), errReader{}) },
			"short": func() io.Reader { return bytes.NewReader(Random(500)) },
		} {
			for _, key := range []string{"keep", "fresh-" + name} {
				_, err := s.Put(ctx, key, reader(), 200<<10, blob.PutOptions{})
				if err == nil {
					t.Errorf("%s: put %s with a failing reader succeeded", name, key)
				}
			}
			if _, err := s.Stat(ctx, "fresh-"+name); !errors.Is(err, blob.ErrNotFound) {
				t.Errorf("%s: a failed put created the object: %v", name, err)
			}
		}
		if got, _ := MustGet(t, s, "keep"); string(got) != "old" {
			t.Errorf("a failed put replaced the object with %d bytes", len(got))
		}
	})
	t.Run("invalid keys", func(t *testing.T) {
		s := open(t)
		for _, key := range []string{"", "/a", "a/", "a//b", "a/../b", "./a", "..", ".atrium/x", "a\x00b"} {
			if _, err := s.Put(ctx, key, bytes.NewReader(nil), 0, blob.PutOptions{}); !errors.Is(err, blob.ErrInvalidKey) {
				t.Errorf("put %q: %v, want ErrInvalidKey", key, err)
			}
			if _, _, err := s.Get(ctx, key); !errors.Is(err, blob.ErrInvalidKey) {
				t.Errorf("get %q: %v, want ErrInvalidKey", key, err)
			}
			if _, err := s.Stat(ctx, key); !errors.Is(err, blob.ErrInvalidKey) {
				t.Errorf("stat %q: %v, want ErrInvalidKey", key, err)
			}
			if err := s.Delete(ctx, key); !errors.Is(err, blob.ErrInvalidKey) {
				t.Errorf("delete %q: %v, want ErrInvalidKey", key, err)
			}
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		s := open(t)
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := s.Put(cctx, "c", bytes.NewReader([]byte("x")), 1, blob.PutOptions{}); !errors.Is(err, context.Canceled) {
			t.Errorf("put with a cancelled context: %v, want context.Canceled", err)
		}
		if _, err := s.Stat(ctx, "c"); !errors.Is(err, blob.ErrNotFound) {
			t.Errorf("a cancelled put created the object: %v", err)
		}
	})
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("reader broke") }

// Random returns n random bytes.
func Random(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// MustPut stores data at key or fails the test.
func MustPut(tb testing.TB, s blob.Store, key string, data []byte, opts blob.PutOptions) blob.Info {
	tb.Helper()
	info, err := s.Put(context.Background(), key, bytes.NewReader(data), int64(len(data)), opts)
	if err != nil {
		tb.Fatalf("put %s: %v", key, err)
	}
	return info
}

// MustGet reads the object at key or fails the test.
func MustGet(tb testing.TB, s blob.Store, key string) ([]byte, blob.Info) {
	tb.Helper()
	r, info, err := s.Get(context.Background(), key)
	if err != nil {
		tb.Fatalf("get %s: %v", key, err)
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		tb.Fatalf("read %s: %v", key, err)
	}
	return b, info
}

// Keys lists the keys under prefix or fails the test.
func Keys(tb testing.TB, s blob.Store, prefix string) []string {
	tb.Helper()
	var keys []string
	for info, err := range s.List(context.Background(), prefix) {
		if err != nil {
			tb.Fatalf("list %q: %v", prefix, err)
		}
		keys = append(keys, info.Key)
	}
	return keys
}

// S3Server is a versitygw process serving S3 on a local port, backed by a
// temporary directory. Stop and Start make the service unavailable and
// bring it back with the same data, endpoint and credentials.
type S3Server struct {
	// Endpoint is host:port of the server.
	Endpoint string
	// AccessKey and SecretKey are random root credentials.
	AccessKey, SecretKey string
	// Bucket exists on the server.
	Bucket string
	// Dir is the posix directory holding the buckets.
	Dir string

	tb     testing.TB
	bin    string
	mu     sync.Mutex
	cmd    *exec.Cmd     // guarded by mu; nil while stopped
	exited chan struct{} // guarded by mu; closed when cmd has been waited for
	out    *syncBuffer
}

// StartS3 starts versitygw on 127.0.0.1 with a random free port, a
// temporary posix directory, random credentials and one bucket, waits until
// it serves requests, and stops it when the test ends. It fails the test if
// versitygw is not installed, saying how to install it.
func StartS3(tb testing.TB) *S3Server {
	tb.Helper()
	return StartS3On(tb, "127.0.0.1")
}

// StartS3On is StartS3 listening on host, for tests whose clients reach the
// server from a network namespace they created.
func StartS3On(tb testing.TB, host string) *S3Server {
	tb.Helper()
	bin, err := findVersitygw()
	if err != nil {
		tb.Fatal(err)
	}
	s := &S3Server{
		AccessKey: "ak" + randomHex(8),
		SecretKey: randomHex(20),
		Bucket:    "atrium-test",
		Dir:       tb.TempDir(),
		tb:        tb,
		bin:       bin,
		out:       &syncBuffer{},
	}
	tb.Cleanup(s.Stop)
	for attempt := 0; ; attempt++ {
		port, err := freePort(host)
		if err != nil {
			tb.Fatalf("start versitygw: %v", err)
		}
		s.Endpoint = net.JoinHostPort(host, strconv.Itoa(port))
		if err := s.start(); err == nil {
			break
		} else if attempt == 2 {
			tb.Fatalf("start versitygw: %v\n%s", err, s.out.String())
		}
	}
	st, err := blob.OpenS3(context.Background(), blob.S3Config{
		Endpoint: s.Endpoint, Bucket: s.Bucket, AccessKey: s.AccessKey, SecretKey: s.SecretKey, CreateBucket: true,
	})
	if err != nil {
		tb.Fatalf("create bucket %s: %v", s.Bucket, err)
	}
	st.Close()
	return s
}

// Config returns a configuration for the server's bucket, with prefix (""
// or ending in "/") in front of every key.
func (s *S3Server) Config(prefix string) blob.S3Config {
	return blob.S3Config{
		Endpoint: s.Endpoint, Bucket: s.Bucket, Prefix: prefix,
		AccessKey: s.AccessKey, SecretKey: s.SecretKey,
	}
}

// Open returns a store on the server's bucket with keys under prefix,
// closed when the test ends.
func (s *S3Server) Open(tb testing.TB, prefix string) *blob.S3 {
	tb.Helper()
	st, err := blob.OpenS3(context.Background(), s.Config(prefix))
	if err != nil {
		tb.Fatalf("open s3 store: %v", err)
	}
	tb.Cleanup(func() { st.Close() })
	return st
}

// Stop kills the server and waits for it to exit; the endpoint then
// refuses connections. Stop is safe to call twice.
func (s *S3Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.exited
	s.cmd = nil
}

// Start restarts a stopped server on the same endpoint with the same data,
// and waits until it serves requests.
func (s *S3Server) Start() {
	s.tb.Helper()
	if err := s.start(); err != nil {
		s.tb.Fatalf("restart versitygw: %v\n%s", err, s.out.String())
	}
}

func (s *S3Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return nil
	}
	cmd := exec.Command(s.bin, "--port", s.Endpoint, "--quiet", "posix", s.Dir)
	// Credentials travel in the environment, not on the command line.
	cmd.Env = append(os.Environ(), "ROOT_ACCESS_KEY_ID="+s.AccessKey, "ROOT_SECRET_ACCESS_KEY="+s.SecretKey)
	cmd.Stdout, cmd.Stderr = s.out, s.out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() { // Owned by Stop, which waits for exited.
		cmd.Wait()
		close(exited)
	}()
	s.cmd, s.exited = cmd, exited
	if err := waitReady(s.Endpoint, exited); err != nil {
		cmd.Process.Signal(syscall.SIGKILL)
		<-exited
		s.cmd = nil
		return err
	}
	return nil
}

// waitReady polls the endpoint until it answers HTTP, the process exits, or
// 15 seconds pass.
func waitReady(endpoint string, exited <-chan struct{}) error {
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: time.Second}
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := client.Get("http://" + endpoint + "/")
		if err == nil {
			resp.Body.Close()
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("versitygw exited before serving %s", endpoint)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("versitygw did not serve %s within 15s: %w", endpoint, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// findVersitygw looks for the versitygw binary in PATH, GOBIN and
// GOPATH/bin.
func findVersitygw() (string, error) {
	if p, err := exec.LookPath("versitygw"); err == nil {
		return p, nil
	}
	var dirs []string
	if d := os.Getenv("GOBIN"); d != "" {
		dirs = append(dirs, d)
	}
	gopath := os.Getenv("GOPATH")
	if gopath == "" {
		if home, err := os.UserHomeDir(); err == nil {
			gopath = filepath.Join(home, "go")
		}
	}
	for _, d := range filepath.SplitList(gopath) {
		dirs = append(dirs, filepath.Join(d, "bin"))
	}
	for _, d := range dirs {
		p := filepath.Join(d, "versitygw")
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", errors.New("versitygw (the S3 server the object-store tests run) is not installed: run .ci/deps, " +
		"or go install github.com/versity/versitygw/cmd/versitygw@v1.8.0")
}

func freePort(host string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func randomHex(n int) string {
	return hex.EncodeToString(Random(n))
}

// syncBuffer collects the server's output for failure messages.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer // guarded by mu
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.buf.Len() > 1<<20 {
		return len(p), nil
	}
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
