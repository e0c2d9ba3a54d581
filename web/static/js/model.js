// model.js: what the page knows about one session's log. It has no DOM.
//
// Store holds a contiguous run of events, lo … hi, in seq order: the page
// loads the latest page first and older pages as the reader scrolls up, so
// the run grows at both ends, and its oldest part is dropped when it grows
// past MAX_STORE while the reader follows the live end.
//
// Model folds events into the session's current state: the running turn,
// its pending approvals, the prompts queued behind it, the last finished
// turn, the sandbox state and the members. Folding starts at the first event
// the page loaded, so the state may depend on older events; exact() says
// when it does not, and needsFrom() how far back the page must read for it
// to become exact.

/** MAX_STORE bounds the events kept in memory while following the live end. */
export const MAX_STORE = 20000;

/** Store is a contiguous run of events lo … hi (hi = lo - 1 when empty). */
export class Store {
  constructor(after = 0) {
    this.lo = after + 1;
    this.evs = [];
  }

  get hi() { return this.lo + this.evs.length - 1; }
  get size() { return this.evs.length; }

  /** get returns the event with seq, or undefined if it is not held. */
  get(seq) {
    const i = seq - this.lo;
    return i >= 0 && i < this.evs.length ? this.evs[i] : undefined;
  }

  /** append adds the event right after hi. */
  append(ev) {
    if (ev.seq !== this.hi + 1) throw new Error(`store: event ${ev.seq} does not follow ${this.hi}`);
    this.evs.push(ev);
  }

  /** prepend adds events that end right before lo, oldest first. */
  prepend(list) {
    if (!list.length) return;
    if (list[list.length - 1].seq !== this.lo - 1) throw new Error(`store: events up to ${list[list.length - 1].seq} do not precede ${this.lo}`);
    this.evs = list.concat(this.evs);
    this.lo = list[0].seq;
  }

  /** dropBefore forgets the events before seq. */
  dropBefore(seq) {
    const n = Math.min(seq - this.lo, this.evs.length);
    if (n <= 0) return;
    this.evs.splice(0, n);
    this.lo += n;
  }
}

const approvalKey = (turn, id) => `${turn}/${id}`;
const num = (x) => (Number.isFinite(Number(x)) && Number(x) > 0 ? Number(x) : 0);

/** Model is the page's view of one session: its events and the state they imply. */
export class Model {
  /** after is the seq the page starts reading after; sandbox the state the Session object gave. */
  constructor(after, sandbox) {
    this.store = new Store(after);
    this.sandbox = sandbox || '';
    // Indexes over every event seen, for rendering rows.
    this.started = new Map(); // turn → {seq, prompt_seq, by, time}
    this.finished = new Map(); // turn → {seq, status, exit_code, duration_ms, time}
    this.promptTurn = new Map(); // prompt seq → turn
    this.resolved = new Map(); // "turn/id" → {allow, by, seq}
    this.approvalSeq = new Map(); // "turn/id" → seq of approval_requested
    this.approvalsOfTurn = new Map(); // turn → [seq of approval_requested]
    this.toolCalls = new Map(); // tool call id → {seq: of tool_call or null, updates: [seq of tool_call_update], turn}
    this.plans = new Map(); // turn → [seq of plan], ascending
    this.usageSeen = new Set(); // seqs of usage events counted
    this.usageTurn = new Map(); // turn → {input, output, cached, cost, model}
    this.usageTotal = { input: 0, output: 0, cached: 0, cost: 0, events: 0 };
    this.usageBySeq = new Map(); // seq of a usage event → {input, output, cached, cost}
    this.messageIDs = new Map(); // agent message_id → seq of its agent_message
    this.reset(this.store.lo);
  }

  // reset clears the folded state before folding from seq from.
  reset(from) {
    this.foldFrom = from;
    this.running = null; // {turn, seq, promptSeq, by, time, approvals: Map id → {id, summary, seq}, partial}
    this.lastFinished = null;
    this.pending = new Map(); // seq → message event not yet started as a turn
    this.memberLog = []; // member_changed data folded, in order
    this.boundary = ''; // "started" or "finished": the last turn boundary folded
    this.latestPromptSeq = null;
    this.queuedDuring = new Map(); // prompt seq → turn that was running when it came
  }

  /** add appends a live event to the store and folds it. */
  add(ev) {
    this.store.append(ev);
    this.index(ev);
    this.fold(ev, true);
  }

  /**
   * addOlder prepends older events and, if the state was not exact yet,
   * folds the whole store again from its new start.
   */
  addOlder(list) {
    this.store.prepend(list);
    for (const ev of list) this.index(ev);
    if (!this.exact()) this.refold();
  }

