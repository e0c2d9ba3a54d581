// manage.js: the owner's "Manage" dialog of a session: its title, its
// settings (whatever keys the server reports, besides the ones PATCH is
// known to take), its own egress allowlist, its secrets (names only: a value
// is written, never read back or shown), its schedules and its repository
// task. Everything goes through REST (DESIGN §7, docs/automation.md); a
// failure is shown under the part that failed, in the server's words, and
// the form keeps what was typed. Every string from the server is text, with
// control characters made visible.

import { h, toast } from './dom.js';
import * as api from './api.js';
import { visible } from './agent.js';
import { safeURL } from './markdown.js';

/** KNOWN_SETTINGS are the settings PATCH /v1/sessions/{id} takes even when the Session object reports none. */
export const KNOWN_SETTINGS = {
  agent: { label: 'Agent', placeholder: 'an installed agent', hint: 'Takes over at the next turn, given the conversation.' },
  permission_mode: { label: 'Permission mode', choices: ['ask', 'auto-edit', 'auto'], hint: 'Agent sessions: from the agent\'s next start.' },
  turn_timeout: { label: 'Turn timeout', placeholder: 'e.g. 10m', hint: 'From the next turn; at most the node\'s.' },
  memory_bytes: { label: 'Memory limit, bytes', type: 'number', placeholder: 'e.g. 2147483648', hint: 'At most the node\'s.' },
  pids: { label: 'Process limit', type: 'number', placeholder: 'e.g. 512', hint: 'At most the node\'s.' },
  setup: { label: 'Setup command', placeholder: 'e.g. npm ci', hint: 'Runs in /workspace before a turn in a new sandbox.' },
  mcp_servers: { label: 'MCP servers', type: 'json', placeholder: '[{"name":…,"command":…}]', hint: 'JSON; env and header values are not shown.' },
};
// REDACT are the fields of a setting's objects whose values are not shown
// (MCP servers' env and headers may hold tokens): a setting holding any is
// shown redacted and read-only.
const REDACT = new Set(['env', 'headers']);
const MAX_TITLE = 256; // bytes, session.MaxTitleBytes
const clip = (s, n = 300) => {
  const t = visible(s);
  return t.length > n ? `${t.slice(0, n - 1)}…` : t;
};
const when = (t) => {
  const d = t ? new Date(t) : null;
  return d && !Number.isNaN(d.getTime()) ? d.toLocaleString() : '';
};

/** settingText is a setting's value as the form shows it. */
function settingText(v) {
  if (v === undefined || v === null) return '';
  if (typeof v === 'object') return JSON.stringify(redact(v).value);
  return String(v);
}

// redact returns v with the values under REDACT keys replaced, and whether
// there were any.
function redact(v) {
  let hid = false;
  const walk = (x) => {
    if (Array.isArray(x)) return x.map(walk);
    if (!x || typeof x !== 'object') return x;
    const o = {};
    for (const [k, val] of Object.entries(x)) {
      if (REDACT.has(k) && val && typeof val === 'object') {
        hid = hid || Object.keys(val).length > 0;
        o[k] = Array.isArray(val) ? val.map((e) => (e && typeof e === 'object' && 'name' in e ? { name: e.name, value: '•••' } : '•••'))
          : Object.fromEntries(Object.keys(val).map((n) => [n, '•••']));
      } else {
        o[k] = walk(val);
      }
    }
    return o;
  };
  const value = walk(v);
  return { value, hid };
}

/** settingValue turns what was typed back into the type of the value the server reported (or the key's known type). */
function settingValue(text, old, type) {
  if (typeof old === 'number' || (old === undefined && type === 'number')) {
    const n = Number(text);
    if (text.trim() === '' || !Number.isFinite(n)) throw new Error('a number');
    return n;
  }
  if (typeof old === 'boolean') {
    if (text !== 'true' && text !== 'false') throw new Error('true or false');
    return text === 'true';
  }
  if ((old && typeof old === 'object') || (old === undefined && type === 'json')) {
    try {
      return JSON.parse(text);
    } catch {
      throw new Error('JSON');
    }
  }
  return text;
}

