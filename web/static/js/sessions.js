// sessions.js: the sessions page (/): the sessions the caller may see, with
// search and filters kept in the address (?q=&state=&role=), and the form
// that creates a session.

import { h, ago, plural, later } from './dom.js';
import * as api from './api.js';

// REFRESH is the time between list refreshes while the page shows: there is
// no push of the list, so a session shared with the reader (or created in
// another tab) appears within this long. One small GET per interval, and
// none while the tab is hidden.
const REFRESH = 10000;

// Harness templates a new session can use. `shell` is built in (DESIGN §6);
// other templates are configured per node and can be typed in.
const TEMPLATES = [{ name: 'shell', label: 'shell: runs each prompt with bash' }];

/** SessionsPage is mounted by the router; unmount() releases what it started. */
export class SessionsPage {
  constructor(root, app) {
    this.root = root;
    this.app = app;
    this.all = null;
    this.fresh = new Set(); // ids of sessions that appeared while the page was open
    const q = new URLSearchParams(location.search);
    this.filters = { q: q.get('q') || '', state: q.get('state') || '', role: q.get('role') || '' };
    this.build();
    this.onVisible = () => { if (!document.hidden) this.load(); };
    document.addEventListener('visibilitychange', this.onVisible);
    this.timer = setInterval(() => { if (!document.hidden) this.load(); }, REFRESH);
  }

  build() {
    document.title = 'Sessions · Atrium';
    this.titleInput = h('input', { id: 'new-title', name: 'title', maxLength: 256, autocomplete: 'off', placeholder: 'What are you working on?' });
    this.harness = h('select', { id: 'new-harness', name: 'harness' },
      TEMPLATES.map((t) => h('option', { value: t.name, text: t.label })));
    this.permission = h('select', { id: 'new-permission', name: 'permission_mode' },
      [['', 'ask (the server default)'], ['ask', 'ask before risky actions'], ['auto-edit', 'auto-edit: edits without asking'], ['auto', 'auto: never ask']]
        .map(([v, t]) => h('option', { value: v, text: t })));
    this.permissionField = h('div', { class: 'field', hidden: true },
      h('label', { htmlFor: 'new-permission', text: 'Permissions' }), this.permission);
    this.harness.addEventListener('change', () => { this.permissionField.hidden = !this.harness.value.startsWith('agent:'); });
    this.loadAgents();
    this.createError = h('p', { class: 'error', id: 'create-error', attrs: { role: 'alert' } });
    this.createBtn = h('button', { type: 'submit', class: 'primary', id: 'create', text: 'Create session' });
    const create = h('form', { class: 'create card', id: 'create-form', attrs: { 'aria-labelledby': 'create-h' }, on: { submit: (e) => this.create(e) } },
      h('h2', { id: 'create-h', text: 'New session' }),
      h('div', { class: 'create-row' },
        h('div', { class: 'field grow' }, h('label', { htmlFor: 'new-title', text: 'Title' }), this.titleInput),
        h('div', { class: 'field' }, h('label', { htmlFor: 'new-harness', text: 'Harness' }), this.harness),
        this.permissionField,
        this.createBtn),
      this.createError);

    this.search = h('input', { type: 'search', id: 'search', value: this.filters.q, placeholder: 'Title, owner or id', autocomplete: 'off',
      on: { input: () => this.filter({ q: this.search.value }) } });
    this.stateSel = h('select', { id: 'filter-state', on: { change: () => this.filter({ state: this.stateSel.value }) } },
      [['', 'Any state'], ['active', 'Active'], ['hibernated', 'Hibernated']].map(([v, t]) => h('option', { value: v, text: t })));
    this.roleSel = h('select', { id: 'filter-role', on: { change: () => this.filter({ role: this.roleSel.value }) } },
      [['', 'Any role'], ['owner', 'Owner'], ['driver', 'Driver'], ['viewer', 'Viewer']].map(([v, t]) => h('option', { value: v, text: t })));
    this.stateSel.value = this.filters.state;
    this.roleSel.value = this.filters.role;
    const filters = h('div', { class: 'filters', attrs: { role: 'search', 'aria-label': 'Filter sessions' } },
      h('div', { class: 'field grow' }, h('label', { htmlFor: 'search', text: 'Search' }), this.search),
      h('div', { class: 'field' }, h('label', { htmlFor: 'filter-state', text: 'State' }), this.stateSel),
      h('div', { class: 'field' }, h('label', { htmlFor: 'filter-role', text: 'My role' }), this.roleSel));

    this.count = h('p', { class: 'count dim', id: 'session-count', attrs: { 'aria-live': 'polite' }, text: 'Loading sessions…' });
    this.list = h('ul', { class: 'session-list', id: 'sessions', attrs: { 'aria-labelledby': 'sessions-h' } });
    this.root.replaceChildren(h('section', { class: 'sessions-page' },
      h('h1', { id: 'sessions-h', tabIndex: -1, text: 'Sessions' }),
      create, filters, this.count, this.list));
  }

