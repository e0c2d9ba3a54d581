// markdown.js: an agent's markdown as DOM. marked's lexer (vendored,
// see vendor/README.md) turns the text into tokens; this module builds
// elements from them with createElement and text nodes only. No HTML string
// is ever parsed: raw HTML in the text is shown as text, link URLs must be
// http(s) or mailto, and images become links (never loaded). The page's
// Trusted Types policy ('none') would make any HTML sink throw anyway.

import { lexer } from '../vendor/marked/marked.esm.js';
import { h } from './dom.js';

/** MAX_MARKDOWN is the most text rendered as markdown; longer text is shown as plain text. */
export const MAX_MARKDOWN = 200000;

const SAFE_SCHEMES = new Set(['http:', 'https:', 'mailto:']);

/**
 * safeURL returns href as an absolute URL string if it is http(s) or
 * mailto, else null. Relative links are resolved against nothing (they
 * would point into Atrium), so they are refused too.
 */
export function safeURL(href) {
  if (typeof href !== 'string' || !href) return null;
  let u;
  try {
    u = new URL(href.trim());
  } catch {
    return null;
  }
  return SAFE_SCHEMES.has(u.protocol) ? u.href : null;
}

const named = { amp: '&', lt: '<', gt: '>', quot: '"', apos: "'", nbsp: '\u00a0', copy: '©', reg: '®', hellip: '…', mdash: '—', ndash: '–' };

/** decode replaces the character references marked leaves in text. */
export function decode(s) {
  if (!s.includes('&')) return s;
  return s.replace(/&(#x[0-9a-f]{1,6}|#[0-9]{1,7}|[a-z]{2,8});/gi, (m, r) => {
    if (r[0] === '#') {
      const n = r[1] === 'x' || r[1] === 'X' ? parseInt(r.slice(2), 16) : parseInt(r.slice(1), 10);
      return n > 0 && n <= 0x10ffff && !(n >= 0xd800 && n <= 0xdfff) ? String.fromCodePoint(n) : '\ufffd';
    }
    return Object.prototype.hasOwnProperty.call(named, r.toLowerCase()) ? named[r.toLowerCase()] : m;
  });
}

/**
 * render returns a <div class="md"> holding text rendered as markdown.
 * Text over MAX_MARKDOWN, or text the lexer fails on, is shown as plain
 * preformatted text.
 */
export function render(text) {
  const root = h('div', { class: 'md' });
  const s = String(text || '');
  if (s.length > MAX_MARKDOWN) {
    root.appendChild(h('pre', { class: 'plain', text: s }));
    return root;
  }
  let tokens;
  try {
    tokens = lexer(s, { gfm: true, breaks: false });
  } catch {
    root.appendChild(h('pre', { class: 'plain', text: s }));
    return root;
  }
  blocks(root, tokens);
  return root;
}

function blocks(parent, tokens) {
  for (const t of tokens || []) {
    const el = block(t);
    if (el) parent.appendChild(el);
  }
}

function block(t) {
  switch (t.type) {
    case 'space':
    case 'def':
      return null;
    case 'heading':
      // Levels shift by two: the page has its h1 and h2s.
      return inline(h(`h${Math.min(6, Math.max(1, t.depth | 0) + 2)}`, { class: `md-h${Math.max(1, t.depth | 0)}` }), t.tokens, t.text);
    case 'paragraph':
      return inline(h('p'), t.tokens, t.text);
    case 'text':
      // A text block (in a tight list item) may hold inline tokens.
      return inline(h('span'), t.tokens, t.text);
    case 'code': {
      const code = h('code', { text: t.text || '' });
      const lang = typeof t.lang === 'string' ? t.lang.split(/\s/)[0].slice(0, 32) : '';
      if (lang) code.dataset.lang = lang;
      return h('pre', { class: 'code' }, code);
    }
    case 'blockquote': {
      const q = h('blockquote');
      blocks(q, t.tokens);
      return q;
    }
    case 'hr':
      return h('hr');
    case 'list': {
      const l = h(t.ordered ? 'ol' : 'ul');
      if (t.ordered && Number(t.start) > 1) l.start = Number(t.start);
      for (const it of t.items || []) {
        const li = h('li');
        if (it.task) li.classList.add('task');
        blocks(li, it.tokens);
        l.appendChild(li);
      }
      return l;
    }
    case 'checkbox':
      return h('input', { type: 'checkbox', checked: !!t.checked, disabled: true, attrs: { 'aria-label': t.checked ? 'done' : 'not done' } });
    case 'table': {
      const align = (a) => (a === 'left' || a === 'right' || a === 'center' ? `al-${a}` : null);
      const head = h('tr', null, (t.header || []).map((c, i) => inline(h('th', { class: align((t.align || [])[i]) }), c.tokens, c.text)));
      const body = (t.rows || []).map((r) => h('tr', null, r.map((c, i) => inline(h('td', { class: align((t.align || [])[i]) }), c.tokens, c.text))));
      return h('div', { class: 'table-wrap' }, h('table', null, h('thead', null, head), h('tbody', null, body)));
    }
    case 'html':
      // Raw HTML is text.
      return h('pre', { class: 'raw-html', text: t.text || t.raw || '' });
    default:
      if (t.tokens) return inline(h('p'), t.tokens, t.text);
      return typeof t.raw === 'string' ? h('p', { text: t.raw }) : null;
  }
}

function inline(parent, tokens, fallback) {
  if (!tokens) {
    if (fallback) parent.appendChild(document.createTextNode(decode(fallback)));
    return parent;
  }
  for (const t of tokens) {
    const n = inl(t);
    if (n) parent.appendChild(n);
  }
  return parent;
}

function inl(t) {
  switch (t.type) {
    case 'text':
      if (t.tokens && t.tokens.length) return inline(h('span'), t.tokens, t.text);
      return document.createTextNode(t.escaped ? t.text : decode(t.text || ''));
    case 'escape':
      return document.createTextNode(t.text || '');
    case 'html':
      return h('code', { class: 'raw-html', text: t.text || '' });
    case 'strong':
      return inline(h('strong'), t.tokens, t.text);
    case 'em':
      return inline(h('em'), t.tokens, t.text);
    case 'del':
      return inline(h('del'), t.tokens, t.text);
    case 'codespan':
      return h('code', { text: t.text || '' });
    case 'br':
      return h('br');
    case 'checkbox':
      return block(t);
    case 'link': {
      const url = safeURL(t.href);
      if (!url) return inline(h('span', { class: 'unsafe-link', title: `Not a web link: ${String(t.href || '').slice(0, 200)}` }), t.tokens, t.text);
      const a = h('a', { href: url, attrs: { rel: 'noopener noreferrer nofollow', target: '_blank' } });
      if (t.title) a.title = t.title;
      return inline(a, t.tokens, t.text);
    }
    case 'image': {
      // Images are not loaded: the policy allows Atrium's own only, and a
      // remote image would tell its host who reads the session.
      const url = safeURL(t.href);
      const label = `image: ${t.text || t.href || ''}`;
      if (!url) return h('span', { class: 'image-ref', text: `[${label}]` });
      return h('a', { class: 'image-ref', href: url, text: `[${label}]`, attrs: { rel: 'noopener noreferrer nofollow', target: '_blank' } });
    }
    default:
      if (t.tokens) return inline(h('span'), t.tokens, t.text);
      return typeof t.raw === 'string' ? document.createTextNode(t.raw) : null;
  }
}
