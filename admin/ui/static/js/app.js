// The dashboard's shell: sign-in, the session's scopes, the hash router.
import { api, token, Problem, query } from './api.js';
import { h, problemBox, okBox } from './dom.js';
import * as overview from './overview.js';
import * as jobs from './jobs.js';
import * as job from './job.js';
import * as schedules from './schedules.js';
import * as outbox from './outbox.js';
import * as workflows from './workflows.js';
import * as run from './run.js';
import * as processes from './processes.js';

const main = document.getElementById('main');
let who = null;       // GET /v1/whoami of the pasted token
let cleanup = null;   // the current page's stop (timers)
let generation = 0;   // a render started before the last navigation is stale

const routes = [
  [/^\/?$/, overview, 'overview'],
  [/^\/jobs$/, jobs, 'jobs'],
  [/^\/jobs\/(\d+)$/, job, 'jobs'],
  [/^\/workflows$/, workflows, 'workflows'],
  [/^\/workflows\/run\/(.+)$/, run, 'workflows'],
  [/^\/schedules$/, schedules, 'schedules'],
  [/^\/outbox$/, outbox, 'outbox'],
  [/^\/processes$/, processes, 'processes'],
];

// parseHash splits "#/jobs?state=dead" into a path and its parameters.
function parseHash() {
  const raw = location.hash.replace(/^#/, '') || '/';
  const i = raw.indexOf('?');
  return { path: i < 0 ? raw : raw.slice(0, i), params: new URLSearchParams(i < 0 ? '' : raw.slice(i + 1)) };
}

// go navigates to a hash route.
export function go(path, params) {
  const target = '#' + path + (params ? query(params) : '');
  if (location.hash === target) route(); else location.hash = target;
}

// action runs a write from a button: the button is disabled meanwhile, the
// outcome (or the API's problem) is shown in note, and then() runs after a
// success (typically a reload of the page).
export async function action(button, note, label, fn, then) {
  button.disabled = true;
  note.replaceChildren();
  try {
    const res = await fn();
    note.replaceChildren(okBox(typeof label === 'function' ? label(res) : label));
    if (then) await then(res);
  } catch (e) {
    if (!(e instanceof Problem)) throw e;
    note.replaceChildren(problemBox(e, 'Refused'));
    note.querySelector('[role=alert]')?.focus?.();
  } finally {
    button.disabled = false;
  }
}

function setNav(section) {
  document.getElementById('nav').hidden = false;
  for (const a of document.querySelectorAll('[data-nav]')) {
    if (a.dataset.nav === section) a.setAttribute('aria-current', 'page'); else a.removeAttribute('aria-current');
  }
  const w = document.getElementById('who');
  w.hidden = false;
  document.getElementById('signout').hidden = !token.get();
  document.getElementById('who-name').textContent = who.subject;
  const mode = document.getElementById('who-mode');
  mode.textContent = canWrite() ? 'read + write' : 'read only';
  mode.title = who.scopes.join(' ');
  showReplica();
}

// showReplica shows, when lists come from a read replica (relay serve
// --read-database-url), how far it is behind the primary.
async function showReplica() {
  const b = document.getElementById('replica');
  let r;
  try {
    r = await api('GET', 'v1/replica');
  } catch (e) {
    b.hidden = false;
    b.textContent = 'replica: unreachable';
    b.title = e.message || String(e);
    return;
  }
  b.hidden = !r.configured;
  if (!r.configured) return;
  if (!r.in_recovery) {
    b.textContent = 'replica: not a standby';
    b.title = 'The read pool\'s server is not replaying a primary\'s WAL.';
    return;
  }
  const kb = r.lag_bytes / 1024;
  b.textContent = r.lag_bytes === 0 ? 'replica lag 0 s' : `replica lag ${r.lag_seconds.toFixed(1)} s`;
  b.title = `Lists, counts and charts come from a read replica, ${kb.toFixed(1)} kB of WAL behind the primary; ` +
    'a job, run or key opened by its id, and every change, come from the primary.';
}

export const canWrite = () => !!who && who.scopes.includes('relay:write');

async function route() {
  const gen = ++generation;
  delete main.dataset.route;
  if (cleanup) { cleanup(); cleanup = null; }
  if (loginProblem) { const e = loginProblem; loginProblem = null; return login(e); }
  if (!who) {
    // Without a token, a server without authentication (relay serve
    // --no-auth, loopback only) still answers; any other asks for one.
    const had = !!token.get();
    try {
      who = await api('GET', 'v1/whoami');
    } catch (e) {
      return login(had ? e : null);
    }
  }
  const { path, params } = parseHash();
  const r = routes.find(([re]) => re.test(path));
  if (!r) {
    main.replaceChildren(h('h1', {}, 'Not found'), h('p', {}, 'No such page. ', h('a', { href: '#/' }, 'Overview')));
    main.dataset.route = location.hash;
    return;
  }
  const [re, page, section] = r;
  setNav(section);
  const m = path.match(re);
  const view = h('div', {});
  main.replaceChildren(view);
  try {
    const stop = await page.render(view, {
      params, id: m[1], canWrite: canWrite(), go, reload: route,
      stale: () => gen !== generation,
    });
    // A page left before it finished rendering stops its timers at once.
    if (gen !== generation) { if (stop) stop(); return; }
    cleanup = stop || null;
  } catch (e) {
    if (e instanceof Problem && e.status === 401) { who = null; return login(e); }
    if (gen !== generation) return;
    view.replaceChildren(e instanceof Problem ? problemBox(e, 'Could not load the page') : h('p', {}, String(e)));
    if (!(e instanceof Problem)) throw e;
  }
  if (gen !== generation) return;
  // The page is rendered: say which (tests and scripts wait for it).
  main.dataset.route = location.hash || '#/';
  if (document.activeElement === document.body) main.focus({ preventScroll: true });
}

// login asks for a token; err is why the last one was refused.
function login(err) {
  token.clear();
  who = null;
  document.getElementById('nav').hidden = true;
  document.getElementById('who').hidden = true;
  const note = h('div', { 'aria-live': 'polite' }, err ? problemBox(err, 'Sign-in refused') : null);
  const input = h('textarea', { id: 'token', name: 'token', required: true, autocomplete: 'off', spellcheck: 'false',
    'aria-describedby': 'token-help' });
  const form = h('form', { class: 'login', id: 'login' },
    h('h1', {}, 'Sign in to the Relay dashboard'),
    note,
    h('label', { for: 'token' }, 'Admin API token (JWT)'),
    input,
    h('p', { id: 'token-help', class: 'muted small' },
      'Paste a bearer token with scope relay:read (and relay:write to change things), e.g. from ',
      h('code', {}, 'relay token --subject you --ttl 8h'),
      '. It is kept in this tab\'s session storage only and sent to this server\'s API.'),
    h('div', { class: 'actions' }, h('button', { type: 'submit', id: 'signin' }, 'Sign in')));
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const t = input.value.trim().replace(/^Bearer\s+/i, '');
    if (!t) return;
    token.set(t);
    try {
      who = await api('GET', 'v1/whoami');
    } catch (e) {
      token.clear();
      note.replaceChildren(problemBox(e, 'Sign-in refused'));
      return;
    }
    route();
  });
  main.replaceChildren(form);
  input.focus();
}

document.getElementById('signout').addEventListener('click', () => {
  token.clear();
  who = null;
  go('/');
});
// exchangeLoginCode takes a one-time login code from the URL's fragment
// (relay serve's login link on loopback), drops it from the address bar and
// history, and exchanges it once for a token.
let loginProblem = null;
async function exchangeLoginCode() {
  const m = location.hash.match(/^#login=([A-Za-z0-9]+)$/);
  if (!m) return;
  history.replaceState(null, '', location.pathname + location.search + '#/');
  try {
    const r = await fetch('login', {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ code: m[1] }),
      credentials: 'omit', cache: 'no-store',
    });
    const data = await r.json().catch(() => ({ title: r.statusText }));
    if (!r.ok) throw new Problem(data, r.status);
    token.set(data.token);
  } catch (e) {
    loginProblem = e instanceof Problem ? e : new Problem({ title: 'Login link failed', detail: String(e) }, 0);
  }
}

window.addEventListener('hashchange', route);
exchangeLoginCode().then(route);
