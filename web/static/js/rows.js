// rows.js: one DOM row per event. Every row is an element with
// data-seq=<seq> and the class "ev k-<kind>", in seq order in the timeline,
// so the timeline can find a row by its position and tests can read the seq
// list of the page.

import { h, avatar, timeEl, duration } from './dom.js';
import * as ansi from './ansi.js';

/** COLLAPSE_LINES is how many lines of an output event show before "Show more". */
export const COLLAPSE_LINES = 24;

const roleWords = { viewer: 'a viewer', driver: 'a driver', owner: 'an owner' };

/**
 * renderRow returns the row of ev. ctx: {model, me, canDrive, expanded (Set
 * of seqs shown in full), approve(turn, id, allow, buttons)}.
 */
export function renderRow(ev, ctx) {
  const fn = renderers[ev.kind] || renderUnknown;
  const el = fn(ev, ev.data || {}, ctx);
  el.classList.add('ev', `k-${ev.kind}`);
  el.dataset.seq = ev.seq;
  return el;
}

const renderers = {
  session_created(ev, d) {
    return note(ev, [h('strong', { text: ev.by }), ' created the session', d.title ? [' ', h('q', { text: d.title })] : null]);
  },

  message(ev, d, ctx) {
    const mine = ev.by === ctx.me;
    const turn = ctx.model.promptTurn.get(ev.seq);
    let badge = null;
    if (turn !== undefined) {
      const fin = ctx.model.finished.get(turn);
      badge = h('span', { class: ['badge', fin ? `st-${fin.status}` : 'st-running'], text: fin ? `turn ${turn} · ${fin.status}` : `turn ${turn} · running` });
    } else if (ctx.model.pending.has(ev.seq)) {
      badge = h('span', { class: 'badge st-queued', text: 'queued' });
    }
    return h('article', { class: mine ? 'mine' : null, attrs: { 'aria-label': `Prompt from ${ev.by}` } },
      h('div', { class: 'meta' }, avatar(ev.by), h('strong', { class: 'who', text: ev.by }), timeEl(ev.time), badge),
      h('div', { class: 'text', text: d.text || '' }));
  },

  turn_started(ev, d) {
    return h('div', { class: 'turnline' },
      h('span', { class: 'mark', attrs: { 'aria-hidden': 'true' }, text: '▶' }),
      h('span', { text: `Turn ${d.turn} started` }), ev.by && ev.by !== 'system' ? h('span', { class: 'dim', text: `· ${ev.by}'s prompt` }) : null,
      ' ', timeEl(ev.time));
  },

  turn_finished(ev, d) {
    const bits = [`Turn ${d.turn} ${statusWord(d.status)}`];
    if (d.exit_code !== undefined && d.exit_code !== null && d.status !== 'cancelled') bits.push(`exit ${d.exit_code}`);
    if (d.duration_ms) bits.push(duration(d.duration_ms));
    return h('div', { class: ['turnline', 'done', `st-${d.status}`] },
      h('span', { class: 'mark', attrs: { 'aria-hidden': 'true' }, text: d.status === 'ok' ? '✓' : '■' }),
      h('span', { text: bits.join(' · ') }), ' ', timeEl(ev.time));
  },

  output(ev, d, ctx) {
    const text = d.text || '';
    const el = h('div', { class: d.stream === 'stderr' ? 'stderr' : 'stdout' });
    const pre = h('pre', { class: 'term', attrs: { 'aria-label': d.stream === 'stderr' ? 'Error output' : 'Output' } });
    let shown = text;
    let hidden = 0;
    if (!ctx.expanded.has(ev.seq)) {
      let idx = -1;
      let n = 0;
      while (n < COLLAPSE_LINES) {
        idx = text.indexOf('\n', idx + 1);
        if (idx < 0) break;
        n++;
      }
      if (idx >= 0 && idx < text.length - 1) {
        shown = text.slice(0, idx + 1);
        hidden = countLines(text.slice(idx + 1));
      }
    }
    ansi.render(pre, shown);
    el.appendChild(pre);
    if (hidden > 0) {
      el.appendChild(h('button', {
        type: 'button', class: 'more', data: { more: ev.seq },
        text: `Show ${hidden.toLocaleString()} more line${hidden === 1 ? '' : 's'}`,
      }));
    } else if (ctx.expanded.has(ev.seq)) {
      el.appendChild(h('button', { type: 'button', class: 'more', data: { less: ev.seq }, text: 'Show less' }));
    }
    return el;
  },

  agent(ev, d) {
    const type = typeof d.type === 'string' ? d.type : 'agent';
    const { turn, type: _t, ...rest } = d;
    const summary = agentSummary(d);
    return h('div', null,
      h('details', null,
        h('summary', null, h('span', { class: 'tag', text: type }), ' ', h('span', { class: 'sum', text: summary })),
        h('pre', { class: 'json', text: JSON.stringify(rest, null, 2) })));
  },

  approval_requested(ev, d, ctx) {
    const state = ctx.model.approvalState(d.turn, d.id);
    const res = ctx.model.resolution(d.turn, d.id);
    const titleID = `ap-${ev.seq}`;
    const card = h('div', { class: ['card', `ap-${state}`], attrs: { role: 'group', 'aria-labelledby': titleID } },
      h('p', { class: 'title', id: titleID }, h('span', { class: 'mark', attrs: { 'aria-hidden': 'true' }, text: '?' }),
        `Approval requested · turn ${d.turn}`),
      h('p', { class: 'summary', text: d.summary || d.id }));
    if (state === 'pending' && ctx.canDrive) {
      card.appendChild(h('div', { class: 'actions' },
        h('button', { type: 'button', class: 'primary', data: { approve: 'allow', turn: d.turn, id: d.id }, text: 'Allow' }),
        h('button', { type: 'button', class: 'danger', data: { approve: 'deny', turn: d.turn, id: d.id }, text: 'Deny' })));
    } else {
      const outcome = {
        pending: 'Waiting for a driver to answer',
        allowed: `Allowed${res ? ` by ${res.by}` : ''}`,
        denied: `Denied${res ? ` by ${res.by}` : ''}`,
        expired: 'Not answered: the turn ended',
      }[state];
      card.appendChild(h('p', { class: 'outcome', text: outcome }));
    }
    return h('div', { data: { approval: `${d.turn}/${d.id}` } }, card);
  },

  approval_resolved(ev, d) {
    return note(ev, [h('strong', { text: ev.by }), d.allow ? ' allowed ' : ' denied ', h('q', { text: d.id })]);
  },

  sandbox(ev, d) {
    return note(ev, [`Sandbox ${d.state}`, d.detail ? `: ${d.detail}` : '']);
  },

  member_changed(ev, d) {
    const who = h('strong', { text: d.user });
    const role = roleWords[d.role];
    return note(ev, role ? [h('strong', { text: ev.by }), ' made ', who, ` ${role}`] : [h('strong', { text: ev.by }), ' removed ', who]);
  },

  pr_opened(ev, d) {
    let link = h('span', { text: d.url || '' });
    try {
      const u = new URL(d.url);
      if (u.protocol === 'https:' || u.protocol === 'http:') {
        link = h('a', { href: u.href, text: u.href, attrs: { rel: 'noopener noreferrer', target: '_blank' } });
      }
    } catch {
      // Not a URL: shown as text.
    }
    return note(ev, ['Pull request opened', d.branch ? [' from ', h('code', { text: d.branch })] : null, ': ', link]);
  },

  error(ev, d) {
    return h('div', { attrs: { role: 'note' } },
      h('span', { class: 'mark', attrs: { 'aria-hidden': 'true' }, text: '!' }),
      h('strong', { text: d.code || 'error' }), ' ', h('span', { text: d.message || '' }), ' ', timeEl(ev.time));
  },
};