/** Manage is the dialog; the session page opens it for owners. */
export class Manage {
  /** opts: id, session() → the Session object held, onSession(Session), login(), share() opens the members' dialog. */
  constructor({ id, session, onSession, login, share }) {
    this.id = id;
    this.session = session;
    this.onSession = onSession;
    this.login = login;
    this.share = share;
    this.el = this.build();
  }

  build() {
    const close = h('button', { type: 'button', class: 'close', attrs: { 'aria-label': 'Close' }, text: '×', on: { click: () => this.el.close() } });
    // General: the title.
    this.titleIn = h('input', { id: 'manage-title-input', name: 'title', required: true, autocomplete: 'off', spellcheck: false });
    this.titleErr = errBox('manage-title-error');
    const titleForm = h('form', { class: 'mform', id: 'manage-title', on: { submit: (e) => { e.preventDefault(); this.rename(); } } },
      h('div', { class: 'field grow' }, h('label', { htmlFor: 'manage-title-input', text: 'Title' }), this.titleIn),
      h('button', { type: 'submit', class: 'primary', text: 'Rename' }));
    // Settings.
    this.settingsFields = h('div', { class: 'settings-fields', id: 'manage-settings-fields' });
    this.settingsNote = h('p', { class: 'hint', id: 'manage-settings-note' });
    this.settingsErr = errBox('manage-settings-error');
    const settingsForm = h('form', { class: 'mform column', id: 'manage-settings', on: { submit: (e) => { e.preventDefault(); this.saveSettings(); } } },
      this.settingsNote, this.settingsFields,
      h('div', {}, h('button', { type: 'submit', class: 'primary', text: 'Save settings' })));
    // Egress.
    this.egressIn = h('textarea', { id: 'manage-egress-input', name: 'egress', rows: 2, spellcheck: false, placeholder: 'api.example.com' });
    this.egressErr = errBox('manage-egress-error');
    const egressForm = h('form', { class: 'mform column', id: 'manage-egress', on: { submit: (e) => { e.preventDefault(); this.saveEgress(); } } },
      h('div', { class: 'field' }, h('label', { htmlFor: 'manage-egress-input', text: 'Hosts the sandbox may reach besides the node\'s (one a line)' }), this.egressIn),
      h('div', {}, h('button', { type: 'submit', text: 'Save allowlist' })));
    // Secrets.
    this.secretList = h('ul', { class: 'mlist', id: 'manage-secrets' });
    this.secretName = h('input', { id: 'manage-secret-name', name: 'secret-name', required: true, autocomplete: 'off', spellcheck: false, placeholder: 'API_KEY' });
    this.secretValue = h('input', { id: 'manage-secret-value', name: 'secret-value', type: 'password', required: true, autocomplete: 'new-password' });
    this.secretErr = errBox('manage-secrets-error');
    const secretForm = h('form', { class: 'mform', id: 'manage-secret-add', on: { submit: (e) => { e.preventDefault(); this.putSecret(); } } },
      h('div', { class: 'field' }, h('label', { htmlFor: 'manage-secret-name', text: 'Name' }), this.secretName),
      h('div', { class: 'field grow' }, h('label', { htmlFor: 'manage-secret-value', text: 'Value (write-only)' }), this.secretValue),
      h('button', { type: 'submit', text: 'Set' }));
    // Schedules.
    this.scheduleList = h('ul', { class: 'mlist', id: 'manage-schedules' });
    this.cronIn = h('input', { id: 'manage-cron', name: 'cron', required: true, autocomplete: 'off', spellcheck: false, placeholder: '0 9 * * 1-5' });
    this.tzIn = h('input', { id: 'manage-tz', name: 'tz', autocomplete: 'off', spellcheck: false, placeholder: 'UTC' });
    try {
      this.tzIn.value = Intl.DateTimeFormat().resolvedOptions().timeZone || '';
    } catch {
      // UTC, the server's default.
    }
    this.schedPrompt = h('input', { id: 'manage-sched-prompt', name: 'prompt', required: true, autocomplete: 'off', spellcheck: false });
    this.scheduleErr = errBox('manage-schedules-error');
    const scheduleForm = h('form', { class: 'mform', id: 'manage-schedule-add', on: { submit: (e) => { e.preventDefault(); this.createSchedule(); } } },
      h('div', { class: 'field' }, h('label', { htmlFor: 'manage-cron', text: 'Cron' }), this.cronIn),
      h('div', { class: 'field' }, h('label', { htmlFor: 'manage-tz', text: 'Time zone' }), this.tzIn),
      h('div', { class: 'field grow' }, h('label', { htmlFor: 'manage-sched-prompt', text: 'Prompt' }), this.schedPrompt),
      h('button', { type: 'submit', text: 'Schedule' }));
    // Tasks.
    this.taskList = h('ul', { class: 'mlist', id: 'manage-tasks' });
    this.taskNote = h('p', { class: 'hint', id: 'manage-tasks-note' });

    const section = (id, title, ...body) => h('section', { class: 'msection', id, attrs: { 'aria-labelledby': `${id}-h` } },
      h('h3', { id: `${id}-h`, text: title }), ...body);
    const dlg = h('dialog', { class: ['share', 'manage'], id: 'manage', attrs: { 'aria-labelledby': 'manage-h' } },
      h('div', { class: 'dlg-head' }, h('h2', { id: 'manage-h', text: 'Manage session' }), close),
      section('manage-general', 'General', titleForm, this.titleErr,
        h('p', { class: 'hint' }, 'Members, their roles and deleting the session: ',
          h('button', { type: 'button', class: 'link', id: 'manage-members', text: 'Members and delete…', on: { click: () => { this.close(); this.share(); } } }))),
      section('manage-settings-s', 'Settings', settingsForm, this.settingsErr),
      section('manage-egress-s', 'Network', egressForm, this.egressErr),
      section('manage-secrets-s', 'Secrets', h('p', { class: 'hint', text: 'The sandbox gets them as environment variables. Values are never shown again.' }),
        this.secretList, secretForm, this.secretErr),
      section('manage-schedules-s', 'Schedules', this.scheduleList, scheduleForm, this.scheduleErr),
      section('manage-tasks-s', 'Repository task', this.taskNote, this.taskList));
    return dlg;
  }

