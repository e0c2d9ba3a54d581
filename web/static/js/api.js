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

/** createSession creates a session; harness is a template name. */
export function createSession(title, harness) {
  const body = {};
  if (title) body.title = title;
  if (harness) body.harness = harness;
  return request('POST', '/v1/sessions', body);
}

/** getSession returns one Session object. */
export function getSession(id, opts) {
  return request('GET', base(id), undefined, opts);
}

/** events returns {events, last_seq, epoch}: up to limit events after seq after. */
export function events(id, after, limit, opts) {
  return request('GET', `${base(id)}/events?after=${after}&limit=${limit}`, undefined, opts);
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