function renderUnknown(ev, d) {
  return note(ev, [h('code', { text: ev.kind }), ' ', h('span', { class: 'dim', text: JSON.stringify(d).slice(0, 200) })]);
}

function note(ev, content) {
  return h('div', { class: 'note' }, h('span', { class: 'body' }, content), ' ', timeEl(ev.time));
}

function statusWord(s) {
  return { ok: 'finished', failed: 'failed', cancelled: 'was cancelled', timeout: 'timed out' }[s] || s;
}

function countLines(s) {
  let n = 0;
  for (let i = s.indexOf('\n'); i >= 0; i = s.indexOf('\n', i + 1)) n++;
  return s.endsWith('\n') ? n : n + 1;
}

/** agentSummary picks a short human text out of a harness object. */
export function agentSummary(d) {
  for (const k of ['text', 'message', 'content', 'summary', 'name', 'tool', 'result', 'subtype']) {
    const v = d[k];
    if (typeof v === 'string' && v) return oneLine(v);
    if (v && typeof v === 'object') {
      // Agent CLIs nest text: {message: {content: [{type: "text", text}]}}.
      const parts = Array.isArray(v.content) ? v.content : Array.isArray(v) ? v : null;
      if (parts) {
        const t = parts.map((p) => (p && typeof p.text === 'string' ? p.text : p && p.name ? `[${p.name}]` : '')).join(' ').trim();
        if (t) return oneLine(t);
      }
    }
  }
  const { turn, type, ...rest } = d;
  const s = JSON.stringify(rest);
  return s === '{}' ? '' : oneLine(s);
}

function oneLine(s) {
  const t = s.replace(/\s+/g, ' ').trim();
  return t.length > 160 ? `${t.slice(0, 159)}…` : t;
}
