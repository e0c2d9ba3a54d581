// session.js: the page of one session (/s/<id>): the live event stream,
// presence, turn and sandbox state, the prompt box with its queue, approvals,
// cancel and the share dialog.
//
// Loading: GET the Session object for its last_seq, then open the WebSocket
// with ?after=last_seq-PAGE, so the server replays the latest page and goes
// live without a gap; older pages are read over REST as the reader scrolls
// up (there is no "before" parameter: after = lo-1-PAGE, limit = PAGE). If
// the state of the session (running turn, approvals, queue) depends on
// events older than the page, those are read too, in the background.

import { h, avatar, duration, plural, toast, later, randomID } from './dom.js';
import * as api from './api.js';
import { Stream } from './stream.js';
import { Model } from './model.js';
import { Timeline } from './timeline.js';
import { renderRow } from './rows.js';
import * as md from './markdown.js';
import { visible, usageText } from './agent.js';
import { Workspace } from './workspace.js';
import { Manage } from './manage.js';

const NOTIFY_KEY = 'atrium.notify'; // "1" when the user asked for browser notifications
const STREAM_RENDERS_PER_S = 10; // how often a streaming message is rendered again
const TYPING_EVERY_MS = 2000; // how often a typing frame is repeated while typing (the server's TTL is 6 s)

/** PAGE is how many events the page reads first, and per older page. */
export const PAGE = 200;
/**
 * FAR_BEHIND is how far behind the session's end a reconnecting page may be
 * and still catch up event by event; further behind, and following the live
 * end, it starts again at the end (the latest PAGE events), as when opening:
 * the rows the reader would see are the same, without the work of the ones
 * in between (older ones are read as the reader scrolls up).
 */
export const FAR_BEHIND = 5000;
const BACKFILL_PAGE = 1000; // events per REST read when the state needs older events
const MAX_TEXT = 256 * 1024; // the contract's largest prompt, in bytes
const ROLES = ['viewer', 'driver', 'owner'];
const rank = (r) => ROLES.indexOf(r) + 1;

const statusText = {
  connecting: 'Connecting…',
  live: 'Live',
  offline: 'Offline: waiting for the network',
  closed: 'Disconnected',
};

/** SessionPage is mounted by the router; unmount() releases everything it started. */
export class SessionPage {
  constructor(root, id, app) {
    this.root = root;
    this.id = id;
    this.app = app;
    this.session = null;
    this.role = '';
    this.me = app.me || '';
    this.expanded = new Set();
    this.outbox = new Map(); // client_id → {text, state, message, checkSeq}
    this.presence = [];
    this.catchUp = 0; // last_seq of the latest hello
    this.caughtUp = false;
    this.backfilling = false;
    this.fatal = '';
    this.statusTimer = null; // cancels a scheduled status render
    this.conn = { state: 'connecting' };
    this.ticker = setInterval(() => this.tick(), 1000);
    this.streams = new Map(); // message_id → {turn, text, el, body, stop}: agent text being written
    this.attention = ''; // "approval" or "finished": what the tab title calls for
    this.onVisible = () => { if (!document.hidden && this.attention === 'finished') { this.attention = ''; this.renderTitle(); } };
    document.addEventListener('visibilitychange', this.onVisible);
    this.reading = Promise.resolve(); // REST reads of older events, one at a time
    this.build();
    this.onKey = (e) => this.key(e);
    document.addEventListener('keydown', this.onKey);
  }

