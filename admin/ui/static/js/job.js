// A job: its fields, args, metadata, every attempt (collapsed), its trace,
// and the actions its state allows. While the job is queued or running the
// page refreshes itself, so a requeued job is seen to succeed.
import { api } from './api.js';
import { h, badge, time, json, duration } from './dom.js';
import { action } from './app.js';

const FINAL = ['succeeded', 'dead', 'cancelled'];

export async function render(view, ctx) {
  const note = h('div', { 'aria-live': 'polite' });
  const body = h('div', {});
  let timer = null;
  let last = '';
  const load = async () => {
    const j = await api('GET', `v1/jobs/${ctx.id}`);
    if (ctx.stale()) return;
    const sig = JSON.stringify(j);
    if (sig !== last) { // keep open attempts open when nothing changed
      last = sig;
      body.replaceChildren(...content(j, ctx, note, load));
    }
    clearTimeout(timer);
    // Follow a job until it finishes: closely while it runs or is due,
    // loosely while it waits for a later run_at.
    const later = j.state === 'queued' && new Date(j.run_at) - Date.now() > 5000;
    if (!FINAL.includes(j.state)) timer = setTimeout(() => load().catch((e) => { if (e.status === 401) ctx.reload(); }), later ? 10000 : 1500);
  };
  view.replaceChildren(
    h('p', { class: 'small' }, h('a', { href: '#/jobs' }, '« Jobs')),
    h('h1', {}, `Job ${ctx.id}`), note, body);
  await load();
  return () => clearTimeout(timer);
}

function content(j, ctx, note, reload) {
  const fields = [
    ['State', h('span', { id: 'job-state', 'data-job-state': j.state }, badge(j.state))],
    ['Kind', h('code', {}, j.kind)],
    ['Queue', h('a', { href: `#/jobs?queue=${encodeURIComponent(j.queue)}` }, j.queue)],
    ['Attempts', `${j.attempt} of ${j.max_attempts}`],
    ['Priority', String(j.priority)],
    ['Created', time(j.created_at)],
    ['Runs at', time(j.run_at)],
    ['Last attempt', j.attempted_at ? [time(j.attempted_at), j.attempted_by ? ` by ${j.attempted_by}` : ''] : null],
    ['Finished', j.finalized_at ? time(j.finalized_at) : null],
    ['Ordering key', j.ordering_key ? h('a', { href: `#/jobs?ordering_key=${encodeURIComponent(j.ordering_key)}` }, j.ordering_key) : null],
    ['Trace', j.trace_id ? traceLink(j) : null],
  ].filter(([, v]) => v !== null);

  const out = [
    h('dl', { class: 'fields' }, fields.map(([k, v]) => [h('dt', {}, k), h('dd', {}, v)])),
  ];
  if (ctx.canWrite) out.push(actions(j, note, reload));
  if (j.last_error && j.state === 'dead') {
    out.push(h('h2', {}, 'Why it died'), h('pre', { class: 'mono', id: 'last-error' }, j.last_error));
  }
  out.push(
    h('h2', {}, `Attempts (${j.attempts.length})`),
    j.attempts.length ? h('div', { id: 'attempts' }, j.attempts.map(attempt)) : h('p', { class: 'muted' }, 'Not started yet.'),
    h('div', { class: 'cols' },
      h('section', {}, h('h2', {}, 'Args'), json(j.args)),
      h('section', {}, h('h2', {}, 'Metadata'), json(j.metadata))));
  return out;
}

// traceLink links the trace id to the tracing UI when the server has one
// (admin Config.TraceURL, relay serve --trace-url).
function traceLink(j) {
  const code = h('code', {}, j.trace_id);
  if (!j.trace_url || !/^https?:\/\//.test(j.trace_url)) return code;
  return h('a', { href: j.trace_url, rel: 'noopener noreferrer', target: '_blank', id: 'trace-link' },
    code, h('span', { class: 'sr-only' }, ' (opens the tracing UI)'));
}

// attempt is one attempt, collapsed: outcome, worker, start, duration in
// the summary; the error (with its stack) inside.
function attempt(a) {
  const secs = a.finished_at ? (new Date(a.finished_at) - new Date(a.started_at)) / 1000 : null;
  return h('details', { class: 'attempt', 'data-attempt': a.attempt },
    h('summary', {}, h('strong', {}, `Attempt ${a.attempt}`), ' ', badge(a.outcome, 'outcome'), ' on ',
      h('code', {}, a.worker || '?'), ', started ', time(a.started_at),
      secs !== null ? `, took ${duration(secs)}` : ''),
    h('div', {}, a.error ? h('pre', { class: 'mono' }, a.error) : h('p', { class: 'muted' }, 'No error recorded.')));
}

// actions are the buttons the job's state allows. A refused one shows the
// API's problem.
function actions(j, note, reload) {
  const future = j.state === 'queued' && new Date(j.run_at) > Date.now();
  const list = [
    FINAL.includes(j.state) && j.state !== 'succeeded' && ['requeue', 'Requeue', 'Requeued: runnable now.'],
    ['queued', 'claimed'].includes(j.state) && ['cancel', 'Cancel', 'Cancelled.'],
    future && ['retry-now', 'Retry now', 'Runnable now.'],
    FINAL.includes(j.state) && ['delete', 'Delete', 'Deleted.'],
  ].filter(Boolean);
  return h('div', { class: 'actions', role: 'group', 'aria-label': 'Job actions' }, list.map(([act, label, done]) => {
    const b = h('button', { type: 'button', id: `job-${act}`, class: act === 'requeue' || act === 'retry-now' ? '' : 'danger' }, label);
    b.addEventListener('click', () => {
      if ((act === 'delete' || act === 'cancel') && !confirm(`${label} job ${j.id}?`)) return;
      action(b, note, done,
        () => api(act === 'delete' ? 'DELETE' : 'POST', act === 'delete' ? `v1/jobs/${j.id}` : `v1/jobs/${j.id}/${act}`),
        act === 'delete' ? () => { location.hash = '#/jobs'; } : reload);
    });
    return b;
  }));
}