  refold() {
    const sandbox = this.sandbox; // the live value is newer than any older event
    this.reset(this.store.lo);
    for (const ev of this.store.evs) this.fold(ev, false);
    this.sandbox = sandbox;
  }

  /** trim drops the oldest events beyond MAX_STORE, never at or after keep. */
  trim(keep) {
    const over = this.store.size - MAX_STORE;
    if (over < 1000) return; // drop in batches
    this.store.dropBefore(Math.min(this.store.lo + over, keep));
  }

  index(ev) {
    const d = ev.data || {};
    switch (ev.kind) {
      case 'turn_started':
        this.started.set(d.turn, { seq: ev.seq, prompt_seq: d.prompt_seq, by: ev.by, time: ev.time });
        this.promptTurn.set(d.prompt_seq, d.turn);
        break;
      case 'turn_finished':
        this.finished.set(d.turn, { seq: ev.seq, status: d.status, exit_code: d.exit_code, duration_ms: d.duration_ms, time: ev.time });
        break;
      case 'approval_requested': {
        const k = approvalKey(d.turn, d.id);
        this.approvalSeq.set(k, ev.seq);
        const list = this.approvalsOfTurn.get(d.turn) || [];
        list.push(ev.seq);
        this.approvalsOfTurn.set(d.turn, list);
        break;
      }
      case 'approval_resolved':
        this.resolved.set(approvalKey(d.turn, d.id), { allow: d.allow, option_id: d.option_id, by: ev.by, seq: ev.seq });
        break;
      case 'tool_call':
      case 'tool_call_update': {
        if (typeof d.id !== 'string') break;
        const tc = this.toolCalls.get(d.id) || { seq: null, updates: [], turn: d.turn };
        if (ev.kind === 'tool_call') {
          if (tc.seq === null || ev.seq < tc.seq) tc.seq = ev.seq;
        } else if (!tc.updates.includes(ev.seq)) {
          tc.updates.push(ev.seq);
          tc.updates.sort((a, b) => a - b);
        }
        this.toolCalls.set(d.id, tc);
        break;
      }
      case 'plan': {
        const list = this.plans.get(d.turn) || [];
        if (!list.includes(ev.seq)) {
          list.push(ev.seq);
          list.sort((a, b) => a - b);
        }
        this.plans.set(d.turn, list);
        break;
      }
      case 'usage': {
        if (this.usageSeen.has(ev.seq)) break;
        this.usageSeen.add(ev.seq);
        const u = this.usageTurn.get(d.turn) || { input: 0, output: 0, cached: 0, cost: 0, model: '' };
        const add = (o) => {
          o.input += num(d.input_tokens);
          o.output += num(d.output_tokens);
          o.cached += num(d.cached_tokens);
          o.cost += Number(d.cost_usd) > 0 ? Number(d.cost_usd) : 0;
        };
        add(u);
        if (d.model) u.model = String(d.model);
        this.usageTurn.set(d.turn, u);
        add(this.usageTotal);
        this.usageTotal.events++;
        const one = { input: 0, output: 0, cached: 0, cost: 0 };
        add(one);
        this.usageBySeq.set(ev.seq, one);
        break;
      }
      case 'agent_message':
        if (typeof d.message_id === 'string' && d.message_id) this.messageIDs.set(d.message_id, ev.seq);
        break;
    }
  }

  /**
   * usageAfter sums the usage events held whose seq is above seq: what
   * came after a Session object's usage totals.
   */
  usageAfter(seq) {
    const u = { input: 0, output: 0, cached: 0, cost: 0 };
    for (const [at, one] of this.usageBySeq) {
      if (at <= seq) continue;
      u.input += one.input;
      u.output += one.output;
      u.cached += one.cached;
      u.cost += one.cost;
    }
    return u;
  }

  /**
   * toolCall returns the current state of tool call id folded from the
   * events the store holds ({seq, turn, title, kind, status, content,
   * locations}), or null when its tool_call event is not held.
   */
  toolCall(id) {
    const tc = this.toolCalls.get(id);
    if (!tc || tc.seq === null) return null;
    const first = this.store.get(tc.seq);
    if (!first) return null;
    const d = first.data || {};
    const st = { seq: tc.seq, turn: d.turn, id, title: d.title || '', kind: d.kind || '', status: d.status || '', content: d.content || [], locations: d.locations || [], updated: tc.seq };
    for (const seq of tc.updates) {
      const u = this.store.get(seq);
      if (!u || seq < tc.seq) continue;
      const ud = u.data || {};
      if (ud.status) st.status = ud.status;
      if (ud.title) st.title = ud.title;
      if (Array.isArray(ud.content) && ud.content.length) st.content = ud.content;
      st.updated = seq;
    }
    return st;
  }

