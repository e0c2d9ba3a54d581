// workspace.js: the session's workspace beside its timeline (DESIGN §7
// "More REST"): the file tree (read from the last saved copy while the
// session sleeps), a file's text, downloads of a file or a folder (tar.gz),
// uploads by drag and drop (drivers), and what a turn changed, as diffs.
// File names and contents are shown as text, control characters visible.

import { h, plural, toast } from './dom.js';
import * as api from './api.js';
import { visible } from './agent.js';

/** MAX_PREVIEW is how much of a file the panel reads to show it. */
export const MAX_PREVIEW = 512 * 1024;

const baseName = (p) => p.slice(p.lastIndexOf('/') + 1);
const dirName = (p) => (p.includes('/') ? p.slice(0, p.lastIndexOf('/')) : '');

function size(n) {
  if (n >= 1 << 20) return `${(n / (1 << 20)).toFixed(1)} MB`;
  if (n >= 1 << 10) return `${(n / (1 << 10)).toFixed(1)} KB`;
  return `${n} B`;
}

/** renderUnified renders a unified diff's lines with their kind. */
export function renderUnified(diff) {
  const view = h('div', { class: 'diffview unified' });
  for (const line of String(diff || '').replace(/\n$/, '').split('\n')) {
    let cls = 'ctx';
    if (line.startsWith('+++') || line.startsWith('---')) cls = 'file';
    else if (line.startsWith('@@')) cls = 'hunk';
    else if (line.startsWith('+')) cls = 'add';
    else if (line.startsWith('-')) cls = 'del';
    view.appendChild(h('div', { class: ['ul', cls], text: visible(line.length > 4000 ? `${line.slice(0, 4000)} …` : line) || ' ' }));
  }
  return view;
}

/** Workspace is the panel; the session page opens it, and tells it when files change. */
export class Workspace {
  /** opts: id, canDrive() → bool, onClose(). */
  constructor({ id, canDrive, onClose }) {
    this.id = id;
    this.canDrive = canDrive;
    this.dir = '';
    this.view = 'files'; // "files", "file" or "changes"
    this.file = '';
    this.turn = 0;
    this.ctrl = null; // aborts the read in flight
    this.title = h('h2', { id: 'ws-title', text: 'Files' });
    this.crumbs = h('nav', { class: 'crumbs', attrs: { 'aria-label': 'Folder' } });
    this.body = h('div', { class: 'ws-body', id: 'ws-body' });
    this.note = h('p', { class: 'dim ws-note', attrs: { role: 'status' } });
    this.archive = h('a', { class: 'button small', id: 'ws-archive', text: 'Download folder', attrs: { download: '' } });
    this.refreshBtn = h('button', { type: 'button', class: 'small', text: 'Refresh', on: { click: () => this.refresh() } });
    this.el = h('aside', { class: 'workspace', id: 'workspace', hidden: true, attrs: { 'aria-labelledby': 'ws-title' } },
      h('div', { class: 'dlg-head' }, this.title,
        h('button', { type: 'button', class: 'close', attrs: { 'aria-label': 'Close the workspace' }, text: '×', on: { click: () => { this.close(); if (onClose) onClose(); } } })),
      h('div', { class: 'ws-tools' }, this.crumbs, this.archive, this.refreshBtn),
      this.note, this.body,
      h('p', { class: 'hint ws-drop', text: 'Drop files here to upload them to this folder (drivers).' }));
    for (const ev of ['dragenter', 'dragover']) {
      this.el.addEventListener(ev, (e) => {
        if (!this.canDrive() || !e.dataTransfer || ![...e.dataTransfer.types].includes('Files')) return;
        e.preventDefault();
        this.el.classList.add('dropping');
      });
    }
    this.el.addEventListener('dragleave', (e) => { if (e.target === this.el) this.el.classList.remove('dropping'); });
    this.el.addEventListener('drop', (e) => this.drop(e));
  }

  get open() { return !this.el.hidden; }

  close() {
    this.el.hidden = true;
    if (this.ctrl) this.ctrl.abort();
  }

  /** show opens the panel on folder dir. */
  show(dir = this.dir) {
    this.el.hidden = false;
    this.list(dir);
  }

  refresh() {
    if (!this.open) return;
    if (this.view === 'files') this.list(this.dir);
    else if (this.view === 'file') this.openFile(this.file);
    else this.changes(this.turn);
  }

  /** changed is told which paths an event changed; the listing follows. */
  changed() {
    if (this.open && this.view === 'files') {
      clearTimeout(this.refreshTimer);
      this.refreshTimer = setTimeout(() => this.refresh(), 300);
    }
  }

  begin(view, title) {
    if (this.ctrl) this.ctrl.abort();
    this.ctrl = new AbortController();
    this.view = view;
    this.title.textContent = title;
    this.note.textContent = 'Loading…';
    this.el.hidden = false;
    return this.ctrl.signal;
  }

  renderCrumbs(path, last) {
    const parts = path ? path.split('/') : [];
    const items = [h('button', { type: 'button', class: 'link', text: 'workspace', on: { click: () => this.list('') } })];
    parts.forEach((p, i) => {
      const to = parts.slice(0, i + 1).join('/');
      items.push(' / ', i === parts.length - 1 && last
        ? h('span', { text: visible(p) })
        : h('button', { type: 'button', class: 'link', text: visible(p), on: { click: () => this.list(to) } }));
    });
    this.crumbs.replaceChildren(...items);
  }

