// The admin API client: every call carries the pasted token, kept in this
// tab's session storage only (never in a URL, a cookie or a log).

const KEY = 'relay.token';

export const token = {
  get: () => sessionStorage.getItem(KEY),
  set: (t) => sessionStorage.setItem(KEY, t),
  clear: () => sessionStorage.removeItem(KEY),
};

// The API lives next to /ui/: the dashboard at <base>ui/ calls <base>v1/…,
// so it works when the admin handler is mounted under a path prefix.
const base = new URL('../', location.href.split('#')[0]);

// Problem is a refused or failed call, with its RFC 9457 body.
export class Problem extends Error {
  constructor(body, status) {
    super(body.detail || body.title || `HTTP ${status}`);
    this.problem = body;
    this.status = status;
  }
}

// api calls the admin API and returns the decoded body, or throws a Problem.
export async function api(method, path, body) {
  const headers = { Accept: 'application/json, application/problem+json' };
  const t = token.get();
  if (t) headers.Authorization = 'Bearer ' + t;
  const init = { method, headers, cache: 'no-store', credentials: 'omit', referrerPolicy: 'no-referrer' };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  let r;
  try {
    r = await fetch(new URL(path, base), init);
  } catch (e) {
    throw new Problem({ title: 'Network error', detail: `The API did not answer: ${e.message}` }, 0);
  }
  const text = await r.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { /* not JSON */ }
  if (!r.ok) {
    const p = data && typeof data === 'object' ? data : { title: r.statusText, status: r.status, detail: text.slice(0, 500) };
    throw new Problem(p, r.status);
  }
  return data;
}

// query builds a query string from the non-empty values of an object; an
// array value repeats its key (tag=a&tag=b).
export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    for (const x of Array.isArray(v) ? v : [v]) {
      if (x !== undefined && x !== null && x !== '') q.append(k, x);
    }
  }
  const s = q.toString();
  return s ? '?' + s : '';
}