  /** show opens the dialog and reads what it lists. */
  show() {
    this.fill();
    if (!this.el.open) this.el.showModal();
    this.titleIn.focus();
    this.loadSecrets();
    this.loadSchedules();
    this.loadTasks();
    this.loadAgents();
  }

  // loadAgents offers the installed agents as the agent setting's choices.
  async loadAgents() {
    try {
      const list = await api.listAgents();
      const names = list.map((a) => a && a.name).filter((n) => typeof n === 'string' && n);
      if (!names.length || (this.agents && this.agents.join() === names.join())) return;
      this.agents = names;
      this.fill(true);
    } catch {
      // The agent stays a text field.
    }
  }

  close() {
    if (this.el.open) this.el.close();
  }

  // fill puts the Session object's title, settings and egress in the
  // forms; settingsOnly keeps the title and egress being edited.
  fill(settingsOnly) {
    const s = this.session() || {};
    if (!settingsOnly) {
      this.titleErr.hidden = true;
      this.titleIn.value = s.title || '';
      this.egressIn.value = (Array.isArray(s.egress) ? s.egress : []).join('\n');
    }
    const settings = s.settings && typeof s.settings === 'object' && !Array.isArray(s.settings) ? s.settings : null;
    this.settingsNote.textContent = settings
      ? 'Blank keeps a setting as it is.'
      : 'This server does not report the session\'s settings: blank keeps each as it is.';
    const keys = [...new Set([...Object.keys(KNOWN_SETTINGS), ...Object.keys(settings || {})])];
    this.settings = settings || {};
    this.settingsFields.replaceChildren(...keys.map((k) => {
      const known = { ...(KNOWN_SETTINGS[k] || {}) };
      if (k === 'agent' && this.agents) known.choices = this.agents;
      const id = `manage-setting-${k.replace(/[^A-Za-z0-9_-]/g, '_')}`;
      const cur = this.settings[k];
      let input;
      if (known.choices) {
        input = h('select', { id, name: k }, h('option', { value: '', text: cur === undefined ? '(unchanged)' : `(unchanged: ${clip(settingText(cur), 60)})` }),
          known.choices.map((c) => h('option', { value: c, text: c })));
      } else {
        input = h('input', { id, name: k, autocomplete: 'off', spellcheck: false, placeholder: known.placeholder || '' });
        input.value = settingText(cur);
        if (cur && typeof cur === 'object' && redact(cur).hid) {
          input.readOnly = true; // editing it would send the placeholders back
          input.title = 'Holds values that are not shown; change it with atrium settings';
          input.dataset.redacted = '';
        }
      }
      input.dataset.key = k;
      return h('div', { class: 'field' },
        h('label', { htmlFor: id, text: known.label ? `${known.label} (${k})` : clip(k, 80) }), input,
        known.hint ? h('span', { class: 'hint', text: known.hint }) : null);
    }));
  }