  build() {
    const title = h('h1', { id: 'session-title', tabIndex: -1, text: 'Session' });
    this.titleEl = title;
    this.roleEl = h('span', { class: 'pill role', hidden: true });
    this.connEl = h('span', { class: 'conn', attrs: { role: 'status' } },
      h('span', { class: 'dot', attrs: { 'aria-hidden': 'true' } }), h('span', { class: 'label', text: 'Connecting…' }));
    this.retryBtn = h('button', { type: 'button', class: 'link', hidden: true, text: 'Retry now', on: { click: () => this.stream && this.stream.reconnectNow() } });
    this.sandboxEl = h('span', { class: 'pill sandbox', hidden: true });
    this.turnEl = h('span', { class: 'turnstate', id: 'turn-state' });
    this.cancelTop = h('button', { type: 'button', class: 'danger small', id: 'cancel-turn', hidden: true, text: 'Cancel turn', on: { click: () => this.cancel() } });
    this.usageEl = h('span', { class: 'pill usage', id: 'usage-total', hidden: true });
    this.notifyBtn = h('button', { type: 'button', class: 'small', id: 'notify', hidden: !('Notification' in window), on: { click: () => this.toggleNotify() } });
    this.renderNotify();
    this.presenceEl = h('ul', { class: 'presence', id: 'presence', attrs: { 'aria-label': 'Here now' } });
    this.shareBtn = h('button', { type: 'button', class: 'small', id: 'share-open', hidden: true, text: 'Share', on: { click: () => this.openShare() } });
    this.manage = new Manage({
      id: this.id, session: () => this.session, login: () => this.app.login(), share: () => this.openShare(),
      onSession: (s) => this.setSession({ ...this.session, ...s }),
    });
    this.manageBtn = h('button', { type: 'button', class: 'small', id: 'manage-open', hidden: true, text: 'Manage', on: { click: () => this.manage.show() } });
    this.ws = new Workspace({ id: this.id, canDrive: () => !this.fatal && rank(this.role) >= 2, onClose: () => this.filesBtn.setAttribute('aria-expanded', 'false') });
    this.filesBtn = h('button', { type: 'button', class: 'small', id: 'files-open', text: 'Files', attrs: { 'aria-expanded': 'false', 'aria-controls': 'workspace' }, on: { click: () => {
      if (this.ws.open) this.ws.close();
      else this.ws.show();
      this.filesBtn.setAttribute('aria-expanded', String(this.ws.open));
    } } });
    this.banner = h('div', { class: 'banner', hidden: true, attrs: { role: 'alert' } });
    this.announcer = h('div', { class: 'sr-only', attrs: { 'aria-live': 'polite' } });

    this.rowsEl = h('div', { class: 'rows', id: 'rows' });
    this.liveEl = h('div', { class: 'live', id: 'live', attrs: { 'aria-live': 'off' } });
    this.scroller = h('div', { class: 'timeline', id: 'timeline', tabIndex: 0, attrs: { 'aria-label': 'Session events' } }, this.rowsEl, this.liveEl);
    this.scroller.addEventListener('click', (e) => this.clickRow(e));

    this.queueEl = h('div', { class: 'queue', id: 'queue', hidden: true });
    this.promptEl = h('textarea', {
      id: 'prompt', name: 'prompt', rows: 1, autocomplete: 'off', spellcheck: false,
      placeholder: 'Type a prompt…', attrs: { 'aria-describedby': 'prompt-hint', enterkeyhint: 'send' },
    });
    this.promptEl.addEventListener('input', () => this.typed());
    this.promptEl.addEventListener('keydown', (e) => {
      if (e.key === 'Enter' && !e.shiftKey && !e.isComposing && !e.altKey && !e.ctrlKey && !e.metaKey) {
        e.preventDefault();
        this.submit();
      }
    });
    this.composer = h('form', { class: 'composer', id: 'composer', hidden: true, on: { submit: (e) => { e.preventDefault(); this.submit(); } } },
      h('label', { htmlFor: 'prompt', class: 'sr-only', text: 'Prompt' }),
      this.promptEl,
      h('div', { class: 'composer-actions' },
        h('button', { type: 'submit', class: 'primary', id: 'send', text: 'Send' })),
      h('p', { class: 'hint', id: 'prompt-hint', text: 'Enter sends · Shift+Enter adds a line · Esc cancels the running turn' }));
    this.typingEl = h('p', { class: 'typing-note', id: 'typing', hidden: true, attrs: { 'aria-live': 'polite' } });
    this.viewerNote = h('p', { class: 'viewer-note', id: 'viewer-note', hidden: true,
      text: 'You are watching as a viewer. An owner of this session can make you a driver so you can prompt.' });

    this.dialog = this.buildShare();
    this.confirmDlg = this.buildConfirm();

    this.root.replaceChildren(h('section', { class: 'session-page' },
      h('div', { class: 'sbar' },
        h('div', { class: 'sbar-main' },
          h('a', { href: '/', class: 'back', data: { nav: '' }, attrs: { 'aria-label': 'All sessions' }, text: '←' }),
          title, this.roleEl,
          h('div', { class: 'sbar-actions' }, this.filesBtn, this.notifyBtn, this.shareBtn, this.manageBtn)),
        h('div', { class: 'sbar-status' },
          this.connEl, this.retryBtn, this.sandboxEl, this.turnEl, this.cancelTop, this.usageEl, this.presenceEl)),
      this.banner,
      this.scroller,
      h('div', { class: 'bottom' }, this.queueEl, this.typingEl, this.composer, this.viewerNote),
      this.ws.el,
      this.dialog,
      this.manage.el,
      this.confirmDlg,
      this.announcer));
  }

  /** open reads the session and starts its stream. */
  async open() {
    let info;
    try {
      info = await api.getSession(this.id);
    } catch (err) {
      if (err.status === 401) return this.app.login();
      if (err.status === 404 || err.status === 403) return this.end('This session does not exist, or you have no access to it.', true);
      this.end(`Could not open this session: ${err.message}`, false);
      return;
    }
    if (this.stopped) return;
    this.setSession(info);
    const after = Math.max(0, (info.last_seq || 0) - PAGE);
    this.startFrom(after, info);
  }

  startFrom(after, info) {
    if (this.timeline) this.timeline.destroy();
    this.model = new Model(after, info.sandbox && info.sandbox.state);
    this.caughtUp = false;
    this.rowsEl.replaceChildren();
    this.timeline = new Timeline({
      scroller: this.scroller, list: this.rowsEl, model: this.model,
      row: (ev) => renderRow(ev, this.rowCtx()), older: () => this.readOlder(PAGE),
    });
    this.timeline.resize.observe(this.liveEl);
    this.clearStreams();
    if (this.stream) this.stream.stop();
    this.stream = new Stream(this.id, {
      onHello: (f) => this.hello(f),
      onEvent: (ev) => this.event(ev),
      onDelta: (f) => this.delta(f),
      onPresence: (f) => this.setPresence(f.watchers || []),
      onAck: (f) => this.ack(f),
      onError: (f) => this.frameError(f),
      onStatus: (s) => this.setConn(s),
      onFatal: (msg) => this.end(msg, true),
      onReset: () => this.reload(),
      check: () => this.check(),
    });
    this.stream.start(after);
    this.timeline.changed();
  }

  // reload starts the page's view of the log again from the server's
  // current end, at most once a minute (then it gives up and says so).
  async reload() {
    if (this.reloadedAt && Date.now() - this.reloadedAt < 60000) {
      this.end('This session\'s history changed on the server while you were away. Reload the page.', true);
      return;
    }
    this.reloadedAt = Date.now();
    toast('The session history changed on the server; reloading it.');
    let info;
    try {
      info = await api.getSession(this.id);
    } catch (err) {
      this.end(`Could not reload this session: ${err.message}`, true);
      return;
    }
    if (this.stopped) return;
    this.setSession(info);
    this.startFrom(Math.max(0, (info.last_seq || 0) - PAGE), info);
  }

  rowCtx() {
    return { model: this.model, me: this.me, canDrive: !this.fatal && rank(this.role) >= 2, expanded: this.expanded };
  }

  setSession(s) {
    this.session = s;
    // The server's usage totals of the whole session as of its last_seq
    // (an extension; absent while there is no usage, or from a server
    // without it): the header adds the usage events after it.
    if (s && s.usage && Number.isInteger(s.last_seq)) this.usageBase = { totals: s.usage, at: s.last_seq };
    this.titleEl.textContent = visible(s.title) || 'Untitled session';
    this.renderTitle();
    if (s.role) this.setRole(s.role);
    this.renderUsage();
  }

