package blob_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/atriumhq/atrium/storage/blob"
	"github.com/atriumhq/atrium/storage/blob/blobtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestDir(t *testing.T) {
	blobtest.TestStore(t, func(t *testing.T) blob.Store {
		return &blob.Dir{Path: filepath.Join(t.TempDir(), "store")}
	})
}

func TestS3(t *testing.T) {
	srv := blobtest.StartS3(t)
	var n atomic.Int32
	blobtest.TestStore(t, func(t *testing.T) blob.Store {
		// Each subtest gets its own prefix of the one bucket.
		return srv.Open(t, fmt.Sprintf("t%d/", n.Add(1)))
	})
}

func TestS3_Unavailable(t *testing.T) {
	srv := blobtest.StartS3(t)
	s := srv.Open(t, "")
	ctx := context.Background()
	blobtest.MustPut(t, s, "k", []byte("v"), blob.PutOptions{})
	srv.Stop()
	start := time.Now()
	_, err := s.Stat(ctx, "k")
	if !errors.Is(err, blob.ErrUnavailable) || !strings.Contains(err.Error(), srv.Endpoint) {
		t.Errorf("stat with the server stopped: %v, want ErrUnavailable naming %s", err, srv.Endpoint)
	}
	t.Logf("stat failed after %v: %v", time.Since(start), err)
	_, err = s.Put(ctx, "k", bytes.NewReader([]byte("new")), 3, blob.PutOptions{})
	if !errors.Is(err, blob.ErrUnavailable) {
		t.Errorf("put with the server stopped: %v, want ErrUnavailable", err)
	}
	srv.Start()
	if got, _ := blobtest.MustGet(t, s, "k"); string(got) != "v" {
		t.Errorf("after a restart the object holds %q", got)
	}
}

func TestS3_Presign(t *testing.T) {
	srv := blobtest.StartS3(t)
	s := srv.Open(t, "p/")
	ctx := context.Background()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()

	put, err := s.PresignPut(ctx, "up", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	data := blobtest.Random(100 << 10)
	req, _ := http.NewRequest(http.MethodPut, put, bytes.NewReader(data))
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("PUT to a presigned URL: %s", resp.Status)
	}
	if got, _ := blobtest.MustGet(t, s, "up"); !bytes.Equal(got, data) {
		t.Error("the object uploaded through a presigned URL differs")
	}

	get, err := s.PresignGet(ctx, "up", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	resp, err = client.Get(get)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !bytes.Equal(got, data) {
		t.Errorf("GET of a presigned URL: %s, %d bytes", resp.Status, len(got))
	}
	// A URL grants its key only.
	other := strings.Replace(get, "/p/up?", "/p/other?", 1)
	if resp, err := client.Get(other); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("GET of another key with a presigned URL: %v %v, want 403", resp.Status, err)
	} else {
		resp.Body.Close()
	}
}

func TestOpenS3_Errors(t *testing.T) {
	srv := blobtest.StartS3(t)
	ctx := context.Background()
	cfg := srv.Config("")
	cfg.Bucket = "missing-bucket"
	if _, err := blob.OpenS3(ctx, cfg); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("open with a missing bucket: %v", err)
	}
	cfg.CreateBucket = true
	s, err := blob.OpenS3(ctx, cfg)
	if err != nil {
		t.Fatalf("open with CreateBucket: %v", err)
	}
	s.Close()
	cfg = srv.Config("")
	cfg.SecretKey = "wrong"
	if _, err := blob.OpenS3(ctx, cfg); err == nil || !strings.Contains(err.Error(), "access denied") {
		t.Errorf("open with a wrong secret: %v", err)
	}
	cfg = srv.Config("no-slash")
	if _, err := blob.OpenS3(ctx, cfg); err == nil {
		t.Error("open with a prefix without a trailing slash succeeded")
	}
	cfg = srv.Config("")
	cfg.Endpoint = "http://" + cfg.Endpoint
	if _, err := blob.OpenS3(ctx, cfg); err == nil || !strings.Contains(err.Error(), "without a scheme") {
		t.Errorf("open with a URL as endpoint: %v", err)
	}
}

func TestDir_CrashLeftovers(t *testing.T) {
	d := &blob.Dir{Path: t.TempDir()}
	blobtest.MustPut(t, d, "a/b", []byte("x"), blob.PutOptions{})
	// A crash mid-Put leaves a temporary file: it is no object.
	tmp := filepath.Join(d.Path, ".atrium", "tmp", "put-123")
	if err := os.WriteFile(tmp, []byte("partial"), 0o600); err != nil {
		t.Fatal(err)
	}
	if keys := blobtest.Keys(t, d, ""); len(keys) != 1 || keys[0] != "a/b" {
		t.Errorf("list = %q, want [a/b]", keys)
	}
	// Another Dir value over the same path sees the same objects and
	// honours conditions set through the first.
	d2 := &blob.Dir{Path: d.Path}
	info, err := d2.Stat(context.Background(), "a/b")
	if err != nil {
		t.Fatal(err)
	}
	blobtest.MustPut(t, d, "a/b", []byte("y"), blob.PutOptions{IfMatch: info.ETag})
	if _, err := d2.Put(context.Background(), "a/b", bytes.NewReader(nil), 0, blob.PutOptions{IfMatch: info.ETag}); !errors.Is(err, blob.ErrPrecondition) {
		t.Errorf("stale if-match through a second Dir: %v", err)
	}
}

func TestDir_DeleteRemovesEmptyDirs(t *testing.T) {
	d := &blob.Dir{Path: t.TempDir()}
	blobtest.MustPut(t, d, "x/y/z", []byte("1"), blob.PutOptions{})
	if err := d.Delete(context.Background(), "x/y/z"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(d.Path, "x")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("empty key directories left behind: %v", err)
	}
	// A key cannot also be a directory of keys.
	blobtest.MustPut(t, d, "x", []byte("1"), blob.PutOptions{})
	if _, err := d.Put(context.Background(), "x/y", bytes.NewReader(nil), 0, blob.PutOptions{}); err == nil {
		t.Error("put under an object's key succeeded")
	}
}

// TestS3_LargeConditional writes a conditional object larger than the part
// size: it must go as one request, so that the condition holds.
func TestS3_LargeConditional(t *testing.T) {
	srv := blobtest.StartS3(t)
	cfg := srv.Config("")
	cfg.PartSize = 5 << 20
	s, err := blob.OpenS3(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	data := blobtest.Random(6 << 20)
	blobtest.MustPut(t, s, "big", data, blob.PutOptions{IfNoneMatch: true})
	_, err = s.Put(context.Background(), "big", bytes.NewReader(data), int64(len(data)), blob.PutOptions{IfNoneMatch: true})
	if !errors.Is(err, blob.ErrPrecondition) {
		t.Errorf("second create of a %d MiB object: %v, want ErrPrecondition", len(data)>>20, err)
	}
	// Of unknown size, a conditional write must fit one part.
	_, err = s.Put(context.Background(), "unknown", struct{ io.Reader }{bytes.NewReader(data)}, -1, blob.PutOptions{IfNoneMatch: true})
	if err == nil || !strings.Contains(err.Error(), "pass the size") {
		t.Errorf("conditional write of unknown size over one part: %v", err)
	}
}