  /** loadAgents adds the agents installed on the nodes to the harness menu, as values "agent:NAME". */
  async loadAgents() {
    let agents;
    try {
      agents = await api.listAgents();
    } catch (err) {
      return; // The shell harness still works; the list is tried again on the next visit.
    }
    if (this.stopped || !agents.length) return;
    this.harness.append(h('optgroup', { label: 'Agents (ACP)' },
      agents.map((a) => h('option', { value: `agent:${a.name}`, text: `${a.name} ${a.version}` }))));
  }

  async load() {
    if (this.loading) return;
    this.loading = true;
    try {
      const list = await api.listSessions();
      if (this.all) {
        // Sessions that were not in the previous list are marked new.
        const before = new Set(this.all.map((x) => x.id));
        for (const x of list) if (!before.has(x.id)) this.fresh.add(x.id);
      }
      this.all = list;
      if (!this.stopped) this.render();
    } catch (err) {
      if (err.status === 401) return this.app.login();
      this.count.textContent = `Could not list sessions: ${err.message}`;
    } finally {
      this.loading = false;
    }
  }

  filter(change) {
    Object.assign(this.filters, change);
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(this.filters)) if (v) q.set(k, v);
    const qs = q.toString();
    history.replaceState(history.state, '', qs ? `/?${qs}` : '/');
    if (this.pending) this.pending();
    this.pending = later(() => { this.pending = null; this.render(); });
  }

  render() {
    if (!this.all) return;
    const { q, state, role } = this.filters;
    const needle = q.trim().toLowerCase();
    const shown = this.all.filter((s) =>
      (!state || s.state === state) && (!role || s.role === role) &&
      (!needle || [s.title, s.owner, s.id].some((v) => String(v || '').toLowerCase().includes(needle))));
    if (this.all.length === 0) {
      this.count.textContent = 'No sessions yet. Create one above; it starts with the shell harness, so prompts run as bash commands.';
    } else if (shown.length === this.all.length) {
      this.count.textContent = plural(this.all.length, 'session');
    } else {
      this.count.textContent = `${plural(shown.length, 'session')} of ${this.all.length.toLocaleString()} match`;
    }
    const now = Date.now();
    this.list.replaceChildren(...shown.map((s) => {
      const activity = s.last_activity || s.updated_at;
      const when = activity ? `active ${ago(activity, now)}` : `created ${ago(s.created_at, now)}`;
      const fresh = this.fresh.has(s.id);
      return h('li', { class: ['session-item', fresh ? 'fresh' : null], data: { id: s.id } },
        h('a', { href: `/s/${encodeURIComponent(s.id)}`, class: 'title', data: { nav: '' }, text: s.title || 'Untitled session' }),
        fresh ? h('span', { class: 'badge st-running', text: s.owner && s.owner !== this.app.me ? `new · shared by ${s.owner}` : 'new' }) : null,
        h('div', { class: 'facts' },
          h('span', { class: ['pill', `state-${s.state}`], text: s.state }),
          h('span', { class: 'pill role', attrs: { 'aria-label': `my role: ${s.role}` }, text: s.role }),
          h('span', { class: 'dim', text: `by ${s.owner}` }),
          h('span', { class: 'dim', attrs: { title: activity || s.created_at }, text: when }),
          h('span', { class: 'dim', text: plural(s.last_seq || 0, 'event') })));
    }));
  }

  async create(e) {
    e.preventDefault();
    this.createError.textContent = '';
    this.createBtn.disabled = true;
    try {
      const choice = this.harness.value;
      const s = choice.startsWith('agent:')
        ? await api.createSession(this.titleInput.value.trim(), '', choice.slice('agent:'.length), this.permission.value)
        : await api.createSession(this.titleInput.value.trim(), choice);
      this.app.navigate(`/s/${encodeURIComponent(s.id)}`);
    } catch (err) {
      if (err.status === 401) return this.app.login();
      this.createError.textContent = `Could not create the session: ${err.message}`;
      this.createBtn.disabled = false;
    }
  }

  /** unmount stops refreshing. Safe twice. */
  unmount() {
    this.stopped = true;
    clearInterval(this.timer);
    if (this.pending) this.pending();
    document.removeEventListener('visibilitychange', this.onVisible);
  }
}