  async list(dir) {
    const signal = this.begin('files', 'Files');
    this.dir = dir;
    this.renderCrumbs(dir, true);
    this.archive.hidden = false;
    this.archive.href = api.archiveURL(this.id, dir);
    this.archive.setAttribute('download', `${baseName(dir) || 'workspace'}.tar.gz`);
    let entries;
    try {
      entries = await api.listFiles(this.id, dir, { signal });
    } catch (err) {
      if (err.name === 'AbortError') return;
      this.note.textContent = err.status === 404 ? 'This folder does not exist (any more).' : `Could not list the files: ${err.message}`;
      this.body.replaceChildren();
      return;
    }
    entries.sort((a, b) => (a.type === 'dir') !== (b.type === 'dir') ? (a.type === 'dir' ? -1 : 1) : a.path.localeCompare(b.path));
    this.note.textContent = entries.length ? plural(entries.length, 'entry', 'entries') : 'This folder is empty.';
    this.body.replaceChildren(h('ul', { class: 'files', id: 'ws-files' }, entries.map((e) => {
      const name = visible(baseName(e.path));
      const isDir = e.type === 'dir';
      const open = h('button', { type: 'button', class: ['link', 'fname', isDir ? 'dir' : null], data: { path: e.path },
        text: isDir ? `${name}/` : name, on: { click: () => (isDir ? this.list(e.path) : this.openFile(e.path)) } });
      const dl = isDir
        ? h('a', { href: api.archiveURL(this.id, e.path), class: 'dl', text: '⤓', title: `Download ${name} as .tar.gz`, attrs: { download: `${baseName(e.path)}.tar.gz`, 'aria-label': `Download ${name} as .tar.gz` } })
        : h('a', { href: api.fileURL(this.id, e.path), class: 'dl', text: '⤓', title: `Download ${name}`, attrs: { download: baseName(e.path), 'aria-label': `Download ${name}` } });
      return h('li', { data: { path: e.path, type: e.type } }, h('span', { class: 'ficon', attrs: { 'aria-hidden': 'true' }, text: isDir ? '▸' : e.type === 'symlink' ? '↪' : '·' }),
        open, h('span', { class: 'dim fsize', text: isDir ? '' : size(e.size || 0) }), dl);
    })));
  }

  async openFile(path) {
    const signal = this.begin('file', baseName(path) ? visible(baseName(path)) : 'File');
    this.file = path;
    this.renderCrumbs(path, true);
    this.archive.hidden = true;
    let got;
    try {
      got = await api.readFile(this.id, path, MAX_PREVIEW, { signal });
    } catch (err) {
      if (err.name === 'AbortError') return;
      this.note.textContent = `Could not read ${visible(path)}: ${err.message}`;
      this.body.replaceChildren();
      return;
    }
    const dl = h('a', { class: 'button small', id: 'ws-download', href: api.fileURL(this.id, path), text: 'Download', attrs: { download: baseName(path) } });
    const binary = got.bytes.subarray(0, 8000).includes(0);
    if (binary) {
      this.note.textContent = `A binary file of ${size(got.size)}.`;
      this.body.replaceChildren(dl);
      return;
    }
    const text = new TextDecoder('utf-8', { fatal: false }).decode(got.bytes);
    this.note.textContent = got.truncated ? `The first ${size(got.bytes.length)} of ${size(got.size)}; download it for all of it.` : size(got.size);
    this.body.replaceChildren(dl, h('pre', { class: 'filetext', id: 'ws-file', text: visible(text) }));
  }

  /** changes shows what turn n changed in the workspace. */
  async changes(n) {
    const signal = this.begin('changes', `Changes of turn ${n}`);
    this.turn = n;
    this.crumbs.replaceChildren(h('button', { type: 'button', class: 'link', text: '← Files', on: { click: () => this.list(this.dir) } }));
    this.archive.hidden = true;
    let res;
    try {
      res = await api.turnChanges(this.id, n, { signal });
    } catch (err) {
      if (err.name === 'AbortError') return;
      this.note.textContent = `Could not read the changes of turn ${n}: ${err.message}`;
      this.body.replaceChildren();
      return;
    }
    const files = (res && res.files) || [];
    this.note.textContent = files.length ? `${plural(files.length, 'file')} changed` : `Turn ${n} changed no file.`;
    this.body.replaceChildren(h('div', { class: 'changes', id: 'ws-changes' }, files.map((f) =>
      h('details', { class: ['change', `cs-${f.status}`], open: files.length <= 10, data: { path: f.path } },
        h('summary', null, h('span', { class: ['badge', `cs-${f.status}`], text: f.status }), ' ', h('span', { class: 'path', text: visible(f.path) })),
        f.diff ? renderUnified(f.diff) : h('p', { class: 'dim', text: f.status === 'deleted' ? 'Deleted.' : 'No text diff (a binary or a large file).' })))));
  }

  async drop(e) {
    this.el.classList.remove('dropping');
    if (!this.canDrive() || !e.dataTransfer) return;
    e.preventDefault();
    const files = [...e.dataTransfer.files];
    if (!files.length) return;
    const dir = this.view === 'files' ? this.dir : dirName(this.file);
    let done = 0;
    for (const f of files) {
      const path = dir ? `${dir}/${f.name}` : f.name;
      this.note.textContent = `Uploading ${visible(f.name)} (${done + 1} of ${files.length})…`;
      try {
        await api.putFile(this.id, path, f);
        done++;
      } catch (err) {
        toast(`Could not upload ${f.name}: ${err.message}`, 'error');
      }
    }
    toast(`Uploaded ${plural(done, 'file')}`);
    this.list(dir);
  }
}