  async call(errEl, fn) {
    errEl.textContent = '';
    errEl.hidden = true;
    try {
      return await fn();
    } catch (err) {
      if (err.status === 401) this.login();
      errEl.textContent = clip(err.message, 600);
      errEl.hidden = false;
      return undefined;
    }
  }

  async rename() {
    const title = this.titleIn.value.trim();
    if (!title) return;
    if (new TextEncoder().encode(title).length > MAX_TITLE) {
      this.titleErr.textContent = `A title is at most ${MAX_TITLE} bytes.`;
      this.titleErr.hidden = false;
      return;
    }
    const s = await this.call(this.titleErr, () => api.patchSession(this.id, { title }));
    if (s) {
      this.onSession(s);
      toast('Renamed');
    }
  }

  async saveSettings() {
    const patch = {};
    for (const input of this.settingsFields.querySelectorAll('[data-key]')) {
      const k = input.dataset.key;
      const text = input.value.trim();
      if (text === '' || 'redacted' in input.dataset || text === settingText(this.settings[k])) continue;
      try {
        patch[k] = settingValue(text, this.settings[k], (KNOWN_SETTINGS[k] || {}).type);
      } catch (err) {
        this.settingsErr.textContent = `${k} must be ${err.message}.`;
        this.settingsErr.hidden = false;
        return;
      }
    }
    if (!Object.keys(patch).length) {
      this.settingsErr.textContent = 'Nothing changed.';
      this.settingsErr.hidden = false;
      return;
    }
    const s = await this.call(this.settingsErr, () => api.patchSession(this.id, { settings: patch }));
    if (s) {
      this.onSession(s);
      if (!s.settings) this.settings = { ...this.settings, ...patch };
      this.fill();
      toast(`Saved ${Object.keys(patch).join(', ')}`);
    }
  }

  async saveEgress() {
    const allow = this.egressIn.value.split(/[\s,]+/).map((x) => x.trim()).filter(Boolean);
    const s = await this.call(this.egressErr, () => api.putEgress(this.id, allow));
    if (s) {
      this.onSession(s);
      toast(allow.length ? 'Egress allowlist saved' : 'Egress allowlist cleared');
    }
  }

  // --- secrets ---------------------------------------------------------------

  async loadSecrets() {
    const list = await this.call(this.secretErr, () => api.listSecrets(this.id));
    if (!list) return;
    this.secretList.replaceChildren(...(list.length ? list.map((sc) => h('li', { data: { secret: sc.name } },
      h('code', { class: 'name', text: clip(sc.name, 200) }),
      h('span', { class: 'dim', text: [sc.updated_by && `set by ${clip(sc.updated_by, 100)}`, when(sc.updated_at)].filter(Boolean).join(' · ') }),
      h('button', { type: 'button', class: 'link danger', text: 'Delete', attrs: { 'aria-label': `Delete secret ${visible(sc.name)}` }, on: { click: () => this.deleteSecret(sc.name) } })))
      : [h('li', { class: 'dim', text: 'No secrets.' })]));
  }

  async putSecret() {
    const name = this.secretName.value.trim();
    const value = this.secretValue.value;
    if (!name) return;
    const ok = await this.call(this.secretErr, () => api.putSecret(this.id, name, value));
    if (ok === undefined && !this.secretErr.hidden) return; // keeps what was typed
    this.secretValue.value = '';
    this.secretName.value = '';
    toast(`Secret ${visible(name)} set`);
    this.loadSecrets();
  }

  async deleteSecret(name) {
    const ok = await this.call(this.secretErr, () => api.deleteSecret(this.id, name));
    if (ok === undefined && !this.secretErr.hidden) return;
    toast(`Secret ${visible(name)} deleted`);
    this.loadSecrets();
  }