  // refreshSession reads the Session object again when an event says
  // something the page shows from it changed: which sandbox runs the
  // session (its kind is reported only once a sandbox exists). At most
  // once every 10 s.
  refreshSession() {
    if (this.refreshing || this.stopped || Date.now() - (this.refreshedAt || 0) < 10000) return;
    this.refreshing = true;
    this.refreshedAt = Date.now();
    api.getSession(this.id)
      .then((s) => { if (!this.stopped) this.setSession({ ...s, role: this.role || s.role }); })
      .catch(() => {})
      .finally(() => { this.refreshing = false; this.scheduleStatus(); });
  }

  setRole(role) {
    const changed = role !== this.role;
    this.role = role || '';
    this.roleEl.hidden = !this.role;
    this.roleEl.textContent = this.role;
    const drive = !this.fatal && rank(this.role) >= 2;
    this.composer.hidden = !drive;
    this.viewerNote.hidden = drive || this.fatal !== '' || !this.role;
    this.shareBtn.hidden = this.fatal !== '' || rank(this.role) < 3;
    this.manageBtn.hidden = this.shareBtn.hidden;
    if (this.manageBtn.hidden) this.manage.close();
    if (changed && this.timeline) this.timeline.refresh(); // approval buttons follow the role
    this.renderStatus();
  }

  hello(f) {
    if (this.session && f.session && f.session.epoch && this.session.epoch && f.session.epoch !== this.session.epoch) {
      // The log was rebuilt: what the page holds no longer matches it.
      toast('The session history was rebuilt; reloading it.');
      this.setSession(f.session);
      this.startFrom(Math.max(0, f.last_seq - PAGE), f.session);
      return;
    }
    const behind = (f.last_seq || 0) - this.model.store.hi;
    if (this.model.store.size > 0 && behind > FAR_BEHIND && this.timeline.following && !this.fatal) {
      this.setSession({ ...f.session, role: (f.you && f.you.role) || f.session.role });
      this.startFrom(Math.max(0, f.last_seq - PAGE), f.session);
      return;
    }
    if (f.you && f.you.user) {
      this.me = f.you.user;
      this.app.setMe(f.you.user);
    }
    this.setSession({ ...f.session, role: (f.you && f.you.role) || f.session.role });
    this.catchUp = f.last_seq;
    if (this.model.store.hi >= this.catchUp) this.caught();
    for (const [cid, o] of this.outbox) {
      if (o.state === 'sending') { o.state = 'checking'; o.checkSeq = f.last_seq; }
      if (o.state === 'waiting') this.sendPrompt(cid, o);
    }
    this.renderQueue();
  }

  event(ev) {
    this.model.add(ev);
    this.timeline.changed();
    const d = ev.data || {};
    const m = this.model;
    switch (ev.kind) {
      case 'message':
        if (d.client_id && this.outbox.delete(d.client_id)) this.renderQueue();
        if (this.caughtUp && ev.by !== this.me) this.said = `${ev.by} sent a prompt`;
        break;
      case 'turn_started':
        this.timeline.update(d.prompt_seq);
        this.confirmDlg.close();
        break;
      case 'turn_finished': {
        const st = m.started.get(d.turn);
        if (st) this.timeline.update(st.prompt_seq);
        for (const seq of m.approvalsOfTurn.get(d.turn) || []) this.timeline.update(seq);
        for (const [id, st] of this.streams) if (st.turn === d.turn) this.endStream(id);
        this.ws.changed();
        if (this.caughtUp) {
          this.said = `Turn ${d.turn} ${d.status}`;
          if (document.hidden) {
            this.attention = 'finished';
            this.finishedTurn = d.turn;
          }
          this.notify(`Turn ${d.turn} ${d.status === 'ok' ? 'finished' : d.status}`, (this.session && this.session.title) || '');
        }
        break;
      }
      case 'approval_requested':
        if (this.caughtUp) {
          this.said = `Approval requested: ${d.title || d.summary || d.id}`;
          if (rank(this.role) >= 2) this.notify('Approval needed', d.title || d.summary || d.id);
        }
        break;
      case 'tool_call_update': {
        const tc = m.toolCalls.get(d.id);
        if (tc && tc.seq !== null) this.timeline.update(tc.seq);
        break;
      }
      case 'plan': {
        const list = m.plans.get(d.turn) || [];
        for (const seq of list) if (seq !== ev.seq) this.timeline.update(seq);
        break;
      }
      case 'usage': // the status render (scheduled below) shows the totals
        break;
      case 'sandbox':
        if (this.caughtUp && d.state && d.state !== 'stopped' && !(this.session && this.session.sandbox && this.session.sandbox.kind)) this.refreshSession();
        break;
      case 'files_changed':
        this.ws.changed();
        break;
      case 'agent_message':
        this.endStream(d.message_id);
        break;
      case 'approval_resolved': {
        const seq = m.approvalRow(d.turn, d.id);
        if (seq !== undefined) this.timeline.update(seq);
        break;
      }
      case 'member_changed':
        if (d.user === this.me) this.setRole(d.role === 'none' ? '' : d.role);
        if (this.dialog.open) this.renderMembers();
        break;
    }
    if (!this.caughtUp && ev.seq >= this.catchUp && this.catchUp > 0) this.caught();
    this.checkOutbox();
    this.scheduleStatus();
  }

  // caught runs once the page has every event up to the hello's last_seq.
  caught() {
    if (this.caughtUp) return;
    this.caughtUp = true;
    if (!this.model.exact()) this.backfill();
  }

  // backfill reads older events until the session's state is known.
  async backfill() {
    if (this.backfilling) return;
    this.backfilling = true;
    try {
      while (!this.stopped && !this.model.exact() && this.model.store.lo > 1) {
        if (!(await this.readOlder(BACKFILL_PAGE))) break;
      }
    } finally {
      this.backfilling = false;
    }
    this.timeline.refresh();
    this.scheduleStatus();
  }

