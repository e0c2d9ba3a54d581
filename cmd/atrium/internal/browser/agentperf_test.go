package browser

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/performance"
	"github.com/chromedp/chromedp"

	"github.com/atriumhq/atrium/session"
)

// TestBrowser_LargeAgentSession opens a session page whose log holds
// 50,000 events of an agent's turns, 5,000 of them tool calls (each with a
// diff or output) and 5,000 their updates, and logs how long the latest
// event took to be in view (never a pass/fail figure; docs/benchmarks.md
// records it). The server's log holds the session's real events; the agent
// events are handed to the page through its own socket (as in
// TestBrowser_AgentTimeline), in frames of 500 as a resume's catch-up
// would bring them, while the page is open: so the figure is the page's
// work (model, rows, markdown, diffs), not the server's, which
// TestBrowser_LargeSession measures. Then it measures the main thread's
// busy share while 50 deltas a second stream into a message.
func TestBrowser_LargeAgentSession(t *testing.T) {
	t.Parallel()
	st := startStack(t)
	s := st.create("alice", "fifty thousand agent events", "shell")
	var info session.Session
	st.api("alice", 200, "GET", "/v1/sessions/"+string(s.ID), nil, &info)
	alice := st.open("alice")
	alice.tapWS()
	alice.openSession(s.ID)
	alice.waitJS("the tapped socket", `window.__atriumWS && window.__atriumWS.readyState === 1`)

	// 50 deltas a second for 4 seconds into one message, and the main
	// thread's busy share meanwhile: Chromium's own count of task time
	// (the DevTools Performance domain's TaskDuration), over wall time.
	alice.do(chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdp.Call(ctx, t, performance.Enable, performance.EnableParams{})
		return err
	}))
	// TaskDuration is wall time and grows when the machine is busy and the
	// renderer waits for a core; ThreadTime is the main thread's CPU time,
	// which does not. Both are logged.
	metrics := func() (task, thread float64) {
		alice.do(chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
			res, err := cdp.Call(ctx, t, performance.GetMetrics, cdp.Empty{})
			for _, m := range res.Metrics {
				switch m.Name {
				case "TaskDuration":
					task = m.Value
				case "ThreadTime":
					thread = m.Value
				}
			}
			return err
		}))
		return task, thread
	}
	const stream = `((id) => new Promise((resolve) => {
		const ws = window.__atriumWS;
		let n = 0;
		const t0 = performance.now();
		const tick = setInterval(() => {
			ws.onmessage({ data: JSON.stringify({ type: 'delta', turn: 9999, message_id: id, text: 'word '.repeat(8) + (n % 10 === 9 ? '\n\n' : '') }) });
			if (++n === 200) {
				clearInterval(tick);
				requestAnimationFrame(() => requestAnimationFrame(() => resolve({ n, ms: performance.now() - t0, chars: document.querySelector('#live').textContent.length })));
			}
		}, 20);
	}))`
	type streamed struct {
		N     int     `json:"n"`
		MS    float64 `json:"ms"`
		Chars int     `json:"chars"`
	}
	measureStream := func(where, id string) {
		task0, cpu0 := metrics()
		wall := time.Now()
		sm := eval[streamed](alice, stream+"("+jsString(id)+")")
		task1, cpu1 := metrics()
		busy, cpu, secs := task1-task0, cpu1-cpu0, time.Since(wall).Seconds()
		t.Logf("streaming on %s: %d deltas in %.0f ms (%.0f/s), %d characters shown; main thread busy %.0f ms of %v (%.1f%%), its CPU time %.0f ms (%.1f%%)",
			where, sm.N, sm.MS, float64(sm.N)/(sm.MS/1000), sm.Chars, busy*1000, time.Since(wall).Round(time.Millisecond), 100*busy/secs, cpu*1000, 100*cpu/secs)
		if sm.Chars < 1000 {
			t.Fatalf("the streamed message shows %d characters", sm.Chars)
		}
	}
	measureStream("a new session's page", "perf-1")
	// A fresh page (the streamed message stays at the bottom until its
	// durable message comes, which it never will here).
	alice.openSession(s.ID)
	alice.waitJS("the tapped socket", `window.__atriumWS && window.__atriumWS.readyState === 1`)

	// Build the events in the page (sending 50,000 over DevTools one by one
	// would measure DevTools), then hand them to the socket's handler and
	// time until the latest row is in view.
	const build = `(() => {
		const evs = [];
		let seq = %d, turn = 0;
		const t0 = Date.parse('2026-01-01T00:00:00Z');
		const ev = (kind, data, by = 'system') => { seq++; evs.push({ seq, epoch: 'test', time: new Date(t0 + seq * 1000).toISOString(), kind, by, data }); };
		const old = Array.from({ length: 40 }, (_, i) => 'line ' + i).join('\n');
		while (evs.length < 50000 - 10) {
			turn++;
			ev('message', { text: 'step ' + turn, client_id: '' }, 'alice');
			ev('turn_started', { turn, prompt_seq: seq });
			// Nine events per tool call: over 5,000 tool calls in 50,000 events.
			for (let i = 0; i < 10 && evs.length < 50000 - 10; i++) {
				const id = 'c' + turn + '-' + i;
				const content = i %% 2
					? [{ type: 'diff', path: 'pkg/file' + i + '.go', old_text: old, new_text: old.replace('line 7', 'line seven') + '\nadded' }]
					: [{ type: 'content', content: { type: 'text', text: Array.from({ length: 60 }, (_, k) => 'out ' + k).join('\n') } }];
				ev('tool_call', { turn, id, title: 'Tool ' + id, kind: i %% 2 ? 'edit' : 'execute', status: 'in_progress', content, locations: [] });
				ev('agent_thought', { turn, text: 'thinking about ' + id });
				for (let k = 0; k < 4; k++) ev('output', { turn, stream: 'stdout', text: 'x ' + k + '\n' });
				ev('tool_call_update', { turn, id, status: 'completed' });
				ev('agent_message', { turn, message_id: 't' + turn + '-m' + i, text: '## Step ' + i + '\n\nDone with **' + id + '**.\n\n` + "```" + `\ncode()\n` + "```" + `' });
				ev('usage', { turn, model: 'm', input_tokens: 1000, output_tokens: 100, cached_tokens: 0, cost_usd: 0.001 });
			}
			ev('plan', { turn, entries: [{ content: 'a', status: 'completed', priority: 'high' }, { content: 'b', status: 'in_progress', priority: 'low' }] });
			ev('turn_finished', { turn, status: 'ok', exit_code: 0, duration_ms: 1000 });
		}
		window.__evs = evs;
		return { n: evs.length, tools: evs.filter((e) => e.kind === 'tool_call').length, last: seq };
	})()`
	type built struct {
		N     int   `json:"n"`
		Tools int   `json:"tools"`
		Last  int64 `json:"last"`
	}
	b := eval[built](alice, fmt.Sprintf(build, info.LastSeq))
	if b.Tools < 5000 {
		t.Fatalf("built %d events with %d tool calls, want 5,000", b.N, b.Tools)
	}
	// The frames are encoded before the clock starts (a socket hands the
	// page strings); perTask delivers one frame per task, as a socket
	// does, instead of all of them in one task.
	const feed = `((perTask) => new Promise((resolve) => {
		const evs = window.__evs, ws = window.__atriumWS, last = evs[evs.length - 1].seq;
		const frames = [];
		for (let i = 0; i < evs.length; i += 500) frames.push(JSON.stringify({ type: 'events', events: evs.slice(i, i + 500) }));
		const start = performance.now();
		let fed = 0;
		if (perTask) {
			const ch = new MessageChannel();
			let i = 0;
			ch.port1.onmessage = () => {
				ws.onmessage({ data: frames[i++] });
				if (i < frames.length) ch.port2.postMessage(0);
				else fed = performance.now() - start;
			};
			ch.port2.postMessage(0);
		} else {
			for (const f of frames) ws.onmessage({ data: f });
			fed = performance.now() - start;
		}
		const check = () => {
			const r = document.querySelector('#rows > .ev[data-seq="' + last + '"]');
			const tl = document.querySelector('#timeline').getBoundingClientRect();
			if (r) {
				const a = r.getBoundingClientRect();
				if (a.top < tl.bottom && a.bottom > tl.top) return resolve({ fed, inView: performance.now() - start, rows: document.querySelectorAll('#rows > .ev').length });
			}
			requestAnimationFrame(check);
		};
		check();
	}))`
	type timing struct {
		Fed    float64 `json:"fed"`
		InView float64 `json:"inView"`
		Rows   int     `json:"rows"`
	}
	tm := eval[timing](alice, feed+"(false)")
	t.Logf("%d agent events (%d tool calls), 100 frames in one task: handled in %.0f ms; the latest in view after %.0f ms; %d rows in the document",
		b.N, b.Tools, tm.Fed, tm.InView, tm.Rows)
	if tm.Rows > maxRows {
		t.Fatalf("%d rows in the document, want at most %d", tm.Rows, maxRows)
	}
	// The same on a fresh page, one frame per task as a socket delivers them.
	alice.openSession(s.ID)
	alice.waitJS("the tapped socket", `window.__atriumWS && window.__atriumWS.readyState === 1`)
	eval[built](alice, fmt.Sprintf(build, info.LastSeq))
	tm = eval[timing](alice, feed+"(true)")
	t.Logf("same, one frame per task: handled in %.0f ms; the latest in view after %.0f ms; %d rows in the document",
		tm.Fed, tm.InView, tm.Rows)
	if tm.Rows > maxRows {
		t.Fatalf("%d rows in the document, want at most %d", tm.Rows, maxRows)
	}
	// The rows above the tail are filled in after the first paint, up to
	// the opening window (timeline.js INITIAL).
	alice.waitJS("the rows above the tail", `document.querySelectorAll('#rows > .ev').length >= 150`)

	measureStream("the page of 50,000 agent events", "perf-2")

	// Opening such a session reads its latest 200 events (the page's first
	// read, session.js PAGE) and renders them: the page's share of the
	// open, on a fresh page, with 200 events of the same mix.
	alice.openSession(s.ID)
	alice.waitJS("the tapped socket", `window.__atriumWS && window.__atriumWS.readyState === 1`)
	eval[built](alice, fmt.Sprintf(build, info.LastSeq))
	eval[bool](alice, `(() => { window.__evs = window.__evs.slice(0, 200); return true; })()`)
	open := eval[timing](alice, feed+"(false)")
	t.Logf("opening at the live end: the latest of 200 events (the page's first read) in view after %.0f ms", open.InView)
}
