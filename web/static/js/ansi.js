// ansi.js: terminal output to DOM. It understands the SGR escape sequences
// (ESC [ … m: bold, dim, italic, underline, strike, inverse, the 16 colours,
// the 256-colour palette and 24-bit colour), drops every other control
// sequence (cursor movement, OSC titles and links), and keeps what a
// carriage return leaves visible on a line. Colours of the 16-colour palette
// are classes, so the theme decides them; others are set through the CSSOM,
// which the Content-Security-Policy allows (no style attributes are parsed).

const ESC = '\u001b';

/** Style is the SGR state of a run of text. */
function blank() {
  return { fg: null, bg: null, bold: false, dim: false, italic: false, underline: false, strike: false, inverse: false };
}

// The xterm 256-colour palette beyond the first 16.
function color256(n) {
  if (n < 16) return n;
  if (n < 232) {
    n -= 16;
    const v = (x) => (x === 0 ? 0 : 55 + x * 40);
    return `rgb(${v(Math.floor(n / 36))}, ${v(Math.floor(n / 6) % 6)}, ${v(n % 6)})`;
  }
  const g = 8 + (n - 232) * 10;
  return `rgb(${g}, ${g}, ${g})`;
}

function applySGR(st, params) {
  const p = params.length ? params : [0];
  for (let i = 0; i < p.length; i++) {
    const c = p[i];
    if (c === 0) Object.assign(st, blank());
    else if (c === 1) st.bold = true;
    else if (c === 2) st.dim = true;
    else if (c === 3) st.italic = true;
    else if (c === 4) st.underline = true;
    else if (c === 7) st.inverse = true;
    else if (c === 9) st.strike = true;
    else if (c === 21 || c === 22) { st.bold = false; st.dim = false; }
    else if (c === 23) st.italic = false;
    else if (c === 24) st.underline = false;
    else if (c === 27) st.inverse = false;
    else if (c === 29) st.strike = false;
    else if (c >= 30 && c <= 37) st.fg = c - 30;
    else if (c >= 90 && c <= 97) st.fg = c - 90 + 8;
    else if (c === 39) st.fg = null;
    else if (c >= 40 && c <= 47) st.bg = c - 40;
    else if (c >= 100 && c <= 107) st.bg = c - 100 + 8;
    else if (c === 49) st.bg = null;
    else if (c === 38 || c === 48) {
      let col = null;
      if (p[i + 1] === 5 && i + 2 < p.length) {
        col = color256(p[i + 2] & 255);
        i += 2;
      } else if (p[i + 1] === 2 && i + 4 < p.length) {
        const [r, g, b] = [p[i + 2], p[i + 3], p[i + 4]].map((x) => Math.max(0, Math.min(255, x | 0)));
        col = `rgb(${r}, ${g}, ${b})`;
        i += 4;
      } else {
        break; // malformed: ignore the rest of the sequence
      }
      if (c === 38) st.fg = col;
      else st.bg = col;
    }
  }
}

/**
 * parse splits text into runs [{text, style}] with the SGR state of each.
 * Non-SGR escape sequences are dropped; on each line only what follows the
 * last carriage return is kept (a progress bar redraws itself that way).
 */
export function parse(text) {
  const runs = [];
  const st = blank();
  let buf = ''; // text since the last style change, in style st
  let line = []; // runs of the current line since its last \r
  const cut = () => {
    if (buf) line.push({ text: buf, style: { ...st } });
    buf = '';
  };
  const endLine = () => {
    cut();
    for (const r of line) runs.push(r);
    line = [];
  };
  const n = text.length;
  let i = 0;
  while (i < n) {
    const ch = text[i];
    if (ch === ESC) {
      const next = text[i + 1];
      if (next === '[') {
        // CSI: parameter and intermediate bytes, then one final byte in @–~.
        let j = i + 2;
        while (j < n && !(text.charCodeAt(j) >= 0x40 && text.charCodeAt(j) <= 0x7e)) j++;
        if (j >= n) break; // unterminated: drop the rest
        const body = text.slice(i + 2, j);
        if (text[j] === 'm' && /^[\d;:]*$/.test(body)) {
          cut();
          applySGR(st, body === '' ? [] : body.split(/[;:]/).map((x) => (x === '' ? 0 : parseInt(x, 10))));
        }
        i = j + 1;
        continue;
      }
      if (next === ']') {
        // OSC: ends with BEL or ESC \.
        let j = i + 2;
        while (j < n && text[j] !== '\u0007' && !(text[j] === ESC && text[j + 1] === '\\')) j++;
        i = j >= n ? n : text[j] === '\u0007' ? j + 1 : j + 2;
        continue;
      }
      i += next === undefined ? 1 : 2; // other two-byte escapes
      continue;
    }
    if (ch === '\n') {
      endLine();
      runs.push({ text: '\n', style: blank() });
      i++;
      continue;
    }
    if (ch === '\r') {
      i++;
      if (i === n || text[i] === '\n') continue; // CRLF, or a trailing CR
      buf = '';
      line = []; // the line is redrawn from its start
      continue;
    }
    const code = text.charCodeAt(i);
    if ((code < 0x20 && ch !== '\t') || code === 0x7f) { i++; continue; } // other C0 controls
    buf += ch;
    i++;
  }
  endLine();
  // Merge neighbours of the same style, so a line is a few nodes, not many.
  const merged = [];
  for (const r of runs) {
    const last = merged[merged.length - 1];
    if (last && sameStyle(last.style, r.style)) last.text += r.text;
    else merged.push(r);
  }
  return merged;
}

function sameStyle(a, b) {
  return a.fg === b.fg && a.bg === b.bg && a.bold === b.bold && a.dim === b.dim && a.italic === b.italic &&
    a.underline === b.underline && a.strike === b.strike && a.inverse === b.inverse;
}

function classesOf(style) {
  const cls = [];
  let { fg, bg } = style;
  if (style.inverse) {
    [fg, bg] = [bg, fg];
    if (fg === null) cls.push('a-ifg');
    if (bg === null) cls.push('a-ibg');
  }
  if (typeof fg === 'number') cls.push(`a-f${fg}`);
  if (typeof bg === 'number') cls.push(`a-b${bg}`);
  if (style.bold) cls.push('a-bold');
  if (style.dim) cls.push('a-dim');
  if (style.italic) cls.push('a-it');
  if (style.underline) cls.push('a-ul');
  if (style.strike) cls.push('a-st');
  return { cls, fg: typeof fg === 'string' ? fg : null, bg: typeof bg === 'string' ? bg : null };
}

function plain(style) {
  return style.fg === null && style.bg === null && !style.bold && !style.dim && !style.italic &&
    !style.underline && !style.strike && !style.inverse;
}

/** render appends the runs of text to parent: text nodes for plain runs, spans for styled ones. */
export function render(parent, text) {
  for (const run of parse(text)) {
    if (plain(run.style)) {
      parent.appendChild(document.createTextNode(run.text));
      continue;
    }
    const span = document.createElement('span');
    const { cls, fg, bg } = classesOf(run.style);
    if (cls.length) span.className = cls.join(' ');
    if (fg) span.style.color = fg;
    if (bg) span.style.backgroundColor = bg;
    span.textContent = run.text;
    parent.appendChild(span);
  }
  return parent;
}

/** strip returns text without escape sequences, as parse sees it. */
export function strip(text) {
  return parse(text).map((r) => r.text).join('');
}