  /**
   * readOlder reads up to n events before the store's first into the
   * model. It returns whether it read any. Reads run one at a time.
   */
  readOlder(n) {
    const run = async () => {
      const model = this.model;
      const lo = model.store.lo;
      if (lo <= 1 || this.stopped) return false;
      const after = Math.max(0, lo - 1 - n);
      const got = [];
      let from = after;
      try {
        while (from < lo - 1) {
          const page = await api.events(this.id, from, Math.min(1000, lo - 1 - from));
          const evs = (page.events || []).filter((ev) => ev.seq > from && ev.seq < lo);
          if (!evs.length) break;
          got.push(...evs);
          from = evs[evs.length - 1].seq;
        }
      } catch (err) {
        if (err.status === 401) this.app.login();
        else toast(`Could not read older events: ${err.message}`, 'error');
        return false;
      }
      if (this.stopped || model !== this.model || model.store.lo !== lo) return false;
      // Keep only a run that ends right before lo, with no gap.
      let i = got.length - 1;
      if (i < 0 || got[i].seq !== lo - 1) return false;
      while (i > 0 && got[i - 1].seq === got[i].seq - 1) i--;
      model.addOlder(got.slice(i));
      this.timeline.changed();
      return true;
    };
    const p = this.reading.then(run, run);
    this.reading = p.catch(() => false);
    return p;
  }

  ack(f) {
    const o = this.outbox.get(f.client_id);
    if (!o) return;
    o.state = 'acked';
    o.seq = f.seq;
    if (this.model.store.hi >= f.seq) this.outbox.delete(f.client_id); // its message event is here already
    this.renderQueue();
  }

  frameError(f) {
    // Before its hello, a connection's error is about the connection, and
    // how the server closes it says what to do (see Stream.closed).
    if (!f.client_id && this.stream && !this.stream.connected) return;
    const o = f.client_id && this.outbox.get(f.client_id);
    if (o) {
      o.state = 'failed';
      o.message = f.message;
      this.renderQueue();
    } else if (f.client_id && f.client_id.startsWith('a-')) {
      toast(`Could not answer the approval: ${f.message}`, 'error');
      this.timeline.refresh();
    } else {
      toast(f.message || f.code, 'error');
    }
    if (f.code === 'forbidden') this.refreshRole();
  }

  async refreshRole() {
    try {
      const s = await api.getSession(this.id);
      if (!this.stopped) this.setSession(s);
    } catch {
      // The stream reports lasting trouble.
    }
  }

  // check is asked when a connection failed before its hello.
  async check() {
    try {
      const s = await api.getSession(this.id);
      if (!this.stopped) this.setSession(s);
      return true;
    } catch (err) {
      if (err.status === 401) {
        this.stopStream();
        this.app.login();
        return false;
      }
      if (err.status === 404 || err.status === 403) {
        this.end('This session does not exist any more, or you no longer have access to it.', true);
        return false;
      }
      return true; // the server is unreachable: keep retrying
    }
  }

  setConn(s) {
    this.conn = s;
    this.renderConn();
  }

  renderConn() {
    const s = this.conn;
    let text = statusText[s.state] || s.state;
    if (s.state === 'waiting') {
      const secs = Math.max(0, Math.ceil((s.retryAt - Date.now()) / 1000));
      text = secs > 0 ? `Reconnecting in ${secs} s` : 'Reconnecting…';
    }
    if (s.state === 'closed' && this.fatal) text = 'Disconnected';
    this.connEl.dataset.state = s.state;
    this.connEl.lastChild.textContent = text;
    this.retryBtn.hidden = s.state !== 'waiting';
  }

  // typed tells the others that this user is typing a prompt: a typing
  // frame at most every TYPING_EVERY_MS while the prompt box has text, and
  // a stop when it is emptied (sending the prompt ends it on the server).
  typed() {
    if (rank(this.role) < 2 || this.fatal || !this.stream) return;
    if (!this.promptEl.value.trim()) {
      if (this.typingSent && this.stream.send({ type: 'typing', typing: false })) this.typingSent = 0;
      return;
    }
    const now = Date.now();
    if (this.typingSent && now - this.typingSent < TYPING_EVERY_MS) return;
    if (this.stream.send({ type: 'typing' })) this.typingSent = now;
  }

  setPresence(watchers) {
    const byUser = new Map();
    for (const w of watchers) {
      if (!w || typeof w.user !== 'string') continue;
      const p = byUser.get(w.user) || { user: w.user, conns: 0, since: w.since, typing: false };
      p.conns++;
      if (w.since < p.since) p.since = w.since;
      if (w.typing === true) p.typing = true;
      byUser.set(w.user, p);
    }
    const people = [...byUser.values()].sort((a, b) => (a.user === this.me ? -1 : b.user === this.me ? 1 : a.user.localeCompare(b.user)));
    this.presence = people;
    this.presenceEl.replaceChildren(...people.map((p) => {
      const label = `${p.user}${p.user === this.me ? ' (you)' : ''}${p.conns > 1 ? `, ${p.conns} tabs` : ''}`;
      return h('li', { title: `${label}${p.typing ? ', typing' : ''}`, class: p.typing ? 'typing' : '', data: { user: p.user } },
        avatar(p.user), h('span', { class: 'name', text: p.user }),
        p.typing ? h('span', { class: 'pen', attrs: { 'aria-hidden': 'true' }, text: '✎' }) : null,
        h('span', { class: 'sr-only', text: `${label.slice(p.user.length)}${p.typing ? ', typing' : ''}` }));
    }));
    this.renderTyping();
  }

  // renderTyping says who else is typing a prompt, above the prompt box.
  renderTyping() {
    const who = this.presence.filter((p) => p.typing && p.user !== this.me).map((p) => p.user);
    let text = '';
    if (who.length === 1) text = `${who[0]} is typing…`;
    else if (who.length === 2) text = `${who[0]} and ${who[1]} are typing…`;
    else if (who.length > 2) text = `${who[0]}, ${who[1]} and ${plural(who.length - 2, 'other')} are typing…`;
    this.typingEl.hidden = !text;
    if (this.typingEl.textContent !== text) this.typingEl.textContent = text;
  }

  scheduleStatus() {
    if (this.statusTimer) return;
    this.statusTimer = requestAnimationFrame(() => {
      this.statusTimer = null; // cancels a scheduled status render
      if (this.said) { // a burst of events announces its last news only
        this.announce(this.said);
        this.said = '';
      }
      this.renderStatus();
      this.renderQueue();
      this.renderUsage();
    });
  }

  tick() {
    if (this.conn.state === 'waiting') this.renderConn();
    if (this.model && this.model.running) this.renderStatus();
  }

