package browser

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/atriumhq/atrium/web"
)

// TestBrowser_Modules runs the UI's pure modules (ansi.js, model.js,
// markdown.js, agent.js) in Chromium, served by web.Handler alone, against
// cases whose answers are known. Each case is JavaScript that returns "" or what went wrong.
func TestBrowser_Modules(t *testing.T) {
	t.Parallel()
	mux := http.NewServeMux()
	mux.Handle("/", web.Handler())
	mux.HandleFunc("/blank", func(w http.ResponseWriter, r *http.Request) { // a page under the UI's policy, with no app
		w.Header().Set("Content-Security-Policy", web.CSP)
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write([]byte("<!doctype html><title>modules</title>"))
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	tb := &tab{t: t, user: "modules", base: srv.URL}
	ctx, cancel := chromedp.NewContext(chrome(t), chromedp.WithNewBrowserContext(), chromedp.WithListener(tb.listen))
	t.Cleanup(cancel)
	tb.ctx = ctx
	tb.attach()
	tb.do(chromedp.Navigate(srv.URL + "/blank"))

	cases := map[string]string{
		"ansi: colours, bold, reset and 256/24-bit colours": `
			const { parse } = await import('/js/ansi.js');
			const runs = parse('a\x1b[1;31mred\x1b[0m b \x1b[38;5;196mx\x1b[48;2;1;2;3my\x1b[m');
			const got = JSON.stringify(runs.map((r) => [r.text, r.style.fg, r.style.bg, r.style.bold]));
			const want = JSON.stringify([['a', null, null, false], ['red', 1, null, true], [' b ', null, null, false],
				['x', 'rgb(255, 0, 0)', null, false], ['y', 'rgb(255, 0, 0)', 'rgb(1, 2, 3)', false]]);
			return got === want ? '' : got;`,
		"ansi: other escapes dropped, carriage return redraws the line": `
			const { strip } = await import('/js/ansi.js');
			const got = strip('x\x1b[2K\x1b]0;title\x07y\r\nprogress 10%\rprogress 100%\ndone\x1b[');
			return got === 'xy\nprogress 100%\ndone' ? '' : JSON.stringify(got);`,
		"ansi: render makes spans with classes, never markup": `
			const { render } = await import('/js/ansi.js');
			const el = render(document.createElement('pre'), '<b>\x1b[32mok\x1b[0m</b>');
			const span = el.querySelector('span');
			if (el.querySelector('b')) return 'text became markup';
			if (!span || span.className !== 'a-f2' || el.textContent !== '<b>ok</b>') return el.outerHTML;
			const rgb = render(document.createElement('pre'), '\x1b[38;2;10;20;30mz').querySelector('span');
			return rgb && rgb.style.color === 'rgb(10, 20, 30)' ? '' : 'a 24-bit colour is not set through the CSSOM';`,
		"model: the state is exact from the first event": `
			const { Model } = await import('/js/model.js');
			const m = new Model(0, 'ready');
			const ev = (seq, kind, data, by = 'system') => ({ seq, kind, data, by, time: '2026-01-01T00:00:00Z' });
			m.add(ev(1, 'session_created', { title: 't' }, 'a'));
			m.add(ev(2, 'message', { text: 'one' }, 'a'));
			m.add(ev(3, 'turn_started', { turn: 1, prompt_seq: 2 }, 'a'));
			m.add(ev(4, 'message', { text: 'two' }, 'b'));
			m.add(ev(5, 'approval_requested', { turn: 1, id: 'x', summary: 's' }));
			if (!m.exact() || !m.running || m.running.turn !== 1 || m.running.approvals.size !== 1) return 'running turn 1 with an approval';
			if (m.pending.size !== 1 || !m.pending.has(4)) return 'prompt 4 queued';
			if (m.approvalState(1, 'x') !== 'pending') return 'approval pending';
			m.add(ev(6, 'approval_resolved', { turn: 1, id: 'x', allow: true }, 'b'));
			m.add(ev(7, 'turn_finished', { turn: 1, status: 'ok', exit_code: 0, duration_ms: 5 }));
			m.add(ev(8, 'turn_started', { turn: 2, prompt_seq: 4 }, 'b'));
			if (m.pending.size !== 0 || m.running.turn !== 2 || m.lastFinished.turn !== 1) return 'turn 2 runs, queue empty';
			if (m.approvalState(1, 'x') !== 'allowed' || m.resolution(1, 'x').by !== 'b') return 'approval allowed by b';
			return '';`,
		"model: a page that starts mid-turn is not exact until older events are read": `
			const { Model } = await import('/js/model.js');
			const ev = (seq, kind, data) => ({ seq, kind, data, by: 'system', time: '2026-01-01T00:00:00Z' });
			const m = new Model(10, '');
			m.add(ev(11, 'agent', { turn: 1, type: 'step' }));
			m.add(ev(12, 'approval_requested', { turn: 1, id: 'y', summary: 's' }));
			if (m.exact() || !m.running || !m.running.partial) return 'inexact, turn 1 partly known';
			const older = [ev(1, 'session_created', {}), ev(2, 'message', { text: 'go' }), ev(3, 'turn_started', { turn: 1, prompt_seq: 2 }),
				ev(4, 'message', { text: 'later' })];
			for (let s = 5; s <= 10; s++) older.push(ev(s, 'agent', { turn: 1, type: 'step' }));
			m.addOlder(older);
			if (!m.exact() || m.running.partial || m.running.approvals.size !== 1 || !m.pending.has(4)) return 'exact after reading back';
			return '';`,
		"model: a finished turn makes the queue exact without older events": `
			const { Model } = await import('/js/model.js');
			const ev = (seq, kind, data) => ({ seq, kind, data, by: 'system', time: '2026-01-01T00:00:00Z' });
			const m = new Model(100, '');
			m.add(ev(101, 'output', { turn: 7, stream: 'stdout', text: 'x' }));
			m.add(ev(102, 'turn_finished', { turn: 7, status: 'ok' }));
			m.add(ev(103, 'message', { text: 'next' }));
			return m.exact() && !m.running && m.pending.size === 1 ? '' : 'exact, idle, one queued';`,
		"markdown: headings, code, lists, tables and links become elements": `
			const { render } = await import('/js/markdown.js');
			const el = render('# Title\n\nSome *em* and **strong** and ` + "`code`" + `.\n\n` + "```go\\nfunc f() {}\\n```" + `\n\n- [x] done\n- [ ] todo\n\n| a | b |\n|---|--:|\n| 1 | 2 |\n\n[docs](https://example.com/x) &amp; &#x41;');
			const want = ['h3', 'em', 'strong', 'p code', 'pre.code code[data-lang="go"]', 'li.task input[type="checkbox"][disabled]', 'table th', 'td.al-right', 'a[href="https://example.com/x"][rel~="noopener"]'];
			for (const sel of want) if (!el.querySelector(sel)) return 'no ' + sel + ' in ' + el.textContent;
			if (el.querySelector('h3').textContent !== 'Title') return 'heading ' + el.querySelector('h3').textContent;
			if (!el.textContent.includes('& A')) return 'character references not decoded: ' + el.textContent;
			return '';`,
		"markdown: HTML, scripts and unsafe links stay text": `
			const { render, safeURL } = await import('/js/markdown.js');
			const bad = ['java', 'script:alert(1)'].join('');
			const el = render('<script>window.__x = 1</script>\n\n<div onclick="x()">raw</div>\n\ntext <b>b</b> <img src=x onerror=alert(1)> [a](' + bad + ') [d](data:text/html,x) ![i](https://example.com/i.png)');
			if (el.querySelector('script, div[onclick], b, img, iframe')) return 'markup was created';
			if ([...el.querySelectorAll('a')].some((a) => !a.href.startsWith('https:'))) return 'an unsafe link was created';
			if (!el.textContent.includes('<script>window.__x = 1</script>') || !el.textContent.includes('<b>')) return 'the HTML is not shown as text: ' + el.textContent;
			if (!el.querySelector('a.image-ref') || el.querySelector('img')) return 'the image is loaded or not linked';
			if (window.__x !== undefined) return 'the script ran';
			if (safeURL(bad) !== null || safeURL('/relative') !== null || safeURL('mailto:a@b.c') === null) return 'safeURL';
			return '';`,
		"agent: line diff, visible escapes and the tail of long output": `
			const { diffLines, diffStat, visible, renderContent } = await import('/js/agent.js');
			const d = diffLines(['a', 'b', 'c'], ['a', 'x', 'c']).map((o) => o.op + o.text).join(',');
			if (d !== ' a,-b,+x, c') return 'diff ' + d;
			const st = diffStat({ old_text: null, new_text: 'one\ntwo\n' });
			if (st.added !== 2 || st.removed !== 0) return 'new file stat ' + JSON.stringify(st);
			if (visible('a\x1b[31mb\x07') !== 'a\u241b[31mb\u2407') return 'visible ' + visible('a\x1b[31mb\x07');
			const text = Array.from({ length: 100 }, (_, i) => 'line ' + (i + 1)).join('\n');
			const box = document.createElement('div');
			box.append(...renderContent([{ type: 'content', content: { type: 'text', text } }], 7, new Set()));
			const shown = box.querySelector('pre').textContent;
			if (!shown.endsWith('line 100') || shown.includes('line 1\n')) return 'tail ' + shown.slice(0, 40);
			if (!box.querySelector('button[data-more="7"]')) return 'no Show all';
			return '';`,
		"manage: the settings the server reports, redacted and as text, typed back": `
			const { Manage } = await import('/js/manage.js');
			const evil = '<img src=x onerror="window.__m=1">';
			const session = { id: 's_1', title: evil, settings: { turn_timeout: '5m', pids: 64,
				mcp_servers: [{ name: 'gh', command: 'mcp-gh', env: [{ name: 'GH_TOKEN', value: 'tok-secret' }] }], [evil]: evil } };
			const m = new Manage({ id: 's_1', session: () => session, onSession: () => {}, login: () => {} });
			document.body.appendChild(m.el);
			m.fill();
			const f = m.el.querySelector('#manage-settings-fields');
			const field = (k) => [...f.querySelectorAll('[data-key]')].find((i) => i.dataset.key === k);
			for (const k of ['permission_mode', 'turn_timeout', 'memory_bytes', 'pids', 'setup', 'mcp_servers', evil]) if (!field(k)) return 'no field ' + k;
			if (field('turn_timeout').value !== '5m' || field('pids').value !== '64' || field(evil).value !== evil) return 'values not shown as they are';
			if (m.el.outerHTML.includes('tok-secret')) return 'an MCP env value is in the page';
			if (!field('mcp_servers').readOnly || !field('mcp_servers').value.includes('GH_TOKEN')) return 'mcp_servers not redacted read-only: ' + field('mcp_servers').value;
			if (m.el.querySelector('img') || window.__m) return 'a key or value became markup';
			// What Save sends: only the changed keys, in the server's types. The
			// request goes to the real (UI-only) server, which has no API: its
			// error is shown in words.
			const sent = [];
			const real = window.fetch;
			window.fetch = (u, init) => { sent.push([String(u), init && init.method, init && init.body]); return real(u, init); };
			try {
				field('pids').value = '128';
				field('memory_bytes').value = '1048576';
				field('permission_mode').value = 'auto';
				await m.saveSettings();
			} finally {
				window.fetch = real;
			}
			if (sent.length !== 1 || sent[0][0] !== '/v1/sessions/s_1' || sent[0][1] !== 'PATCH') return 'sent ' + JSON.stringify(sent);
			const body = JSON.parse(sent[0][2]);
			if (JSON.stringify(body) !== JSON.stringify({ settings: { permission_mode: 'auto', memory_bytes: 1048576, pids: 128 } })) return 'body ' + sent[0][2];
			const err = m.el.querySelector('#manage-settings-error');
			if (err.hidden || !err.textContent.includes('no route')) return 'error not shown: ' + err.textContent;
			field('pids').value = 'many';
			await m.saveSettings();
			if (!err.textContent.includes('pids must be a number')) return 'bad number: ' + err.textContent;
			m.el.remove();
			return '';`,
		"store: contiguous at both ends": `
			const { Store } = await import('/js/model.js');
			const s = new Store(5);
			s.append({ seq: 6 }); s.append({ seq: 7 });
			try { s.append({ seq: 9 }); return 'a gap was accepted'; } catch {}
			s.prepend([{ seq: 4 }, { seq: 5 }]);
			s.dropBefore(5);
			return s.lo === 5 && s.hi === 7 && s.get(6).seq === 6 && s.get(4) === undefined ? '' : JSON.stringify(s);`,
	}
	for name, js := range cases {
		t.Run(name, func(t *testing.T) {
			sub := &tab{t: t, ctx: tb.ctx, user: tb.user, base: tb.base}
			if got := eval[string](sub, "(async () => {"+js+"})()"); got != "" {
				t.Fatal(got)
			}
		})
	}
}
