// stream.js: the WebSocket half of the wire contract (DESIGN §7) for one
// session, with resume. The stream remembers the seq of the last event it
// delivered; every (re)connection asks for ?after=that, so the server replays
// exactly what was missed. Events at or before it are dropped (never
// delivered twice); an event that skips ahead (never expected from the
// server) makes the stream reconnect from the last one it has, rather than
// deliver a gap. Lost connections are retried with exponential backoff and
// jitter, at once when the browser comes back online, and a connection that
// sat in a hidden tab for long is renewed when the tab shows again, since a
// phone that slept may hold a socket that is silently dead.

/** Subprotocol is the WebSocket subprotocol of the client protocol. */
export const SUBPROTOCOL = 'atrium.v1';
/** SUBPROTOCOL_BATCH adds events frames (history in batches); offered first. */
export const SUBPROTOCOL_BATCH = 'atrium.v1+batch';

const BACKOFF_MIN = 250; // ms, first retry
const BACKOFF_MAX = 15000; // ms
const HIDDEN_RENEW = 30000; // ms hidden after which the socket is renewed

// Close reasons after which reconnecting cannot help.
const FATAL = {
  'session deleted': 'This session was deleted.',
  'access revoked': 'Your access to this session was removed.',
  not_found: 'This session does not exist, or you have no access to it.',
  forbidden: 'You have no access to this session.',
  unauthenticated: 'Your login expired. Sign in again.',
};

/**
 * Stream connects to a session's WebSocket and keeps it connected.
 * handlers: onHello(frame), onEvent(event), onDelta(frame), onPresence(frame), onAck(frame),
 * onError(frame), onStatus({state, retryAt, reason}), onFatal(message, code),
 * onReset() (the cursor is beyond the log: the page must load it afresh),
 * and check() → Promise: called when a connection failed before its hello
 * (the browser hides the HTTP status of a refused WebSocket), so the page can
 * ask REST why and end the stream if retrying is pointless.
 */
export class Stream {
  constructor(id, handlers) {
    this.id = id;
    this.h = handlers;
    this.last = 0; // seq of the last event delivered
    this.ws = null;
    this.ready = false; // the current socket has said hello
    this.attempt = 0;
    this.timer = null;
    this.retryAt = 0;
    this.stopped = false;
    this.hiddenAt = 0;
    this.onOnline = () => { if (!this.ws && !this.stopped) this.connect(); };
    this.onOffline = () => { if (!this.ws && !this.stopped) this.status('offline'); };
    this.onVisibility = () => {
      if (document.hidden) {
        this.hiddenAt = Date.now();
      } else if (this.hiddenAt && Date.now() - this.hiddenAt > HIDDEN_RENEW && this.ws) {
        this.renew();
      }
    };
    addEventListener('online', this.onOnline);
    addEventListener('offline', this.onOffline);
    document.addEventListener('visibilitychange', this.onVisibility);
  }

  /** start connects, resuming after seq after. */
  start(after) {
    this.last = after;
    this.connect();
  }

  /** url is the WebSocket address that resumes after the last event delivered. */
  url() {
    const proto = location.protocol === 'https:' ? 'wss:' : 'ws:';
    return `${proto}//${location.host}/v1/sessions/${encodeURIComponent(this.id)}/ws?after=${this.last}`;
  }

  connect() {
    clearTimeout(this.timer);
    this.timer = null;
    if (this.stopped || this.ws) return;
    this.status('connecting');
    let ws;
    try {
      ws = new WebSocket(this.url(), [SUBPROTOCOL_BATCH, SUBPROTOCOL]);
    } catch {
      this.retry(false);
      return;
    }
    this.ws = ws;
    this.ready = false;
    ws.onmessage = (m) => { if (this.ws === ws) this.frame(m.data); };
    ws.onclose = (e) => {
      if (this.ws !== ws) return;
      const hadHello = this.ready;
      this.ws = null;
      this.ready = false;
      this.closed(e, hadHello);
    };
  }

