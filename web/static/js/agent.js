// agent.js: the rows of an ACP agent's events (DESIGN §7 "Agent events"):
// messages as markdown, tool calls as cards that later updates change,
// plans as checklists, thoughts collapsed, usage per turn. Everything an
// agent or a file supplies goes into the page as text nodes (or through
// markdown.js, which builds elements from tokens), so HTML, scripts, links
// with other schemes and terminal escapes stay text.

import { h, timeEl, plural } from './dom.js';
import * as ansi from './ansi.js';
import * as md from './markdown.js';

/** TAIL_LINES is how many last lines of a tool's text output show before "Show all". */
export const TAIL_LINES = 16;
/** DIFF_LINES is how many lines of a diff show before "Show all". */
export const DIFF_LINES = 300;
/** LINE_CHARS is how much of one very long line shows before "Show all". */
export const LINE_CHARS = 2000;

const kindIcons = {
  read: '≡', edit: '✎', delete: '✕', move: '→', search: '⌕', execute: '$', think: '…', fetch: '↓', switch_mode: '⇆', other: '•',
};
const statusWords = { pending: 'pending', in_progress: 'running', completed: 'done', failed: 'failed' };

/**
 * visible replaces control characters other than newline and tab with
 * their visible symbols (ESC becomes ␛), so terminal escapes in a name or
 * a diff show as what they are.
 */
export function visible(s) {
  return String(s ?? '').replace(/[\u0000-\u0008\u000b-\u001f\u007f]/g, (c) => (c === '\u007f' ? '␡' : String.fromCharCode(0x2400 + c.charCodeAt(0))));
}

/** lines splits text into lines (a final newline makes no empty last line). */
export function lines(text) {
  const l = String(text ?? '').split('\n');
  if (l.length > 1 && l[l.length - 1] === '') l.pop();
  return l;
}

/** clip shortens a very long line for display. */
function clip(s, full) {
  return !full && s.length > LINE_CHARS ? `${s.slice(0, LINE_CHARS)} … [${(s.length - LINE_CHARS).toLocaleString()} more characters]` : s;
}

/**
 * diffLines returns the line diff of a and b as [{op: ' '|'+'|'-', text}],
 * by Myers' algorithm bounded to maxD edits (beyond that, every old line is
 * removed and every new one added).
 */
export function diffLines(a, b, maxD = 1000) {
  let s = 0;
  while (s < a.length && s < b.length && a[s] === b[s]) s++;
  let ea = a.length;
  let eb = b.length;
  while (ea > s && eb > s && a[ea - 1] === b[eb - 1]) { ea--; eb--; }
  const head = a.slice(0, s).map((text) => ({ op: ' ', text }));
  const tail = a.slice(ea).map((text) => ({ op: ' ', text }));
  const A = a.slice(s, ea);
  const B = b.slice(s, eb);
  const N = A.length;
  const M = B.length;
  const max = Math.min(N + M, maxD);
  const off = max + 1;
  const v = new Int32Array(2 * max + 3);
  const trace = [];
  let found = N === 0 && M === 0;
  for (let d = 0; d <= max && !found; d++) {
    trace.push(v.slice());
    for (let k = -d; k <= d; k += 2) {
      let x = k === -d || (k !== d && v[off + k - 1] < v[off + k + 1]) ? v[off + k + 1] : v[off + k - 1] + 1;
      let y = x - k;
      while (x < N && y < M && A[x] === B[y]) { x++; y++; }
      v[off + k] = x;
      if (x >= N && y >= M) { found = true; break; }
    }
  }
  let mid;
  if (!found) {
    mid = A.map((text) => ({ op: '-', text })).concat(B.map((text) => ({ op: '+', text })));
  } else if (N === 0 && M === 0) {
    mid = [];
  } else {
    mid = [];
    let x = N;
    let y = M;
    for (let d = trace.length - 1; d >= 0; d--) {
      const vv = trace[d];
      const k = x - y;
      const prevK = k === -d || (k !== d && vv[off + k - 1] < vv[off + k + 1]) ? k + 1 : k - 1;
      const px = d === 0 ? 0 : vv[off + prevK];
      const py = px - prevK;
      while (x > px && y > py) { mid.push({ op: ' ', text: A[x - 1] }); x--; y--; }
      if (d > 0) {
        if (x === px) { mid.push({ op: '+', text: B[y - 1] }); y--; } else { mid.push({ op: '-', text: A[x - 1] }); x--; }
      }
    }
    mid.reverse();
  }
  return head.concat(mid, tail);
}

