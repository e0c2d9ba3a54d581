// api.js: the REST half of the wire contract (DESIGN §7). The browser is
// authenticated by its login cookie; every error becomes an APIError with
// the contract's code and message.

/** APIError is a failed request: HTTP status plus the contract's error code and message. */
export class APIError extends Error {
  constructor(status, code, message) {
    super(message);
    this.name = 'APIError';
    this.status = status;
    this.code = code;
  }
}

const statusCodes = {
  400: 'bad_request', 401: 'unauthenticated', 403: 'forbidden', 404: 'not_found', 409: 'conflict',
  413: 'payload_too_large', 429: 'too_many_requests', 503: 'unavailable',
};

/**
 * request sends a JSON request and returns the decoded JSON body (null for
 * 204). A response that is not JSON (such as the UI's own page, for a route
 * this server does not have) is a not_found APIError.
 */
export async function request(method, path, body, { signal } = {}) {
  const init = { method, headers: { Accept: 'application/json' }, credentials: 'same-origin', signal };
  if (body !== undefined) {
    init.headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  let res;
  try {
    res = await fetch(path, init);
  } catch (err) {
    if (err.name === 'AbortError') throw err;
    throw new APIError(0, 'network', 'Cannot reach the Atrium server. Check your connection; retrying will resume where you left off.');
  }
  const json = (res.headers.get('Content-Type') || '').includes('application/json');
  let data = null;
  if (json && res.status !== 204) data = await res.json().catch(() => null);
  if (!res.ok) {
    const e = data && data.error;
    const retry = res.headers.get('Retry-After');
    let msg = (e && e.message) || `${res.status} ${res.statusText}`;
    if (retry && res.status === 429) msg += ` (try again in ${retry} s)`;
    throw new APIError(res.status, (e && e.code) || statusCodes[res.status] || 'internal', msg);
  }
  if (res.status !== 204 && !json) throw new APIError(404, 'not_found', `${path} is not available on this server`);
  return data;
}

const enc = encodeURIComponent;
const base = (id) => `/v1/sessions/${enc(id)}`;

/** listSessions returns the sessions the caller may see, newest first. */
export async function listSessions(opts) {
  return (await request('GET', '/v1/sessions', undefined, opts)).sessions || [];
}

/**
 * createSession creates a session; harness is a template name, agent an installed agent's name (one or neither),
 * permissionMode an agent session's permission mode ('' for the server's).
 */
export function createSession(title, harness, agent, permissionMode) {
  const body = {};
  if (title) body.title = title;
  if (harness) body.harness = harness;
  if (agent) body.agent = agent;
  if (agent && permissionMode) body.settings = { permission_mode: permissionMode };
  return request('POST', '/v1/sessions', body);
}

/** listAgents returns [{name, version}]: the agents installed on the nodes. */
export async function listAgents(opts) {
  return (await request('GET', '/v1/agents', undefined, opts)).agents || [];
}

/** getSession returns one Session object. */
export function getSession(id, opts) {
  return request('GET', base(id), undefined, opts);
}

/** events returns {events, last_seq, epoch}: up to limit events after seq after. */
export function events(id, after, limit, opts) {
  return request('GET', `${base(id)}/events?after=${after}&limit=${limit}`, undefined, opts);
}

/** deleteSession deletes the session for everyone (owner). */
export function deleteSession(id) {
  return request('DELETE', base(id));
}

/** setMember gives user a role on the session ("none" removes them). */
export function setMember(id, user, role) {
  return request('PUT', `${base(id)}/members/${enc(user)}`, { role });
}

/**
 * approve answers an approval request over REST (the page normally uses
 * its WebSocket); optionID is the agent's option, when it offered some.
 */
export function approve(id, approvalID, allow, optionID) {
  const body = { allow };
  if (optionID) body.option_id = optionID;
  return request('POST', `${base(id)}/approvals/${enc(approvalID)}`, body);
}

/** cancel stops the running turn over REST. */
export function cancel(id) {
  return request('POST', `${base(id)}/cancel`, {});
}

/**
 * authConfig returns GET /auth/config ({mode, login_url …}), or null on a
 * server that has no such route (the dev identity of `atrium dev`).
 */
export async function authConfig() {
  try {
    return await request('GET', '/auth/config');
  } catch (err) {
    if (err instanceof APIError && err.status === 404) return null;
    throw err;
  }
}

/**
 * whoami returns the caller ({user, tenant, admin, via}), null on a server
 * without /v1/whoami, and throws an unauthenticated APIError when nobody is
 * logged in.
 */
export async function whoami() {
  try {
    return await request('GET', '/v1/whoami');
  } catch (err) {
    if (err instanceof APIError && err.status === 404) return null;
    throw err;
  }
}

// --- the session's workspace (DESIGN §7 "More REST") ---------------------

const encPath = (p) => String(p).split('/').map(enc).join('/');

/** listFiles returns the entries ({path, type, size, mode, mtime}) of folder dir ("" is the workspace). */
export async function listFiles(id, dir, opts) {
  const q = dir ? `?path=${enc(dir)}` : '';
  return (await request('GET', `${base(id)}/files${q}`, undefined, opts)).entries || [];
}

/** fileURL is where a file's bytes are (a download link, or fetched to show it). */
export function fileURL(id, path) {
  return `${base(id)}/files/${encPath(path)}`;
}

/** archiveURL is a tar.gz of folder dir ("" is the whole workspace). */
export function archiveURL(id, dir) {
  return `${base(id)}/archive${dir ? `?path=${enc(dir)}` : ''}`;
}

/**
 * readFile returns up to max bytes of a file as {bytes (Uint8Array), size,
 * truncated}, reading no further than max.
 */
export async function readFile(id, path, max, { signal } = {}) {
  let res;
  try {
    res = await fetch(fileURL(id, path), { credentials: 'same-origin', signal });
  } catch (err) {
    if (err.name === 'AbortError') throw err;
    throw new APIError(0, 'network', 'Cannot reach the Atrium server.');
  }
  if (!res.ok) {
    const data = await res.json().catch(() => null);
    const e = data && data.error;
    throw new APIError(res.status, (e && e.code) || statusCodes[res.status] || 'internal', (e && e.message) || `${res.status} ${res.statusText}`);
  }
  const size = Number(res.headers.get('Content-Length')) || 0;
  const reader = res.body.getReader();
  const parts = [];
  let got = 0;
  while (got < max) {
    const { done, value } = await reader.read();
    if (done) break;
    parts.push(value);
    got += value.length;
  }
  const truncated = got >= max && (size > max || !(await reader.read()).done);
  reader.cancel().catch(() => {});
  const bytes = new Uint8Array(Math.min(got, max));
  let off = 0;
  for (const p of parts) {
    const n = Math.min(p.length, bytes.length - off);
    bytes.set(p.subarray(0, n), off);
    off += n;
  }
  return { bytes, size: size || got, truncated };
}

/** putFile writes a file (a driver's upload); the write is ordered with the session's turns. */
export async function putFile(id, path, blob) {
  let res;
  try {
    res = await fetch(fileURL(id, path), { method: 'PUT', body: blob, credentials: 'same-origin', headers: { 'Content-Type': 'application/octet-stream' } });
  } catch {
    throw new APIError(0, 'network', 'Cannot reach the Atrium server.');
  }
  if (!res.ok) {
    const data = await res.json().catch(() => null);
    const e = data && data.error;
    throw new APIError(res.status, (e && e.code) || statusCodes[res.status] || 'internal', (e && e.message) || `${res.status} ${res.statusText}`);
  }
}

/** turnChanges returns {files: [{path, status, diff?}]}: what turn n changed in the workspace. */
export function turnChanges(id, n, opts) {
  return request('GET', `${base(id)}/turns/${n}/changes`, undefined, opts);
}

/** fork makes a new session from this one's history up to atSeq and its workspace as of then. */
export function fork(id, atSeq, title) {
  const body = {};
  if (atSeq) body.at_seq = atSeq;
  if (title) body.title = title;
  return request('POST', `${base(id)}/fork`, body);
}

// --- managing a session (owner; DESIGN §7, docs/automation.md) -----------

/** patchSession changes a session's title and settings: {title?, settings?} → Session. */
export function patchSession(id, body) {
  return request('PATCH', base(id), body);
}

/** putEgress replaces the session's own egress allowlist → Session. */
export function putEgress(id, allow) {
  return request('PUT', `${base(id)}/egress`, { allow });
}

/** listSecrets returns the session's secrets as [{name, updated_at, updated_by}]: never values. */
export async function listSecrets(id, opts) {
  return (await request('GET', `${base(id)}/secrets`, undefined, opts)).secrets || [];
}

/** putSecret sets a secret's value; the value goes to the session's node only and is never read back. */
export function putSecret(id, name, value) {
  return request('PUT', `${base(id)}/secrets/${enc(name)}`, { value });
}

/** deleteSecret removes a secret. */
export function deleteSecret(id, name) {
  return request('DELETE', `${base(id)}/secrets/${enc(name)}`);
}

/** listSchedules returns the schedules the caller sees (theirs, or the tenant's for an admin). */
export async function listSchedules(opts) {
  return (await request('GET', '/v1/schedules', undefined, opts)).schedules || [];
}

/** createSchedule creates a schedule: {cron, tz?, session, prompt, missed?} → Schedule. */
export function createSchedule(spec) {
  return request('POST', '/v1/schedules', spec);
}

/** deleteSchedule deletes a schedule. */
export function deleteSchedule(id) {
  return request('DELETE', `/v1/schedules/${enc(id)}`);
}

/** pauseSchedule pauses (pause true) or resumes a schedule → Schedule. */
export function pauseSchedule(id, pause) {
  return request('POST', `/v1/schedules/${enc(id)}/${pause ? 'pause' : 'resume'}`, {});
}

/**
 * listTasks returns the repository tasks the caller sees, or null on a
 * server that does not list them (GET /v1/tasks is newer than tasks).
 */
export async function listTasks(opts) {
  try {
    return (await request('GET', '/v1/tasks', undefined, opts)).tasks || [];
  } catch (err) {
    if (err instanceof APIError && (err.status === 404 || err.status === 405)) return null;
    throw err;
  }
}
