package modelgw_test

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/atriumhq/atrium/compute/modelgw"
)

// The benchmarks compare a client talking to an upstream directly with the
// same client going through the gateway, all on loopback in one process
// (docs/benchmarks.md, "Model gateway"). Each reports its own metrics:
//
//   - TTFB: time from sending a request to its first answer byte (p50).
//   - ChunkLatency: time from the upstream writing a streamed chunk to the
//     client reading it, chunks paced 1 ms apart (p50, p99).
//   - Stream: 1 MiB streamed as 4 KiB SSE events as fast as possible;
//     process CPU per MiB (client and upstream included: compare the two).

// benchUpstream streams n SSE events per request. Each event carries the
// time it was written (ns since the Unix epoch), padded to size bytes;
// events are paced every pace (0: no pause).
func benchUpstream(tb testing.TB, n, size int, pace time.Duration) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		pad := strings.Repeat("x", max(0, size-80))
		io.WriteString(w, `event: message_start`+"\n"+`data: {"type":"message_start","message":{"model":"m","usage":{"input_tokens":10,"output_tokens":1}}}`+"\n\n")
		f.Flush()
		for i := 0; i < n; i++ {
			if pace > 0 {
				time.Sleep(pace)
			}
			fmt.Fprintf(w, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"t\":%d,\"p\":\"%s\"}\n\n", time.Now().UnixNano(), pad)
			f.Flush()
		}
		io.WriteString(w, `event: message_delta`+"\n"+`data: {"type":"message_delta","usage":{"output_tokens":`+strconv.Itoa(n)+`}}`+"\n\n")
	}))
	tb.Cleanup(srv.Close)
	return srv
}

// benchTargets returns the direct URL and the gateway's URL for upstream,
// and a token.
func benchTargets(b *testing.B, upstream string) (direct, via, token string) {
	gw, err := modelgw.New(modelgw.Config{Providers: []modelgw.Provider{
		{Name: "a", Kind: modelgw.KindAnthropic, BaseURL: upstream, APIKey: "k"}}})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(gw)
	b.Cleanup(srv.Close)
	tok := gw.Issue("bench", "")
	gw.Activate(tok, 1, "u")
	return upstream + "/v1/messages", srv.URL + "/anthropic/v1/messages", tok
}

func benchPost(b *testing.B, url, token string) *http.Response {
	req, _ := http.NewRequest("POST", url, strings.NewReader(`{"model":"m","stream":true}`))
	req.Header.Set("x-api-key", token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	if resp.StatusCode != 200 {
		b.Fatalf("status %d", resp.StatusCode)
	}
	return resp
}

func percentile(d []time.Duration, p float64) time.Duration {
	slices.Sort(d)
	return d[min(len(d)-1, int(float64(len(d))*p))]
}

func BenchmarkGateway_TTFB(b *testing.B) {
	up := benchUpstream(b, 1, 100, 0)
	direct, via, tok := benchTargets(b, up.URL)
	for _, c := range []struct{ name, url string }{{"direct", direct}, {"gateway", via}} {
		b.Run(c.name, func(b *testing.B) {
			var ttfb []time.Duration
			for b.Loop() {
				start := time.Now()
				resp := benchPost(b, c.url, tok)
				var one [1]byte
				if _, err := io.ReadFull(resp.Body, one[:]); err != nil {
					b.Fatal(err)
				}
				ttfb = append(ttfb, time.Since(start))
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			b.ReportMetric(float64(percentile(ttfb, 0.5).Microseconds()), "ttfb-p50-µs")
			b.ReportMetric(float64(percentile(ttfb, 0.99).Microseconds()), "ttfb-p99-µs")
		})
	}
}

func BenchmarkGateway_ChunkLatency(b *testing.B) {
	const chunks = 200
	up := benchUpstream(b, chunks, 100, time.Millisecond)
	direct, via, tok := benchTargets(b, up.URL)
	for _, c := range []struct{ name, url string }{{"direct", direct}, {"gateway", via}} {
		b.Run(c.name, func(b *testing.B) {
			var lat []time.Duration
			for b.Loop() {
				resp := benchPost(b, c.url, tok)
				sc := bufio.NewScanner(resp.Body)
				for sc.Scan() {
					line := sc.Text()
					i := strings.Index(line, `"t":`)
					if i < 0 {
						continue
					}
					j := strings.IndexByte(line[i+4:], ',')
					ns, err := strconv.ParseInt(line[i+4:i+4+j], 10, 64)
					if err != nil {
						b.Fatal(err)
					}
					lat = append(lat, time.Since(time.Unix(0, ns)))
				}
				resp.Body.Close()
			}
			b.ReportMetric(float64(percentile(lat, 0.5).Microseconds()), "chunk-p50-µs")
			b.ReportMetric(float64(percentile(lat, 0.99).Microseconds()), "chunk-p99-µs")
		})
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func BenchmarkGateway_Stream(b *testing.B) {
	const size, chunks = 4096, 256 // 1 MiB per request
	up := benchUpstream(b, chunks, size, 0)
	direct, via, tok := benchTargets(b, up.URL)
	for _, c := range []struct{ name, url string }{{"direct", direct}, {"gateway", via}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(size * chunks)
			cpu0 := cpuTime()
			for b.Loop() {
				resp := benchPost(b, c.url, tok)
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			cpu := cpuTime() - cpu0
			b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "cpu-ms/MiB")
		})
	}
}