  /** latestPlan returns the seq of the turn's latest plan event. */
  latestPlan(turn) {
    const list = this.plans.get(turn);
    return list && list.length ? list[list.length - 1] : undefined;
  }

  fold(ev, live) {
    const d = ev.data || {};
    switch (ev.kind) {
      case 'message':
        this.pending.set(ev.seq, ev);
        if (this.running) this.queuedDuring.set(ev.seq, this.running.turn);
        break;
      case 'turn_started':
        this.running = { turn: d.turn, seq: ev.seq, promptSeq: d.prompt_seq, by: ev.by, time: ev.time, approvals: new Map(), partial: false };
        for (const seq of this.pending.keys()) if (seq <= d.prompt_seq) this.pending.delete(seq);
        this.boundary = 'started';
        this.latestPromptSeq = d.prompt_seq;
        break;
      case 'turn_finished':
        if (!this.running || this.running.turn === d.turn) this.running = null;
        this.lastFinished = { turn: d.turn, status: d.status, exit_code: d.exit_code, duration_ms: d.duration_ms, seq: ev.seq, time: ev.time };
        this.boundary = 'finished';
        break;
      case 'approval_requested':
        this.ensureRunning(d.turn, ev);
        if (this.running && this.running.turn === d.turn) this.running.approvals.set(d.id, { id: d.id, summary: d.summary, seq: ev.seq, turn: d.turn });
        break;
      case 'approval_resolved':
        if (this.running && this.running.turn === d.turn) this.running.approvals.delete(d.id);
        break;
      case 'output':
      case 'agent':
      case 'agent_message':
      case 'agent_thought':
      case 'tool_call':
      case 'tool_call_update':
      case 'plan':
      case 'usage':
        this.ensureRunning(d.turn, ev);
        break;
      case 'sandbox':
        if (live) this.sandbox = d.state;
        break;
      case 'member_changed':
        this.memberLog.push({ user: d.user, role: d.role || 'none', seq: ev.seq });
        break;
    }
  }

  // ensureRunning notes a turn whose turn_started came before the first
  // event folded: it runs, but what it started with is not known.
  ensureRunning(turn, ev) {
    if (this.boundary || this.running || typeof turn !== 'number') return;
    this.running = { turn, seq: null, promptSeq: null, by: '', time: ev.time, approvals: new Map(), partial: true };
  }

  /** runningExact reports whether the running turn and its approvals are known exactly. */
  runningExact() {
    return this.foldFrom <= 1 || this.boundary !== '';
  }

  /**
   * pendingExact reports whether every queued prompt is known. Prompts start
   * in order, one turn each, and the next starts as soon as a turn finishes;
   * so the queue is known when folding began at the start, or the last
   * boundary is a turn_finished (the queue was empty then, or a turn would
   * have started), or the latest turn_started's prompt is inside the folded
   * run.
   */
  pendingExact() {
    return this.foldFrom <= 1 || this.boundary === 'finished' ||
      (this.latestPromptSeq !== null && this.latestPromptSeq >= this.foldFrom - 1);
  }

  /** exact reports whether the running turn, approvals and queue are known. */
  exact() {
    return this.runningExact() && this.pendingExact();
  }

  /** membersExact reports whether memberLog holds every member_changed of the log. */
  membersExact() {
    return this.foldFrom <= 1;
  }

  /** approvalState returns "pending", "allowed", "denied" or "expired" for an approval. */
  approvalState(turn, id) {
    const r = this.resolved.get(approvalKey(turn, id));
    if (r) return r.allow ? 'allowed' : 'denied';
    if (this.finished.has(turn)) return 'expired';
    if (this.running && this.running.turn === turn) return 'pending';
    // Not resolved, turn not finished, and not the running turn as far as
    // the folded run knows: still pending unless a later turn has started.
    for (const t of this.started.keys()) if (t > turn) return 'expired';
    return 'pending';
  }

  resolution(turn, id) {
    return this.resolved.get(approvalKey(turn, id));
  }

  approvalRow(turn, id) {
    return this.approvalSeq.get(approvalKey(turn, id));
  }

  /** pendingHead returns up to n queued prompts, oldest first (the map is in seq order). */
  pendingHead(n) {
    const out = [];
    for (const ev of this.pending.values()) {
      if (out.length >= n) break;
      out.push(ev);
    }
    return out;
  }
}