  renderStatus() {
    const m = this.model;
    if (!m) return;
    const sb = m.sandbox;
    this.sandboxEl.hidden = !sb;
    const sbText = sb === 'none' ? 'No sandbox yet' : `Sandbox ${sb}${sandboxWhere(this.session)}`;
    if (this.sandboxEl.textContent !== sbText) this.sandboxEl.textContent = sbText;
    this.sandboxEl.dataset.state = sb || '';
    const r = m.running;
    let text;
    let state;
    if (r) {
      const waiting = r.approvals.size > 0;
      const since = r.time ? Date.now() - new Date(r.time).getTime() : 0;
      text = `Turn ${r.turn} ${waiting ? 'waiting for approval' : 'running'}${r.partial ? '' : ` · ${duration(Math.max(0, since))}`}${r.by && r.by !== 'system' ? ` · ${r.by}` : ''}`;
      state = waiting ? 'waiting' : 'running';
    } else if (m.lastFinished) {
      const f = m.lastFinished;
      text = `Idle · turn ${f.turn} ${f.status}${f.duration_ms ? ` in ${duration(f.duration_ms)}` : ''}`;
      state = f.status;
    } else {
      text = m.exact() ? 'Idle · no turns yet' : 'Idle';
      state = 'idle';
    }
    this.turnEl.textContent = text;
    this.turnEl.dataset.state = state;
    this.cancelTop.hidden = !r || this.fatal !== '' || rank(this.role) < 2;
    const waiting = !!(r && r.approvals.size > 0 && rank(this.role) >= 2 && !this.fatal);
    if (waiting) this.attention = 'approval';
    else if (this.attention === 'approval') this.attention = '';
    this.renderTitle();
  }

  // renderTitle puts what needs the reader in the tab's title.
  renderTitle() {
    const title = (this.session && this.session.title) || 'Untitled session';
    let prefix = '';
    if (this.attention === 'approval') prefix = '(!) Approval needed · ';
    else if (this.attention === 'finished') prefix = `✓ Turn ${this.finishedTurn} done · `;
    const t = `${prefix}${title} · Atrium`;
    if (document.title !== t) document.title = t;
  }

  renderUsage() {
    if (!this.usageEl) return;
    const m = this.model;
    const base = this.usageBase;
    let u;
    let all;
    if (m && base) {
      // The server's totals as of base.at, and the usage events after it.
      const t = base.totals;
      const after = m.usageAfter(base.at);
      const n = (x) => (Number.isFinite(Number(x)) && Number(x) > 0 ? Number(x) : 0);
      u = { input: n(t.input_tokens) + after.input, output: n(t.output_tokens) + after.output, cached: n(t.cached_tokens) + after.cached, cost: n(t.cost_usd) + after.cost };
      all = true;
    } else if (m && m.usageTotal.events) {
      u = m.usageTotal;
      all = m.store.lo <= 1 || m.foldFrom <= 1;
    } else {
      this.usageEl.hidden = true;
      return;
    }
    this.usageEl.hidden = false;
    const text = `${all ? '' : '≥ '}${usageText(u)}`;
    if (this.usageEl.textContent !== text) this.usageEl.textContent = text;
    this.usageEl.title = all ? 'Tokens and cost of this session' : 'Tokens and cost of the events loaded so far';
  }

  // --- needs you: browser notifications ------------------------------------

  notifyOn() {
    try {
      return 'Notification' in window && Notification.permission === 'granted' && localStorage.getItem(NOTIFY_KEY) === '1';
    } catch {
      return false;
    }
  }

  renderNotify() {
    if (!('Notification' in window)) return;
    const on = this.notifyOn();
    this.notifyBtn.textContent = on ? 'Notifications on' : 'Notify me';
    this.notifyBtn.setAttribute('aria-pressed', on ? 'true' : 'false');
    this.notifyBtn.title = Notification.permission === 'denied'
      ? 'Notifications are blocked for this site in the browser\'s settings'
      : 'Notify me when an approval waits or a turn finishes while this tab is in the background';
  }

  async toggleNotify() {
    try {
      if (this.notifyOn()) {
        localStorage.removeItem(NOTIFY_KEY);
      } else {
        const p = Notification.permission === 'granted' ? 'granted' : await Notification.requestPermission();
        if (p === 'granted') localStorage.setItem(NOTIFY_KEY, '1');
        else toast('The browser did not allow notifications for this site.', 'error');
      }
    } catch {
      toast('Notifications are not available here.', 'error');
    }
    this.renderNotify();
  }

  // notify shows a browser notification while the tab is in the background.
  notify(title, body) {
    if (!document.hidden || !this.notifyOn()) return;
    try {
      const n = new Notification(title, { body: visible(body).slice(0, 200), tag: `atrium-${this.id}` });
      n.onclick = () => { window.focus(); n.close(); };
    } catch {
      // Some browsers allow notifications from a service worker only.
    }
  }

  // --- streaming agent text -------------------------------------------------

  delta(f) {
    if (!this.model || typeof f.message_id !== 'string' || !f.message_id) return;
    if (this.model.messageIDs.has(f.message_id)) return; // its agent_message is here
    let st = this.streams.get(f.message_id);
    if (!st) {
      const done = h('div', { class: 'md-done' });
      const tail = h('div', { class: 'md-tail' });
      const el = h('article', { class: ['agent-msg', 'streaming'], data: { message: f.message_id }, attrs: { 'aria-label': 'Agent message being written' } },
        h('div', { class: 'meta' }, h('span', { class: 'avatar agent', attrs: { 'aria-hidden': 'true' }, text: '◆' }),
          h('strong', { class: 'who', text: 'Agent' }), h('span', { class: 'dim writing', text: 'writing…' })),
        done, tail);
      st = { turn: f.turn, text: '', el, done, tail, doneLen: 0, timer: null, last: 0 };
      this.streams.set(f.message_id, st);
      this.liveEl.appendChild(el);
    }
    st.text += f.text;
    if (st.timer === null) {
      // At most STREAM_RENDERS_PER_S renders a second, however fast the deltas come.
      const wait = Math.max(0, st.last + 1000 / STREAM_RENDERS_PER_S - performance.now());
      st.timer = setTimeout(() => this.renderStream(st), wait);
    }
  }

