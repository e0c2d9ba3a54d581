// rows.js: one DOM row per event. Every row is an element with
// data-seq=<seq> and the class "ev k-<kind>", in seq order in the timeline,
// so the timeline can find a row by its position and tests can read the seq
// list of the page.

import { h, avatar, timeEl, duration } from './dom.js';
import * as ansi from './ansi.js';
import { agentRenderers, renderContent, visible } from './agent.js';

/** COLLAPSE_LINES is how many last lines of an output event show before "Show earlier lines". */
export const COLLAPSE_LINES = 24;

const roleWords = { viewer: 'a viewer', driver: 'a driver', owner: 'an owner' };

/**
 * renderRow returns the row of ev. ctx: {model, me, canDrive, expanded (Set
 * of seqs shown in full), approve(turn, id, allow, buttons)}.
 */
export function renderRow(ev, ctx) {
  const fn = renderers[ev.kind] || renderUnknown;
  const d = ev.data || {};
  const el = fn(ev, d, ctx);
  el.classList.add('ev', `k-${ev.kind}`);
  el.dataset.seq = ev.seq;
  // Rows of a turn are indented under its prompt (see turn_started).
  if (typeof d.turn === 'number' && ev.kind !== 'turn_started' && ev.kind !== 'turn_finished') {
    el.classList.add('in-turn');
    el.dataset.turn = d.turn;
  }
  return el;
}

