// main.js: start-up, sign-in and the client-side router of Atrium's web UI.
// Routes: / (sessions), /s/<id> (a session). The server answers every other
// path without a dot with the same page, so deep links work.

import { h } from './dom.js';
import * as api from './api.js';
import { SessionsPage } from './sessions.js';
import { SessionPage } from './session.js';

const NEXT_KEY = 'atrium.next'; // where to go after signing in (sessionStorage)
const USER_KEY = 'atrium.user'; // the name last signed in with (a display hint only)

const main = document.getElementById('main');
const account = document.getElementById('account');

const app = {
  me: '',
  page: null,
  navigate(path, { replace = false } = {}) {
    if (replace) history.replaceState(null, '', path);
    else history.pushState(null, '', path);
    route({ focus: true });
  },
  login() {
    showLogin();
  },
  setMe(user) {
    if (user === app.me) return;
    app.me = user;
    try { localStorage.setItem(USER_KEY, user); } catch { /* storage may be off */ }
    renderAccount();
  },
};

function renderAccount() {
  account.replaceChildren(
    app.me ? h('span', { class: 'me', title: 'Signed in' }, h('span', { class: 'sr-only', text: 'Signed in as ' }), app.me) : null,
    h('a', { href: '/auth/logout', class: 'signout', text: 'Sign out', on: { click: () => { try { localStorage.removeItem(USER_KEY); } catch { /* ignore */ } } } }));
}

function unmount() {
  if (app.page) app.page.unmount();
  app.page = null;
}

const sessionPath = /^\/s\/([A-Za-z0-9_-]{1,128})\/?$/;

async function route({ focus = false } = {}) {
  unmount();
  const path = location.pathname;
  const m = sessionPath.exec(path);
  if (path === '/' || path === '/index.html') {
    const page = new SessionsPage(main, app);
    app.page = page;
    page.load();
  } else if (m) {
    const page = new SessionPage(main, m[1], app);
    app.page = page;
    page.open();
  } else {
    document.title = 'Not found · Atrium';
    main.replaceChildren(h('section', { class: 'notfound' },
      h('h1', { tabIndex: -1, text: 'Page not found' }),
      h('p', null, 'There is nothing at ', h('code', { text: path }), '. ',
        h('a', { href: '/', data: { nav: '' }, text: 'See all sessions' }), '.')));
  }
  if (focus) {
    const h1 = main.querySelector('h1');
    if (h1) h1.focus({ preventScroll: true });
  }
}

async function showLogin() {
  unmount();
  account.replaceChildren();
  document.title = 'Sign in · Atrium';
  const here = location.pathname + location.search;
  let cfg = null;
  try {
    cfg = await api.authConfig();
  } catch {
    // Unknown: offer the dev sign-in, which says clearly if it is refused.
  }
  const mode = (cfg && cfg.mode) || 'dev';
  const parts = [h('h1', { tabIndex: -1, text: 'Sign in to Atrium' })];
  if (mode === 'oidc') {
    const login = (cfg && cfg.login_url) || '/auth/login';
    let issuer = '';
    try { issuer = cfg.issuer ? new URL(cfg.issuer).host : ''; } catch { /* shown without */ }
    parts.push(h('a', { class: 'button primary', id: 'signin', href: `${login}?next=${encodeURIComponent(here)}`, text: issuer ? `Sign in with ${issuer}` : 'Sign in' }));
  } else if (mode === 'tokens') {
    parts.push(h('p', { text: 'This server accepts API tokens only: use the command line client with a token (atrium --token, or ATRIUM_TOKEN). The first token is made on the server\'s machine with atrium token create --bootstrap; ask an admin for one, or to configure a login (docs/auth.md).' }));
  } else {
    // The user this browser signed in as last, else the one the CLI on the
    // server's machine acts as (so both see the same sessions).
    let last = '';
    try { last = localStorage.getItem(USER_KEY) || ''; } catch { /* storage may be off */ }
    if (!last && cfg && cfg.dev_user) last = cfg.dev_user;
    const user = h('input', { id: 'user', name: 'user', required: true, maxLength: 128, autocomplete: 'username', spellcheck: false, value: last });
    const form = h('form', { method: 'get', action: (cfg && cfg.login_url) || '/auth/dev', class: 'login-form', id: 'login' },
      h('div', { class: 'field' }, h('label', { htmlFor: 'user', text: 'User name' }), user),
      h('button', { type: 'submit', class: 'primary', text: 'Sign in' }));
    form.addEventListener('submit', () => {
      try {
        sessionStorage.setItem(NEXT_KEY, here);
        localStorage.setItem(USER_KEY, user.value.trim());
      } catch { /* storage may be off: we land on the sessions page */ }
    });
    parts.push(form, h('p', { class: 'hint', text: 'This server uses the development identity: anyone on this machine can sign in under any name. It works on loopback only.' }));
  }
  main.replaceChildren(h('section', { class: 'login card' }, parts));
  const first = main.querySelector('input, a.button');
  if (first) first.focus();
}

// Links marked data-nav are followed by the router without a page load.
document.addEventListener('click', (e) => {
  const a = e.target.closest('a[data-nav]');
  if (!a || e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
  const url = new URL(a.href, location.href);
  if (url.origin !== location.origin) return;
  e.preventDefault();
  if (url.pathname + url.search !== location.pathname + location.search) app.navigate(url.pathname + url.search);
});
addEventListener('popstate', () => route({ focus: true }));

async function boot() {
  let who = null;
  try {
    who = await api.whoami();
  } catch (err) {
    if (err.status === 401) return showLogin();
    main.replaceChildren(h('section', { class: 'notfound' },
      h('h1', { text: 'Atrium is not reachable' }),
      h('p', { text: `${err.message} Reload the page to try again.` })));
    return;
  }
  if (who && who.user) app.me = who.user;
  else {
    // No /v1/whoami: the name signed in with is a hint until a session says.
    try { app.me = localStorage.getItem(USER_KEY) || ''; } catch { /* unknown */ }
  }
  renderAccount();
  let next = null;
  try {
    next = sessionStorage.getItem(NEXT_KEY);
    sessionStorage.removeItem(NEXT_KEY);
  } catch { /* none */ }
  if (next && next.startsWith('/') && !next.startsWith('//') && location.pathname === '/') {
    history.replaceState(null, '', next);
  }
  route();
}

boot();