  frame(data) {
    let f;
    try {
      f = JSON.parse(data);
    } catch {
      return; // not JSON: never sent by the server; ignore
    }
    switch (f.type) {
      case 'hello':
        this.ready = true;
        this.attempt = 0;
        this.status('live');
        this.h.onHello(f);
        break;
      case 'event': {
        const ev = f.event;
        if (!ev || typeof ev.seq !== 'number' || ev.seq <= this.last) return; // a duplicate
        if (ev.seq !== this.last + 1) {
          this.renew(); // a gap: resume from the last event delivered
          return;
        }
        this.last = ev.seq;
        this.h.onEvent(ev);
        break;
      }
      case 'events': // a batch of events, in seq order (atrium.v1+batch)
        for (const ev of Array.isArray(f.events) ? f.events : []) {
          if (!ev || typeof ev.seq !== 'number' || ev.seq <= this.last) continue;
          if (ev.seq !== this.last + 1) {
            this.renew();
            return;
          }
          this.last = ev.seq;
          this.h.onEvent(ev);
        }
        break;
      case 'delta': // streaming agent text: not an event, never replayed
        if (this.h.onDelta && typeof f.text === 'string') this.h.onDelta(f);
        break;
      case 'presence':
        this.h.onPresence(f);
        break;
      case 'ack':
        this.h.onAck(f);
        break;
      case 'error':
        this.h.onError(f);
        break;
    }
  }

  closed(e, hadHello) {
    if (this.stopped) return;
    const fatal = FATAL[e.reason];
    if (fatal && (e.code === 1000 || e.code === 1008)) {
      this.stop();
      this.status('closed', e.reason);
      this.h.onFatal(fatal, e.reason);
      return;
    }
    if (e.code === 1008 && e.reason === 'bad_request' && !hadHello && this.h.onReset) {
      // The cursor is past the end of the log (the log was rebuilt): the
      // page must start again from what the server has now.
      this.stop();
      this.h.onReset();
      return;
    }
    if (e.code === 1008 && e.reason === 'slow consumer') this.attempt = 0; // catch up by cursor at once
    this.retry(!hadHello);
  }

  async retry(check) {
    if (this.stopped) return;
    if (check && this.h.check) {
      try {
        if (!(await this.h.check())) return; // the page ended the stream
      } catch {
        // Unknown: keep trying.
      }
      if (this.stopped || this.ws) return;
    }
    if (navigator.onLine === false) {
      this.status('offline');
      return; // the online event reconnects
    }
    const base = Math.min(BACKOFF_MAX, BACKOFF_MIN * 2 ** this.attempt);
    const delay = Math.round(base * (0.8 + Math.random() * 0.4));
    this.attempt++;
    this.retryAt = Date.now() + delay;
    this.status('waiting');
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.connect(), delay);
  }

  /** reconnectNow skips the rest of the backoff. */
  reconnectNow() {
    if (!this.stopped && !this.ws) this.connect();
  }

  // renew drops the current socket and connects again at once.
  renew() {
    const ws = this.ws;
    this.ws = null;
    this.ready = false;
    if (ws) {
      ws.onclose = null;
      ws.onmessage = null;
      ws.close(1000, 'resume');
    }
    this.connect();
  }

  status(state, reason) {
    this.h.onStatus({ state, retryAt: this.retryAt, reason });
  }

  /** send writes a client frame; it returns false when not connected. */
  send(frame) {
    if (!this.ws || !this.ready || this.ws.readyState !== WebSocket.OPEN) return false;
    this.ws.send(JSON.stringify(frame));
    return true;
  }

  /** connected reports whether frames can be sent now. */
  get connected() {
    return !!(this.ws && this.ready && this.ws.readyState === WebSocket.OPEN);
  }

  /** stop closes the stream for good. It is safe to call twice. */
  stop() {
    this.stopped = true;
    clearTimeout(this.timer);
    this.timer = null;
    removeEventListener('online', this.onOnline);
    removeEventListener('offline', this.onOffline);
    document.removeEventListener('visibilitychange', this.onVisibility);
    const ws = this.ws;
    this.ws = null;
    if (ws) {
      ws.onclose = null;
      ws.onmessage = null;
      ws.close(1000, 'page closed');
    }
  }
}