/** diffStat returns {added, removed} of a diff content item. */
const diffCache = new WeakMap(); // content item → its diffStat

export function diffStat(item) {
  const cached = diffCache.get(item);
  if (cached) return cached;
  const ops = diffLines(item.old_text == null ? [] : lines(item.old_text), lines(item.new_text));
  let added = 0;
  let removed = 0;
  for (const o of ops) {
    if (o.op === '+') added++;
    else if (o.op === '-') removed++;
  }
  const r = { added, removed, ops };
  diffCache.set(item, r);
  return r;
}

// contentText returns the text of an ACP content block ({type:"text",text}
// and friends), or null.
function contentText(c) {
  if (!c || typeof c !== 'object') return null;
  if (typeof c.text === 'string') return c.text;
  if (c.type === 'resource' && c.resource && typeof c.resource.text === 'string') return c.resource.text;
  if (c.type === 'resource_link' && typeof c.uri === 'string') return c.uri;
  if (c.type === 'image' || c.type === 'audio') return `[${c.type}${c.mimeType ? ` ${c.mimeType}` : ''}]`;
  return null;
}

// unfence returns the inside of text when all of it is one fenced code
// block, else text. Claude's ACP adapter sends a Bash tool's output as
// markdown, "```console\n…\n```"; codex and gemini send plain text. The
// inside shows as terminal output (tailed, ANSI-coloured) like theirs.
export function unfence(text) {
  const m = /^[ \t]*(`{3,}|~{3,})([^\n]*)\n([\s\S]*?)\n?[ \t]*\1[`~]*[ \t]*\n?$/.exec(text);
  if (!m) return text;
  const [, fence, info, inside] = m;
  if (fence[0] === '`' && info.includes('`')) return text;
  // A fence line inside means more than one block: leave it as it came.
  if (inside.split('\n').some((l) => l.trimStart().startsWith(fence))) return text;
  return inside;
}

/**
 * renderContent renders the content items of a tool call (or an approval).
 * key is the seq under which "Show all" remembers the reader's choice;
 * expanded the set of such seqs.
 */
export function renderContent(items, key, expanded) {
  const full = expanded && expanded.has(key);
  const out = [];
  let clipped = false;
  for (const it of Array.isArray(items) ? items : []) {
    if (!it || typeof it !== 'object') continue;
    if (it.type === 'diff') {
      const { added, removed, ops } = diffStat(it);
      const rows = full ? ops : ops.slice(0, DIFF_LINES);
      if (rows.length < ops.length) clipped = true;
      const view = h('div', { class: 'diffview', attrs: { role: 'table', 'aria-label': `Changes to ${visible(it.path)}` } });
      // Line numbers first, then runs of more than 8 unchanged lines are
      // folded to 3 lines at each edge that touches a change.
      let oldNo = 0;
      let newNo = 0;
      const nums = rows.map((o) => {
        if (o.op !== '+') oldNo++;
        if (o.op !== '-') newNo++;
        return [oldNo, newNo];
      });
      for (let i = 0; i < rows.length; i++) {
        if (rows[i].op === ' ' && !full) {
          let j = i;
          while (j < rows.length && rows[j].op === ' ') j++;
          const keepHead = i === 0 ? 0 : 3;
          const keepTail = j === rows.length ? 0 : 3;
          const skipped = j - i - keepHead - keepTail;
          if (j - i > 8 && skipped > 1) {
            for (let x = i; x < i + keepHead; x++) view.appendChild(diffRow(rows[x], nums[x], full));
            view.appendChild(h('div', { class: 'dl skip', attrs: { role: 'row' }, text: `⋯ ${plural(skipped, 'unchanged line')}` }));
            for (let x = j - keepTail; x < j; x++) view.appendChild(diffRow(rows[x], nums[x], full));
            i = j - 1;
            continue;
          }
        }
        view.appendChild(diffRow(rows[i], nums[i], full));
      }
      const isNew = it.old_text == null;
      out.push(h('details', { class: 'diff', open: true },
        h('summary', null,
          h('span', { class: 'path', text: visible(it.path || '(no path)') }), ' ',
          isNew ? h('span', { class: 'badge', text: 'new file' }) : null, ' ',
          h('span', { class: 'stat add', text: `+${added}` }), ' ', h('span', { class: 'stat del', text: `−${removed}` })),
        view));
    } else if (it.type === 'terminal') {
      out.push(h('p', { class: 'dim', text: `Terminal ${visible(it.terminal_id || '')}` }));
    } else {
      const raw = it.type === 'content' ? contentText(it.content) : contentText(it);
      if (raw === null) continue;
      const text = unfence(raw);
      const all = lines(text);
      const shown = full || all.length <= TAIL_LINES ? all : all.slice(all.length - TAIL_LINES);
      const hidden = all.length - shown.length;
      if (hidden > 0) clipped = true;
      const pre = h('pre', { class: 'term' });
      const body = shown.map((l) => clip(l, full)).join('\n');
      if (body.length !== shown.join('\n').length) clipped = true;
      ansi.render(pre, body);
      out.push(h('details', { class: 'output', open: true },
        h('summary', null, hidden > 0 ? `Output · last ${shown.length} of ${plural(all.length, 'line')}` : `Output · ${plural(all.length, 'line')}`),
        pre));
    }
  }
  if (clipped && !full) out.push(h('button', { type: 'button', class: 'more', data: { more: key }, text: 'Show all' }));
  else if (full && expanded && expanded.has(key)) out.push(h('button', { type: 'button', class: 'more', data: { less: key }, text: 'Show less' }));
  return out;
}

