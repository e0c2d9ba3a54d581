package gateway_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/atriumhq/atrium/session"
	"github.com/coder/websocket"
)

// BenchmarkIdleWatchers measures what an idle WebSocket watcher costs the
// gateway: it opens idleWatchers connections to one session from a child
// process (so the clients' memory is not counted), waits until every client
// has its hello and the presence frame that lists them all, and reports the
// gateway process's RSS growth and Go heap+stack growth per connection.
//
//	go test -run '^$' -bench IdleWatchers -benchtime 1x ./gateway
func BenchmarkIdleWatchers(b *testing.B) {
	const idleWatchers = 1000
	if os.Getenv("GATEWAY_HEAP_PROFILE") != "" {
		runtime.MemProfileRate = 1
	}
	e := newEnv(b)
	s := e.create("alice", "idle")
	url := wsURL(e.srv.URL, s.ID, 1)

	rssBefore, heapBefore := memory(b)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperIdleClients$", "-test.count=1")
	cmd.Env = append(os.Environ(), "GATEWAY_IDLE_URL="+url, "GATEWAY_IDLE_N="+strconv.Itoa(idleWatchers))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		stdin.Close()
		_ = cmd.Wait()
	}()
	sc := bufio.NewScanner(stdout)
	ready := false
	for !ready && sc.Scan() {
		ready = sc.Text() == "ready"
	}
	if !ready {
		b.Fatal("helper process did not get ready")
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }() // owned by cmd: ends when the child exits.
	if got := metric(b, e.reg, "atrium_gateway_watchers"); got != idleWatchers {
		b.Fatalf("%v watchers, want %d", got, idleWatchers)
	}
	rssAfter, heapAfter := memory(b)
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b.Logf("stack in use %d, heap in use %d, goroutines %d", ms.StackInuse, ms.HeapInuse, runtime.NumGoroutine())
	if f := os.Getenv("GATEWAY_HEAP_PROFILE"); f != "" {
		w, _ := os.Create(f)
		_ = pprof.WriteHeapProfile(w)
		w.Close()
	}
	b.ReportMetric(float64(rssAfter-rssBefore)/idleWatchers, "rss-B/conn")
	b.ReportMetric(float64(heapAfter-heapBefore)/idleWatchers, "heap+stack-B/conn")
}

// memory returns the process's RSS and Go heap+stack in use after a full GC.
func memory(tb testing.TB) (rss, heap uint64) {
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		tb.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			rss = kb << 10
		}
	}
	return rss, ms.HeapInuse + ms.StackInuse
}

// TestHelperIdleClients is the child process of BenchmarkIdleWatchers: it
// holds GATEWAY_IDLE_N WebSockets to GATEWAY_IDLE_URL, prints "ready" once
// each has seen a presence frame listing all of them, and closes them when
// its stdin closes.
func TestHelperIdleClients(t *testing.T) {
	url := os.Getenv("GATEWAY_IDLE_URL")
	if url == "" {
		t.Skip("helper process of BenchmarkIdleWatchers")
	}
	n, _ := strconv.Atoi(os.Getenv("GATEWAY_IDLE_N"))
	var wg sync.WaitGroup
	var mu sync.Mutex
	complete := 0 // guarded by mu
	all := make(chan struct{})
	conns := make([]*websocket.Conn, 0, n)
	for range n {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		c, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{
			HTTPHeader:   http.Header{"Authorization": {"Bearer dev:alice"}},
			Subprotocols: []string{session.Subprotocol},
		})
		cancel()
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		c.SetReadLimit(-1)
		conns = append(conns, c)
		wg.Go(func() {
			done := false
			for {
				_, b, err := c.Read(context.Background())
				if err != nil {
					return
				}
				var f session.PresenceFrame
				if !done && json.Unmarshal(b, &f) == nil && f.Type == session.FramePresence && len(f.Watchers) == n {
					done = true
					mu.Lock()
					if complete++; complete == n {
						close(all)
					}
					mu.Unlock()
				}
			}
		})
	}
	<-all
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	for _, c := range conns {
		_ = c.CloseNow()
	}
	wg.Wait()
}