  // renderStream shows a streaming message: the blocks before its last
  // blank line outside a code fence are rendered once and kept; only the
  // block being written is rendered again.
  renderStream(st) {
    st.timer = null;
    st.last = performance.now();
    const text = visible(st.text);
    let cut = text.lastIndexOf('\n\n');
    while (cut > st.doneLen && (text.slice(0, cut).match(/^\s*(```|~~~)/gm) || []).length % 2 === 1) {
      cut = text.lastIndexOf('\n\n', cut - 1); // inside an open code block
    }
    if (cut > st.doneLen) {
      st.done.append(...md.render(text.slice(st.doneLen, cut)).childNodes);
      st.doneLen = cut;
    }
    st.tail.replaceChildren(md.render(text.slice(st.doneLen)));
    if (this.timeline && this.timeline.following) this.timeline.toBottom();
  }

  endStream(id) {
    const st = this.streams.get(id);
    if (!st) return;
    clearTimeout(st.timer);
    st.el.remove();
    this.streams.delete(id);
  }

  clearStreams() {
    for (const id of [...this.streams.keys()]) this.endStream(id);
  }

  renderQueue() {
    if (!this.model) return;
    const m = this.model;
    const head = m.pendingHead(5);
    const rest = m.pending.size - head.length;
    const items = head.map((ev) => h('li', { class: 'queued', data: { seq: ev.seq } },
      avatar(ev.by), h('span', { class: 'who', text: ev.by }), h('span', { class: 'text', text: firstLine(ev.data.text) })));
    if (rest > 0) items.push(h('li', { class: 'more', text: `and ${plural(rest, 'more prompt')}` }));
    for (const [cid, o] of this.outbox) {
      if (o.state === 'acked' && m.store.hi >= o.seq) continue;
      const label = {
        waiting: 'waiting for the connection', sending: 'sending…', acked: 'queued', checking: 'checking…',
        unconfirmed: 'not confirmed', failed: `not sent: ${o.message || 'error'}`,
      }[o.state];
      const li = h('li', { class: ['mine', `o-${o.state}`], data: { client: cid } },
        avatar(this.me || '?'), h('span', { class: 'who', text: this.me || 'you' }),
        h('span', { class: 'text', text: firstLine(o.text) }), h('span', { class: 'state', text: label }));
      if (o.state === 'unconfirmed' || o.state === 'failed') {
        li.appendChild(h('button', { type: 'button', class: 'link', text: 'Resend', on: { click: () => this.resend(cid) } }));
        li.appendChild(h('button', { type: 'button', class: 'link', text: 'Dismiss', on: { click: () => { this.outbox.delete(cid); this.renderQueue(); } } }));
      }
      items.push(li);
    }
    const count = m.pending.size + [...this.outbox.values()].filter((o) => o.state !== 'failed' && o.state !== 'unconfirmed').length;
    this.queueEl.hidden = items.length === 0;
    this.queueEl.replaceChildren(
      h('h2', { id: 'queue-h', text: count ? `Queued · ${count.toLocaleString()}` : 'Not sent' }),
      h('ol', { attrs: { 'aria-labelledby': 'queue-h' } }, items));
  }

  // checkOutbox marks prompts sent before a lost connection as unconfirmed
  // once the page has caught up past the hello that followed, without
  // seeing them.
  checkOutbox() {
    let changed = false;
    for (const o of this.outbox.values()) {
      if (o.state === 'checking' && this.model.store.hi >= o.checkSeq) {
        o.state = 'unconfirmed';
        changed = true;
      }
    }
    if (changed) this.renderQueue();
  }

  submit() {
    const text = this.promptEl.value;
    if (!text.trim()) return;
    if (new TextEncoder().encode(text).length > MAX_TEXT) {
      toast('That prompt is longer than 256 KiB; shorten it or put it in a file.', 'error');
      return;
    }
    const cid = `p-${randomID()}`;
    const o = { text, state: 'waiting' };
    this.outbox.set(cid, o);
    this.sendPrompt(cid, o);
    this.promptEl.value = '';
    this.typingSent = 0; // the prompt ended the typing on the server
    this.renderQueue();
  }

  sendPrompt(cid, o) {
    if (this.stream && this.stream.send({ type: 'prompt', text: o.text, client_id: cid })) o.state = 'sending';
    else o.state = 'waiting';
  }

  resend(cid) {
    const o = this.outbox.get(cid);
    if (!o) return;
    this.outbox.delete(cid);
    const ncid = `p-${randomID()}`;
    const n = { text: o.text, state: 'waiting' };
    this.outbox.set(ncid, n);
    this.sendPrompt(ncid, n);
    this.renderQueue();
  }

  /**
   * cancel stops the running turn; a turn someone else started (or whose
   * starter is not known) asks first.
   */
  cancel() {
    const r = this.model && this.model.running;
    if (!r || rank(this.role) < 2) return;
    if (r.by !== this.me) {
      this.confirmText.textContent = r.by
        ? `Turn ${r.turn} was started by ${r.by}. Stop it for everyone?`
        : `Turn ${r.turn} may have been started by someone else. Stop it for everyone?`;
      this.confirmYes.textContent = r.by ? `Cancel ${r.by}'s turn` : 'Cancel the turn';
      this.confirmTurn = r.turn;
      if (!this.confirmDlg.open) this.confirmDlg.showModal();
      this.confirmNo.focus();
      return;
    }
    this.cancelNow();
  }

  buildConfirm() {
    this.confirmText = h('p', { id: 'confirm-cancel-text' });
    this.confirmYes = h('button', { type: 'button', class: 'danger', id: 'confirm-cancel-yes', text: 'Cancel the turn', on: { click: () => {
      const turn = this.confirmTurn;
      dlg.close();
      if (this.model && this.model.running && this.model.running.turn === turn) this.cancelNow();
    } } });
    this.confirmNo = h('button', { type: 'button', id: 'confirm-cancel-no', text: 'Keep it running', on: { click: () => dlg.close() } });
    const dlg = h('dialog', { class: 'confirm', id: 'confirm-cancel', attrs: { 'aria-labelledby': 'confirm-cancel-h', 'aria-describedby': 'confirm-cancel-text' } },
      h('h2', { id: 'confirm-cancel-h', text: 'Cancel someone else\'s turn?' }),
      this.confirmText,
      h('div', { class: 'actions' }, this.confirmNo, this.confirmYes));
    return dlg;
  }

  async cancelNow() {
    if (!this.model || !this.model.running || rank(this.role) < 2) return;
    if (this.stream && this.stream.send({ type: 'cancel', client_id: `c-${randomID()}` })) {
      this.announce('Cancel requested');
      toast(`Cancelling turn ${this.model.running.turn}…`);
      return;
    }
    try {
      await api.cancel(this.id);
      toast(`Cancelling turn ${this.model.running ? this.model.running.turn : ''}…`);
    } catch (err) {
      toast(`Could not cancel: ${err.message}`, 'error');
    }
  }

  async approve(btn) {
    const turn = Number(btn.dataset.turn);
    const id = btn.dataset.id;
    const allow = btn.dataset.approve === 'allow';
    const option = btn.dataset.option || '';
    for (const b of btn.parentElement.querySelectorAll('button')) b.disabled = true;
    btn.textContent = option ? `${btn.textContent}…` : allow ? 'Allowing…' : 'Denying…';
    const frame = { type: 'approve', id, allow, client_id: `a-${turn}-${randomID()}` };
    if (option) frame.option_id = option;
    if (this.stream && this.stream.send(frame)) return;
    try {
      await api.approve(this.id, id, allow, option);
    } catch (err) {
      toast(`Could not answer the approval: ${err.message}`, 'error');
      const seq = this.model.approvalRow(turn, id);
      if (seq !== undefined) this.timeline.update(seq);
    }
  }

  clickRow(e) {
    const btn = e.target.closest('button');
    if (!btn || !this.rowsEl.contains(btn)) return;
    if (btn.dataset.approve) return this.approve(btn);
    if (btn.dataset.changes) {
      this.ws.changes(Number(btn.dataset.changes));
      this.filesBtn.setAttribute('aria-expanded', 'true');
      return;
    }
    if (btn.dataset.fork) return this.forkAt(Number(btn.dataset.fork), Number(btn.dataset.turn), btn);
    const row = btn.closest('.ev');
    if (!row) return;
    const seq = Number(row.dataset.seq);
    if (btn.dataset.more) this.expanded.add(seq);
    else if (btn.dataset.less) this.expanded.delete(seq);
    else return;
    this.timeline.reshape(seq);
    const again = this.rowsEl.querySelector(`.ev[data-seq="${seq}"] button.more`);
    if (again) again.focus();
  }

  key(e) {
    if (e.key !== 'Escape' || e.defaultPrevented || e.isComposing) return;
    if (document.querySelector('dialog[open]')) return; // the dialog closes itself
    if (this.model && this.model.running && rank(this.role) >= 2 && !this.fatal) {
      e.preventDefault();
      this.cancel();
    }
  }

  // forkAt makes a new session from this one as of seq (the end of a
  // turn) and opens it.
  async forkAt(seq, turn, btn) {
    btn.disabled = true;
    const title = `${(this.session && this.session.title) || 'Untitled session'}`;
    const suffix = ` (fork at turn ${turn})`;
    const bytes = new TextEncoder();
    let t = title;
    while (bytes.encode(t + suffix).length > 256) t = t.slice(0, -1);
    try {
      const s = await api.fork(this.id, seq, t + suffix);
      toast(`Forked as "${s.title}"`);
      this.app.navigate(`/s/${encodeURIComponent(s.id)}`);
    } catch (err) {
      btn.disabled = false;
      if (err.status === 401) return this.app.login();
      toast(`Could not fork: ${err.message}`, 'error');
    }
  }

  announce(text) {
    this.announcer.textContent = text;
  }

  /** end shows why the page cannot go on; fatal ones stop the stream. */
  end(message, fatal) {
    this.banner.hidden = false;
    this.banner.replaceChildren(h('p', { text: message }), h('a', { href: '/', data: { nav: '' }, text: 'Back to all sessions' }));
    if (fatal) {
      this.fatal = message;
      this.stopStream();
      this.setConn({ state: 'closed' });
      this.setRole(this.role);
      if (this.timeline) this.timeline.refresh();
    }
  }

  stopStream() {
    if (this.stream) this.stream.stop();
  }

  // --- sharing ------------------------------------------------------------

  buildShare() {
    this.memberList = h('ul', { class: 'members', id: 'members' });
    this.memberNote = h('p', { class: 'dim', id: 'members-note' });
    this.shareError = h('p', { class: 'error', attrs: { role: 'alert' } });
    const user = h('input', { id: 'share-user', name: 'user', required: true, maxLength: 128, autocomplete: 'off', spellcheck: false });
    const role = h('select', { id: 'share-role', name: 'role' }, ROLES.map((r) => h('option', { value: r, text: r })));
    role.value = 'driver';
    const add = h('form', { class: 'add-member', id: 'share-add', on: { submit: (e) => {
      e.preventDefault();
      const u = user.value.trim();
      if (u) this.putMember(u, role.value).then((ok) => { if (ok) { user.value = ''; user.focus(); } });
    } } },
    h('div', { class: 'field' }, h('label', { htmlFor: 'share-user', text: 'User' }), user),
    h('div', { class: 'field' }, h('label', { htmlFor: 'share-role', text: 'Role' }), role),
    h('button', { type: 'submit', class: 'primary', text: 'Add' }));
    // Deleting asks twice: the first click shows what it does.
    const sure = h('div', { class: 'delete-confirm', hidden: true },
      h('p', { text: 'The session, its history and its workspace are deleted for everyone. This cannot be undone.' }),
      h('button', { type: 'button', class: 'danger', id: 'delete-confirm', text: 'Delete for everyone', on: { click: () => this.deleteSession() } }),
      ' ', h('button', { type: 'button', text: 'Keep it', on: { click: () => { sure.hidden = true; } } }));
    const dlg = h('dialog', { class: 'share', id: 'share', attrs: { 'aria-labelledby': 'share-h' } },
      h('div', { class: 'dlg-head' },
        h('h2', { id: 'share-h', text: 'Share and manage' }),
        h('button', { type: 'button', class: 'close', attrs: { 'aria-label': 'Close' }, text: '×', on: { click: () => dlg.close() } })),
      h('p', { class: 'hint', text: 'Viewers watch. Drivers also prompt, cancel and answer approvals. Owners also manage members.' }),
      add, this.shareError,
      h('h3', { text: 'Members' }), this.memberNote, this.memberList,
      h('h3', { text: 'Delete' }),
      h('button', { type: 'button', class: 'danger small', id: 'delete-session', text: 'Delete this session…', on: { click: () => { sure.hidden = false; } } }),
      sure);
    return dlg;
  }

  async openShare() {
    this.shareError.textContent = '';
    this.renderMembers();
    this.dialog.showModal();
    this.dialog.querySelector('#share-user').focus();
    if (!this.members() && !this.scanning) {
      this.scanning = true;
      try {
        this.scanned = await this.scanMembers();
      } catch (err) {
        this.shareError.textContent = `Could not read the members: ${err.message}`;
      } finally {
        this.scanning = false;
      }
      this.renderMembers();
    }
  }

  // members returns the members as a Map user → role, or null while unknown.
  members() {
    const s = this.session || {};
    const m = new Map();
    if (s.members && typeof s.members === 'object') { // a server that lists them
      for (const [u, r] of Array.isArray(s.members) ? s.members.map((x) => [x.user, x.role]) : Object.entries(s.members)) m.set(u, r);
    } else if (this.model && this.model.membersExact()) {
      // The log from its first event: member_changed says it all.
    } else if (this.scanned && this.scanned.upTo >= this.model.foldFrom - 1) {
      for (const c of this.scanned.log) apply(m, c);
    } else {
      return null;
    }
    if (this.model) {
      // A server's list is as of the session's last_seq: later changes apply on top.
      const since = s.members ? (s.last_seq || 0) : 0;
      for (const c of this.model.memberLog) if (!c.seq || c.seq > since) apply(m, c);
    }
    if (s.owner) m.set(s.owner, 'owner');
    return m;
  }

  // scanMembers reads member_changed events older than what the model folded.
  async scanMembers() {
    const upTo = this.model.foldFrom - 1;
    const log = [];
    let from = 0;
    while (from < upTo) {
      const page = await api.events(this.id, from, Math.min(1000, upTo - from));
      const evs = (page.events || []).filter((ev) => ev.seq > from && ev.seq <= upTo);
      if (!evs.length) break;
      for (const ev of evs) if (ev.kind === 'member_changed') log.push({ user: ev.data.user, role: ev.data.role || 'none' });
      from = evs[evs.length - 1].seq;
    }
    return { upTo, log };
  }

  renderMembers() {
    const m = this.members();
    if (!m) {
      this.memberNote.textContent = 'Reading the members…';
      this.memberList.replaceChildren();
      return;
    }
    this.memberNote.textContent = '';
    const owner = this.session && this.session.owner;
    const users = [...m.keys()].sort((a, b) => (a === owner ? -1 : b === owner ? 1 : a.localeCompare(b)));
    this.memberList.replaceChildren(...users.map((u) => {
      const li = h('li', { data: { user: u } }, avatar(u), h('span', { class: 'name', text: u }));
      if (u === owner) {
        li.appendChild(h('span', { class: 'dim', text: 'owner · created the session' }));
        return li;
      }
      const sel = h('select', { attrs: { 'aria-label': `Role of ${u}` }, on: { change: () => this.putMember(u, sel.value) } },
        ROLES.map((r) => h('option', { value: r, text: r })));
      sel.value = m.get(u);
      li.append(sel, h('button', { type: 'button', class: 'link danger', text: 'Remove', attrs: { 'aria-label': `Remove ${u}` }, on: { click: () => this.putMember(u, 'none') } }));
      return li;
    }));
  }

  async deleteSession() {
    try {
      await api.deleteSession(this.id);
    } catch (err) {
      if (err.status === 401) return this.app.login();
      this.shareError.textContent = `Could not delete the session: ${err.message}`;
      return;
    }
    this.dialog.close();
    toast('Session deleted');
    this.app.navigate('/');
  }

  async putMember(user, role) {
    this.shareError.textContent = '';
    try {
      await api.setMember(this.id, user, role);
      this.announce(role === 'none' ? `Removed ${user}` : `${user} is now ${role}`);
      return true;
    } catch (err) {
      if (err.status === 401) this.app.login();
      this.shareError.textContent = err.message;
      return false;
    }
  }

  /** unmount stops the stream and timers and forgets the page. Safe twice. */
  unmount() {
    this.stopped = true;
    this.stopStream();
    if (this.timeline) this.timeline.destroy();
    clearInterval(this.ticker);
    if (this.statusTimer) cancelAnimationFrame(this.statusTimer);
    document.removeEventListener('keydown', this.onKey);
    document.removeEventListener('visibilitychange', this.onVisible);
    this.clearStreams();
    if (this.dialog.open) this.dialog.close();
    if (this.confirmDlg.open) this.confirmDlg.close();
    this.manage.close();
    document.title = 'Atrium';
  }
}

function apply(m, c) {
  if (c.role === 'none' || !c.role) m.delete(c.user);
  else m.set(c.user, c.role);
}

// sandboxWhere says where the session's sandbox runs (" · local", " · VM
// host-1"), from the fields beside state that a server may report in the
// Session object's sandbox; "" when it reports none.
function sandboxWhere(s) {
  const sb = (s && s.sandbox) || {};
  const parts = [];
  for (const k of ['kind', 'provider', 'host', 'node']) {
    if (typeof sb[k] === 'string' && sb[k] && !parts.includes(sb[k])) parts.push(visible(sb[k]).slice(0, 60));
  }
  return parts.length ? ` · ${parts.join(' ')}` : '';
}

function firstLine(text) {
  const t = String(text || '').trim();
  const i = t.indexOf('\n');
  const line = i < 0 ? t : `${t.slice(0, i)} …`;
  return line.length > 140 ? `${line.slice(0, 139)}…` : line;
}
