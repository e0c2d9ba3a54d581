// timeline.js: the scrolling list of event rows, with a bounded DOM. Rows for
// a window vlo … vhi of the store are in the document, at most MAX_ROWS of
// them; scrolling near the top renders older rows (reading an older page
// over REST first when the store has none), scrolling near the bottom
// renders newer ones, and rows far out of view are removed. While the reader
// is at the bottom the timeline follows the live end; otherwise new events
// wait behind a "new events" button. DOM work is batched to one frame.
//
// Opening at the live end renders only the tail first (TAIL rows, enough to
// fill a tall window), so the latest event is painted after the least work;
// the rows above it, up to INITIAL, are added after that frame is painted.
// Rows skip layout and paint while off screen (CSS content-visibility).
// A burst of events is rendered when it pauses (BURST_QUIET), not per frame.

import { h, plural, later } from './dom.js';

/** MAX_ROWS bounds the rows in the document. */
export const MAX_ROWS = 400;
const CHUNK = 100; // rows rendered at once when scrolling
const INITIAL = 150; // rows rendered when (re)opening at the live end, in two steps:
const TAIL = 40; // rows rendered in the first frame, the rest after it is painted
// A burst (more than INITIAL events behind the live end while following, as
// a resume's catch-up brings them frame after frame) is rendered once it
// pauses for BURST_QUIET ms, or every BURST_MAX ms while it lasts, not at
// every animation frame: each render would replace the rows shown.
const BURST_QUIET = 12;
const BURST_MAX = 1000;
const EDGE = 400; // px from an edge that loads more
// A scroll within INTENT_MS of one of INTENT_EVENTS is the reader's.
const INTENT_MS = 1000;
const INTENT_EVENTS = ['wheel', 'touchstart', 'touchmove', 'keydown', 'pointerdown'];
const NAV_KEYS = new Set(['PageUp', 'PageDown', 'ArrowUp', 'ArrowDown', 'Home', 'End', ' ']);

export class Timeline {
  /**
   * opts: scroller (the scrolling element), list (the rows' container),
   * model, row(ev) → element, older() → Promise<boolean> (reads an older
   * page into the model; false when there is none).
   */
  constructor({ scroller, list, model, row, older }) {
    this.scroller = scroller;
    this.list = list;
    this.model = model;
    this.row = row;
    this.readOlder = older;
    this.vlo = 1;
    this.vhi = 0; // empty
    this.following = true;
    this.loadingOlder = false;
    this.scheduled = null; // cancels a scheduled render
    this.filling = null; // cancels the fill scheduled after the tail's first paint
    this.top = h('div', { class: 'edge top' });
    this.jump = h('button', { type: 'button', class: 'jump', hidden: true, on: { click: () => this.jumpToLatest() } });
    scroller.prepend(this.top);
    scroller.appendChild(this.jump);
    this.lastTop = 0;
    // Only the reader stops the following: a scroll up counts when the
    // reader touched the timeline just before (wheel, touch, keys, the
    // scroll bar) or a script scrolled it (an untrusted event). A scroll the
    // browser made on its own (a row above changing size, scroll
    // anchoring, content-visibility sizing rows) keeps the live end.
    this.intentAt = -Infinity;
    // A pointer counts on the scroller itself (its scroll bar), not on a
    // control in a row: a click on an approval's option changes rows near
    // the live end, and the scroll that follows is not the reader leaving
    // it (the real-agent test lost the live end that way). Space on a
    // button presses it.
    this.onIntent = (e) => {
      if (e.type === 'pointerdown' && e.target !== scroller) return;
      if (e.type === 'keydown' && (!NAV_KEYS.has(e.key) || e.target.closest?.('input, textarea, select, [contenteditable]')
        || (e.key === ' ' && e.target.closest?.('button, summary, a')))) return;
      this.intentAt = performance.now();
    };
    this.onScroll = (e) => this.scrolled(!e.isTrusted || performance.now() - this.intentAt < INTENT_MS);
    scroller.addEventListener('scroll', this.onScroll, { passive: true });
    for (const t of INTENT_EVENTS) window.addEventListener(t, this.onIntent, { passive: true, capture: true });
    // Keep the live end in view when the timeline or its rows change size.
    this.resize = new ResizeObserver(() => { if (this.following && this.rendered > 0) this.toBottom(); });
    this.resize.observe(scroller);
    this.resize.observe(list);
  }

  get store() { return this.model.store; }
  get rendered() { return this.vhi - this.vlo + 1; }