/** KINDS lists the event kinds this module renders (checked against the session package's kinds by a Go test). */
export const KINDS = () => Object.keys(renderers);

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
    const during = ctx.model.queuedDuring.get(ev.seq);
    if (during !== undefined && (turn === undefined || turn !== during)) {
      // Sent while another turn ran: a short line here, the queue area
      // while it waits, and the whole prompt heads its own turn.
      return h('article', { class: ['queued-line', mine ? 'mine' : null], attrs: { 'aria-label': `Prompt from ${ev.by}, queued` } },
        h('div', { class: 'meta' }, avatar(ev.by), h('strong', { class: 'who', text: ev.by }),
          h('span', { class: 'dim', text: `queued a prompt during turn ${during}:` }),
          h('span', { class: 'text one', text: firstLine(d.text) }), timeEl(ev.time), badge));
    }
    return h('article', { class: mine ? 'mine' : null, attrs: { 'aria-label': `Prompt from ${ev.by}` } },
      h('div', { class: 'meta' }, avatar(ev.by), h('strong', { class: 'who', text: ev.by }), timeEl(ev.time), badge),
      h('div', { class: 'text', text: d.text || '' }));
  },

  turn_started(ev, d, ctx) {
    const prompt = ctx.model.store.get(d.prompt_seq);
    if (prompt && ctx.model.queuedDuring.has(d.prompt_seq)) {
      // The prompt was queued during an earlier turn: it heads this one.
      const fin = ctx.model.finished.get(d.turn);
      return h('article', { class: ['turnhead', prompt.by === ctx.me ? 'mine' : null], attrs: { 'aria-label': `Turn ${d.turn}, prompt from ${prompt.by}` } },
        h('div', { class: 'meta' }, avatar(prompt.by), h('strong', { class: 'who', text: prompt.by }), timeEl(ev.time),
          h('span', { class: ['badge', fin ? `st-${fin.status}` : 'st-running'], text: fin ? `turn ${d.turn} · ${fin.status}` : `turn ${d.turn} · running` })),
        h('div', { class: 'text', text: (prompt.data && prompt.data.text) || '' }));
    }
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
      h('span', { text: bits.join(' · ') }), ' ', timeEl(ev.time),
      h('span', { class: 'turn-actions' },
        h('button', { type: 'button', class: 'link', data: { changes: d.turn }, text: 'Changes', attrs: { 'aria-label': `Files changed by turn ${d.turn}` } }),
        h('button', { type: 'button', class: 'link', data: { fork: ev.seq, turn: d.turn }, text: 'Fork here', attrs: { 'aria-label': `Fork the session as of the end of turn ${d.turn}` } })));
  },

  output(ev, d, ctx) {
    const text = d.text || '';
    const el = h('div', { class: d.stream === 'stderr' ? 'stderr' : 'stdout' });
    const pre = h('pre', { class: 'term', attrs: { 'aria-label': d.stream === 'stderr' ? 'Error output' : 'Output' } });
    let shown = text;
    let hidden = 0;
    if (!ctx.expanded.has(ev.seq)) {
      // The tail shows: the end of a long output is what says how it went.
      const body = text.endsWith('\n') ? text.length - 1 : text.length;
      let idx = body;
      let n = 0;
      while (n < COLLAPSE_LINES) {
        idx = text.lastIndexOf('\n', idx - 1);
        if (idx < 0) break;
        n++;
      }
      if (idx > 0) {
        shown = text.slice(idx + 1);
        hidden = countLines(text.slice(0, idx + 1));
      }
    }
    ansi.render(pre, shown);
    if (hidden > 0) {
      el.appendChild(h('button', {
        type: 'button', class: 'more', data: { more: ev.seq },
        text: `Show ${hidden.toLocaleString()} earlier line${hidden === 1 ? '' : 's'}`,
      }));
    } else if (ctx.expanded.has(ev.seq)) {
      el.appendChild(h('button', { type: 'button', class: 'more', data: { less: ev.seq }, text: 'Show less' }));
    }
    el.appendChild(pre);
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
      h('p', { class: 'summary', text: visible(d.title || d.summary || d.id) }),
      d.title && d.summary && d.summary !== d.title ? h('p', { class: 'dim', text: visible(d.summary) }) : null,
      Array.isArray(d.content) && d.content.length ? h('div', { class: 'ap-content' }, renderContent(d.content, ev.seq, ctx.expanded)) : null);
    const options = (Array.isArray(d.options) ? d.options : []).filter((o) => o && typeof o.id === 'string');
    if (state === 'pending' && ctx.canDrive) {
      if (options.length) {
        // The agent's own choices; allow_* ones allow, reject_* ones deny.
        card.appendChild(h('div', { class: 'actions options' }, options.map((o) => {
          const allow = String(o.kind || '').startsWith('allow');
          return h('button', { type: 'button', class: allow ? (o.kind === 'allow_once' ? 'primary' : '') : 'danger',
            data: { approve: allow ? 'allow' : 'deny', option: o.id, kind: o.kind || '', turn: d.turn, id: d.id }, text: visible(o.name || o.id) });
        })));
      } else {
        card.appendChild(h('div', { class: 'actions' },
          h('button', { type: 'button', class: 'primary', data: { approve: 'allow', turn: d.turn, id: d.id }, text: 'Allow' }),
          h('button', { type: 'button', class: 'danger', data: { approve: 'deny', turn: d.turn, id: d.id }, text: 'Deny' })));
      }
    } else {
      const chosen = res && res.option_id ? options.find((o) => o.id === res.option_id) : null;
      const how = chosen ? `: ${visible(chosen.name || chosen.id)}` : '';
      const outcome = {
        pending: options.length ? `Waiting for a driver to choose: ${options.map((o) => visible(o.name || o.id)).join(' · ')}` : 'Waiting for a driver to answer',
        allowed: `Allowed${res ? ` by ${res.by}` : ''}${how}`,
        denied: `Denied${res ? ` by ${res.by}` : ''}${how}`,
        expired: 'Not answered: the turn ended',
      }[state];
      card.appendChild(h('p', { class: 'outcome', text: outcome }));
    }
    return h('div', { data: { approval: `${d.turn}/${d.id}` } }, card);
  },

  approval_resolved(ev, d) {
    return note(ev, [h('strong', { text: ev.by }), d.allow ? ' allowed ' : ' denied ', h('q', { text: d.id }),
      d.option_id ? h('span', { class: 'dim', text: ` (${visible(d.option_id)})` }) : null]);
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

  ...agentRenderers,

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

function firstLine(text) {
  const t = String(text || '').trim();
  const i = t.indexOf('\n');
  const line = i < 0 ? t : `${t.slice(0, i)} …`;
  return line.length > 140 ? `${line.slice(0, 139)}…` : line;
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
