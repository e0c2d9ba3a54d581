// dom.js: small helpers to build DOM nodes safely. Text always goes in as
// text nodes (never as HTML), so event data can never become markup.

/**
 * h builds an element. props may hold: class (string or array), text,
 * attrs (object of attributes), data (dataset entries), on (event
 * listeners), and any writable property of the element (id, type, value,
 * disabled, hidden, htmlFor, title, href …). Children are nodes, strings
 * (made text nodes), or null/false (skipped); arrays are flattened.
 */
export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  if (props) {
    for (const [k, v] of Object.entries(props)) {
      if (v === undefined || v === null) continue;
      switch (k) {
        case 'class':
          el.className = Array.isArray(v) ? v.filter(Boolean).join(' ') : v;
          break;
        case 'text':
          el.textContent = v;
          break;
        case 'attrs':
          for (const [a, av] of Object.entries(v)) {
            if (av !== undefined && av !== null && av !== false) el.setAttribute(a, av === true ? '' : String(av));
          }
          break;
        case 'data':
          for (const [d, dv] of Object.entries(v)) el.dataset[d] = String(dv);
          break;
        case 'on':
          for (const [ev, fn] of Object.entries(v)) el.addEventListener(ev, fn);
          break;
        default:
          el[k] = v;
      }
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else if (c instanceof Node) el.appendChild(c);
    else el.appendChild(document.createTextNode(String(c)));
  }
}

/**
 * randomID returns 128 random bits as hex, for client_ids. (It uses
 * getRandomValues, which, unlike randomUUID, works on plain-HTTP origins.)
 */
export function randomID() {
  const b = crypto.getRandomValues(new Uint8Array(16));
  return [...b].map((x) => x.toString(16).padStart(2, '0')).join('');
}

/** clear removes every child of el. */
export function clear(el) {
  el.replaceChildren();
}

const pad = (n) => String(n).padStart(2, '0');

/** clock formats an RFC 3339 time as local HH:MM:SS. */
export function clock(iso) {
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return '';
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

/** timeEl returns a <time> element showing the clock time of iso. */
export function timeEl(iso, text) {
  const d = new Date(iso);
  return h('time', {
    attrs: { datetime: iso },
    title: Number.isNaN(d.getTime()) ? '' : d.toLocaleString(),
    text: text ?? clock(iso),
  });
}

/** ago formats how long ago iso was, for lists: "just now", "5 min ago", a date. */
export function ago(iso, now = Date.now()) {
  const t = new Date(iso).getTime();
  if (Number.isNaN(t)) return '';
  const s = Math.round((now - t) / 1000);
  if (s < 45) return 'just now';
  if (s < 90) return '1 min ago';
  const m = Math.round(s / 60);
  if (m < 60) return `${m} min ago`;
  const hr = Math.round(m / 60);
  if (hr < 24) return `${hr} h ago`;
  const days = Math.round(hr / 24);
  if (days < 7) return `${days} d ago`;
  return new Date(t).toLocaleDateString();
}

/** duration formats milliseconds: "850 ms", "4.2 s", "3 min 05 s", "2 h 03 min". */
export function duration(ms) {
  if (!(ms >= 0)) return '';
  if (ms < 1000) return `${Math.round(ms)} ms`;
  const s = ms / 1000;
  if (s < 60) return `${s.toFixed(1)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${pad(Math.floor(s % 60))} s`;
  return `${Math.floor(m / 60)} h ${pad(m % 60)} min`;
}

/** userTone returns a class (u0 … u7) that colours a user's avatar the same way everywhere. */
export function userTone(user) {
  let x = 0;
  for (const c of user) x = (x * 31 + c.codePointAt(0)) >>> 0;
  return `u${x % 8}`;
}

/** avatar returns a small round badge with the user's initial. */
export function avatar(user, extra) {
  const initial = [...(user || '?')][0].toUpperCase();
  return h('span', { class: ['avatar', userTone(user), extra], attrs: { 'aria-hidden': 'true' }, text: initial });
}

/** plural returns "1 thing" or "n things". */
export function plural(n, one, many = `${one}s`) {
  return `${n.toLocaleString()} ${n === 1 ? one : many}`;
}

/** toast shows a short message in the polite live region for a few seconds. */
export function toast(message, kind = 'info') {
  const box = document.getElementById('toasts');
  if (!box) return;
  const el = h('div', { class: ['toast', kind], text: message });
  box.appendChild(el);
  while (box.childElementCount > 4) box.firstElementChild.remove();
  setTimeout(() => el.remove(), kind === 'error' ? 8000 : 4000);
}

/**
 * later runs fn once, at the next animation frame or after 100 ms, whichever
 * comes first: frames batch DOM work, and the timer keeps a page whose
 * frames the browser paused (a hidden or covered window) up to date. It
 * returns a func that cancels the call.
 */
export function later(fn) {
  let done = false;
  const stop = () => {
    done = true;
    cancelAnimationFrame(r);
    clearTimeout(t);
  };
  const run = () => {
    if (done) return;
    stop();
    fn();
  };
  const r = requestAnimationFrame(run);
  const t = setTimeout(run, 100);
  return stop;
}