  /** changed schedules a render after events were added at either end. */
  changed() {
    this.lastChange = performance.now();
    if (this.scheduled) return;
    this.scheduled = later(() => { this.scheduled = null; this.render(); });
  }

  /** refresh re-renders every row in the window (after a role change, for example). */
  refresh() {
    for (let s = this.vlo; s <= this.vhi; s++) this.update(s, false);
    if (this.following && this.rendered > 0) this.toBottom();
  }

  /**
   * reshape re-renders the row of seq after the reader changed it (showed
   * more of it): the rows on screen keep their place, and the timeline stops
   * following the live end until the reader scrolls back down.
   */
  reshape(seq) {
    this.following = false;
    this.keep(() => this.update(seq));
    this.lastTop = this.scroller.scrollTop;
    this.edges();
  }

  /**
   * update re-renders the row of seq if it is in the document. A row that
   * changes size (a tool call's card completed by a later event) may make
   * the browser move the scroll position; while following, the live end
   * stays in view and that move is not taken for the reader scrolling up.
   */
  update(seq, settle = true) {
    if (seq < this.vlo || seq > this.vhi) return;
    const el = this.list.children[seq - this.vlo];
    const ev = this.store.get(seq);
    if (!el || !ev) return;
    el.replaceWith(this.row(ev));
    if (settle && this.following) this.toBottom();
  }

  render() {
    const st = this.store;
    if (this.rendered > 0 && this.following && st.hi - this.vhi > INITIAL) {
      const now = performance.now();
      if (!this.burstFrom) this.burstFrom = now;
      if (now - this.lastChange < BURST_QUIET && now - this.burstFrom < BURST_MAX) {
        this.scheduled = later(() => { this.scheduled = null; this.render(); });
        return;
      }
    }
    this.burstFrom = 0;
    if (this.rendered > 0 && this.following && st.hi - this.vhi > INITIAL) {
      // A burst (a resume catching up) while following: rendering all of
      // it would push the rows shown out anyway; start the window afresh
      // at the live end, tail first.
      this.vlo = 1;
      this.vhi = 0;
    }
    if (this.rendered <= 0) {
      if (st.size === 0) return this.edges();
      this.vhi = st.hi;
      this.vlo = Math.max(st.lo, st.hi - TAIL + 1);
      this.list.replaceChildren(this.rows(this.vlo, this.vhi));
      this.toBottom();
      this.fillLater();
    } else if (this.vhi < st.hi && this.following) {
      const from = Math.max(this.vhi + 1, st.hi - MAX_ROWS + 1);
      if (from > this.vhi + 1) { // so much arrived that the window starts afresh
        this.list.replaceChildren();
        this.vlo = from;
      }
      this.list.appendChild(this.rows(from, st.hi));
      this.vhi = st.hi;
      this.trimTop();
      this.toBottom();
    }
    this.model.trim(this.vlo);
    this.edges();
  }

  // fillLater adds the rows above the tail, up to INITIAL, once the
  // tail's frame is painted (a timer queued from an animation frame runs
  // after that frame).
  fillLater() {
    if (this.filling) this.filling();
    let t = 0;
    const r = requestAnimationFrame(() => { t = setTimeout(() => { this.filling = null; this.fill(); }, 0); });
    this.filling = () => { cancelAnimationFrame(r); clearTimeout(t); this.filling = null; };
  }

  fill() {
    const n = Math.min(INITIAL - this.rendered, this.vlo - this.store.lo);
    if (n <= 0 || this.rendered <= 0) return;
    this.keep(() => {
      this.list.prepend(this.rows(this.vlo - n, this.vlo - 1));
      this.vlo -= n;
    });
    if (this.following) this.toBottom();
    this.lastTop = this.scroller.scrollTop;
    this.edges();
  }

  rows(from, to) {
    const frag = document.createDocumentFragment();
    for (let s = from; s <= to; s++) frag.appendChild(this.row(this.store.get(s)));
    return frag;
  }

  trimTop() {
    let n = this.rendered - MAX_ROWS;
    while (n-- > 0) {
      this.list.firstElementChild.remove();
      this.vlo++;
    }
  }

  trimBottom() {
    let n = this.rendered - MAX_ROWS;
    while (n-- > 0) {
      this.list.lastElementChild.remove();
      this.vhi--;
    }
  }

  toBottom() {
    this.scroller.scrollTop = this.scroller.scrollHeight;
    this.lastTop = this.scroller.scrollTop;
  }