  // --- schedules -------------------------------------------------------------

  async loadSchedules() {
    const all = await this.call(this.scheduleErr, () => api.listSchedules());
    if (!all) return;
    const mine = all.filter((sc) => sc && sc.session === this.id);
    this.scheduleList.replaceChildren(...(mine.length ? mine.map((sc) => {
      const last = sc.last_run ? `last run ${when(sc.last_run.tick)}: ${clip(sc.last_run.status, 40)}` : 'never run';
      const next = sc.paused ? 'paused' : sc.next_run ? `next ${when(sc.next_run)}` : '';
      return h('li', { data: { schedule: sc.id } },
        h('div', { class: 'grow' },
          h('div', {}, h('code', { text: clip(sc.cron, 100) }), ' ', h('span', { class: 'dim', text: clip(sc.tz || 'UTC', 60) }),
            h('span', { class: 'dim', text: ` · by ${clip(sc.creator, 100)}` })),
          h('div', { class: 'sched-prompt', text: clip(sc.prompt, 400) }),
          h('div', { class: 'dim', text: [next, last].filter(Boolean).join(' · ') })),
        h('button', { type: 'button', class: 'link', text: sc.paused ? 'Resume' : 'Pause', on: { click: () => this.pauseSchedule(sc.id, !sc.paused) } }),
        h('button', { type: 'button', class: 'link danger', text: 'Delete', attrs: { 'aria-label': `Delete schedule ${sc.id}` }, on: { click: () => this.deleteSchedule(sc.id) } }));
    }) : [h('li', { class: 'dim', text: 'No schedules prompt this session.' })]));
  }

  async createSchedule() {
    const spec = { cron: this.cronIn.value.trim(), session: this.id, prompt: this.schedPrompt.value };
    const tz = this.tzIn.value.trim();
    if (tz) spec.tz = tz;
    if (!spec.cron || !spec.prompt.trim()) return;
    const sc = await this.call(this.scheduleErr, () => api.createSchedule(spec));
    if (!sc) return;
    this.cronIn.value = '';
    this.schedPrompt.value = '';
    toast(`Schedule ${sc.id} created${sc.next_run ? `: next run ${when(sc.next_run)}` : ''}`);
    this.loadSchedules();
  }

  async pauseSchedule(id, pause) {
    if (await this.call(this.scheduleErr, () => api.pauseSchedule(id, pause))) this.loadSchedules();
  }

  async deleteSchedule(id) {
    const ok = await this.call(this.scheduleErr, () => api.deleteSchedule(id));
    if (ok === undefined && !this.scheduleErr.hidden) return;
    toast(`Schedule ${id} deleted`);
    this.loadSchedules();
  }

  // --- the repository task whose session this is ------------------------------

  async loadTasks() {
    this.taskNote.textContent = '';
    let list;
    try {
      list = await api.listTasks();
    } catch (err) {
      this.taskNote.textContent = `Could not read the tasks: ${clip(err.message, 300)}`;
      return;
    }
    if (list === null) {
      this.taskNote.textContent = 'This server does not list repository tasks.';
      this.taskList.replaceChildren();
      return;
    }
    const mine = list.filter((t) => t && t.session === this.id);
    if (!mine.length) this.taskNote.textContent = 'This session is not a repository task\'s. Start one with atrium task run.';
    this.taskList.replaceChildren(...mine.map((t) => {
      const pr = safeURL(t.pr_url);
      return h('li', { data: { task: t.id } },
        h('div', { class: 'grow' },
          h('div', {}, h('strong', { text: clip(t.title || t.id, 200) }), h('span', { class: 'dim', text: ` · ${clip(t.repo, 200)} @ ${clip(t.base, 100)}` })),
          h('div', { class: 'dim', text: [`status ${clip(t.status, 40)}`, t.branch && `branch ${clip(t.branch, 200)}`, t.error && clip(t.error, 300)].filter(Boolean).join(' · ') })),
        pr ? h('a', { href: pr, target: '_blank', rel: 'noopener noreferrer', text: 'Pull request' }) : null);
    }));
  }
}

function errBox(id) {
  return h('p', { class: 'error', id, hidden: true, attrs: { role: 'alert' } });
}