function diffRow(o, [oldNo, newNo], full) {
  const cls = o.op === '+' ? 'add' : o.op === '-' ? 'del' : 'ctx';
  return h('div', { class: ['dl', cls], attrs: { role: 'row' } },
    h('span', { class: 'ln', attrs: { 'aria-hidden': 'true' }, text: o.op === '+' ? '' : String(oldNo) }),
    h('span', { class: 'ln', attrs: { 'aria-hidden': 'true' }, text: o.op === '-' ? '' : String(newNo) }),
    h('span', { class: 'op', text: o.op === ' ' ? ' ' : o.op === '+' ? '+' : '−' }),
    h('span', { class: 'code', text: visible(clip(o.text, full)) }));
}

/** toolCard renders the card of a tool call's current state st. */
export function toolCard(st, key, ctx) {
  const status = st.status || 'pending';
  const icon = kindIcons[st.kind] || kindIcons.other;
  const locs = (Array.isArray(st.locations) ? st.locations : []).filter((l) => l && l.path)
    .map((l) => visible(l.path) + (Number.isInteger(l.line) ? `:${l.line}` : ''));
  return h('div', { class: ['tool', `st-${status}`], data: { tool: st.id || '', status } },
    h('div', { class: 'tool-head' },
      h('span', { class: 'kicon', title: st.kind || 'tool', attrs: { 'aria-label': `${st.kind || 'tool'} tool` }, text: icon }),
      h('span', { class: 'ttitle', text: visible(st.title || st.kind || 'Tool call') }),
      h('span', { class: ['badge', 'tstatus', `ts-${status}`], text: statusWords[status] || visible(status) })),
    locs.length ? h('p', { class: 'locs dim', text: locs.slice(0, 5).join(' · ') + (locs.length > 5 ? ` · and ${locs.length - 5} more` : '') }) : null,
    renderContent(st.content, key, ctx.expanded));
}

/** planList renders plan entries as a checklist. */
export function planList(entries) {
  const list = Array.isArray(entries) ? entries : [];
  const done = list.filter((e) => e && e.status === 'completed').length;
  return h('div', { class: 'plan' },
    h('p', { class: 'plan-head' }, h('strong', { text: 'Plan' }), ' ', h('span', { class: 'dim', text: `${done} of ${list.length} done` })),
    h('ul', { class: 'checklist' }, list.map((e) => {
      const st = (e && e.status) || 'pending';
      const mark = st === 'completed' ? '☑' : st === 'in_progress' ? '◐' : '☐';
      return h('li', { class: [`ps-${st}`, e && e.priority ? `pp-${e.priority}` : null], data: { status: st } },
        h('span', { class: 'pmark', attrs: { 'aria-label': st.replace('_', ' ') }, text: mark }), ' ',
        h('span', { class: 'ptext', text: visible(e && e.content) }));
    })));
}