  atBottom() {
    const s = this.scroller;
    return s.scrollTop + s.clientHeight >= s.scrollHeight - 48;
  }

  // scrolled follows the reader: at the bottom the timeline follows the live
  // end; the reader's scroll up stops following. A scroll the browser made
  // (byReader false: rows changing size above, scroll anchoring) never
  // stops it: the live end is put back in view, as the ResizeObserver does.
  // While following, rows far behind the store's end are a burst (a resume
  // catching up) that the scheduled render shows, starting the window
  // afresh; only a reader who left the live end steps back towards it.
  scrolled(byReader = true) {
    const top = this.scroller.scrollTop;
    const up = top < this.lastTop - 1;
    this.lastTop = top;
    if (this.atBottom()) {
      if (!this.following && this.store.hi - this.vhi > MAX_ROWS) {
        this.newer(); // reading far back: step towards the live end
      } else {
        this.following = true;
        if (this.vhi < this.store.hi) this.changed();
      }
    } else if (up && byReader) {
      this.following = false;
    } else if (this.following) {
      this.toBottom();
    }
    if (top < EDGE) this.older();
    this.edges();
  }

  // keep runs fn, then scrolls so the first visible row stays where it was.
  keep(fn) {
    const top = this.scroller.getBoundingClientRect().top;
    let anchor = null;
    let offset = 0;
    for (const el of this.list.children) {
      const r = el.getBoundingClientRect();
      if (r.bottom > top) {
        anchor = el;
        offset = r.top;
        break;
      }
    }
    fn();
    if (anchor && anchor.isConnected) this.scroller.scrollTop += anchor.getBoundingClientRect().top - offset;
  }

  /** older shows older rows, reading an older page first if needed. */
  async older() {
    if (this.loadingOlder || this.rendered <= 0 || this.filling) return; // the fill comes first
    if (this.vlo > this.store.lo) {
      const n = Math.min(CHUNK, this.vlo - this.store.lo);
      this.keep(() => {
        this.list.prepend(this.rows(this.vlo - n, this.vlo - 1));
        this.vlo -= n;
        this.trimBottom();
      });
      this.lastTop = this.scroller.scrollTop;
      this.following = this.following && this.vhi >= this.store.hi;
      this.edges();
      return;
    }
    if (this.store.lo <= 1) return;
    this.loadingOlder = true;
    this.edges();
    let more = false;
    try {
      more = await this.readOlder();
    } finally {
      this.loadingOlder = false;
    }
    this.edges();
    if (more && this.scroller.scrollTop < EDGE) this.older();
  }

  newer() {
    const n = Math.min(CHUNK, this.store.hi - this.vhi);
    if (n <= 0) return;
    this.keep(() => {
      this.list.appendChild(this.rows(this.vhi + 1, this.vhi + n));
      this.vhi += n;
      this.trimTop();
    });
    this.lastTop = this.scroller.scrollTop;
    this.following = this.vhi >= this.store.hi && this.atBottom();
  }

  /** jumpToLatest shows the live end and follows it. */
  jumpToLatest() {
    if (this.filling) this.filling();
    this.vlo = 1;
    this.vhi = 0;
    this.following = true;
    this.list.replaceChildren();
    this.render();
  }

  edges() {
    const st = this.store;
    let top = '';
    if (this.loadingOlder) top = 'Loading older events…';
    else if (this.rendered > 0 && this.vlo <= 1) top = 'Beginning of the session';
    else if (this.rendered > 0) top = 'Scroll up for older events';
    this.top.textContent = top;
    this.top.classList.toggle('busy', this.loadingOlder);
    const behind = st.hi - this.vhi;
    const show = this.rendered > 0 && (!this.following || behind > 0) && !this.atBottomWithAll();
    this.jump.hidden = !show;
    if (show) this.jump.textContent = behind > 0 ? `↓ ${plural(behind, 'new event')}` : '↓ Latest';
  }

  atBottomWithAll() {
    return this.vhi >= this.store.hi && this.atBottom();
  }

  /** destroy stops listening and cancels pending work. */
  destroy() {
    this.scroller.removeEventListener('scroll', this.onScroll);
    for (const t of INTENT_EVENTS) window.removeEventListener(t, this.onIntent, { capture: true });
    this.resize.disconnect();
    this.top.remove();
    this.jump.remove();
    if (this.scheduled) this.scheduled();
    if (this.filling) this.filling();
  }
}