const money = (x) => (x >= 0.01 ? `$${x.toFixed(2)}` : x > 0 ? `$${x.toFixed(4)}` : '$0');
const tokens = (n) => (n >= 1e6 ? `${(n / 1e6).toFixed(1)}M` : n >= 1e4 ? `${Math.round(n / 1e3)}k` : n >= 1e3 ? `${(n / 1e3).toFixed(1)}k` : String(n));

/** usageText describes {input, output, cached, cost}. */
export function usageText(u) {
  const bits = [`${tokens(u.input)} in`, `${tokens(u.output)} out`];
  if (u.cached) bits.push(`${tokens(u.cached)} cached`);
  if (u.cost) bits.push(money(u.cost));
  return bits.join(' · ');
}

/** renderers of the agent kinds, with rows.js's signature (ev, data, ctx). */
export const agentRenderers = {
  agent_message(ev, d) {
    return h('article', { class: 'agent-msg', attrs: { 'aria-label': 'Agent message' }, data: { message: d.message_id || '' } },
      h('div', { class: 'meta' }, h('span', { class: 'avatar agent', attrs: { 'aria-hidden': 'true' }, text: '◆' }),
        h('strong', { class: 'who', text: 'Agent' }), timeEl(ev.time)),
      md.render(visible(d.text)));
  },

  agent_thought(ev, d) {
    const first = lines(d.text)[0] || '';
    return h('div', null, h('details', { class: 'thought' },
      h('summary', null, h('span', { class: 'tag', text: 'thinking' }), ' ', h('span', { class: 'sum dim', text: visible(first.length > 140 ? `${first.slice(0, 139)}…` : first) })),
      md.render(visible(d.text))));
  },

  tool_call(ev, d, ctx) {
    const st = ctx.model.toolCall(d.id) || { ...d, seq: ev.seq };
    return h('div', null, toolCard(st, ev.seq, ctx));
  },

  tool_call_update(ev, d, ctx) {
    const st = ctx.model.toolCall(d.id);
    if (st) {
      // The tool_call's card shows this update; the row stays, empty, to
      // keep one row per event.
      return h('div', { class: 'folded', hidden: true, data: { tool: d.id || '' } });
    }
    return h('div', null, toolCard({ ...d, id: d.id, kind: '', title: d.title || `Tool call ${d.id || ''}` }, ev.seq, ctx));
  },

  plan(ev, d, ctx) {
    if (ctx.model.latestPlan(d.turn) !== ev.seq) {
      const list = Array.isArray(d.entries) ? d.entries : [];
      const done = list.filter((e) => e && e.status === 'completed').length;
      return h('div', { class: 'note superseded' }, h('span', { class: 'body dim', text: `Plan (${done} of ${list.length} done) · updated below` }));
    }
    return h('div', null, planList(d.entries));
  },

  usage(ev, d, ctx) {
    const u = { input: Number(d.input_tokens) || 0, output: Number(d.output_tokens) || 0, cached: Number(d.cached_tokens) || 0, cost: Number(d.cost_usd) || 0 };
    const turn = ctx.model.usageTurn.get(d.turn);
    return h('div', { class: 'note usage' },
      h('span', { class: 'body' }, h('span', { class: 'tag', text: 'usage' }), ' ',
        d.model ? h('span', { class: 'dim', text: `${visible(d.model)} · ` }) : null, usageText(u),
        turn && (turn.input !== u.input || turn.output !== u.output) ? h('span', { class: 'dim', text: ` · turn ${d.turn}: ${usageText(turn)}` }) : null),
      ' ', timeEl(ev.time));
  },

  files_changed(ev, d) {
    const paths = (Array.isArray(d.paths) ? d.paths : []).map(visible);
    const shown = paths.slice(0, 6);
    return h('div', { class: 'note files' },
      h('span', { class: 'body' }, h('strong', { text: ev.by || d.by || 'system' }), ` changed ${plural(paths.length, 'file')}: `,
        shown.map((p, i) => [i ? ', ' : '', h('code', { text: p })]), paths.length > shown.length ? ` and ${paths.length - shown.length} more` : ''),
      ' ', timeEl(ev.time));
  },
};
