// Processes: the live Relay processes — workers with their queues and
// slots, other clients, schedulers, dispatchers, servers — with host, pid,
// version, start and last heartbeat. Refreshes every 10 s.
import { api } from './api.js';
import { h, time, ago, duration, table } from './dom.js';

export async function render(view, ctx) {
  const body = h('div', {});
  view.replaceChildren(h('h1', {}, 'Processes'), body);
  const load = async () => {
    const res = await api('GET', 'v1/processes');
    if (ctx.stale()) return;
    body.replaceChildren(...content(res.items),
      h('p', { class: 'muted small' }, `Updated ${new Date().toLocaleTimeString()}; refreshes every 10 s.`));
  };
  await load();
  const timer = setInterval(() => load().catch((e) => { if (e.status === 401) ctx.reload(); }), 10000);
  return () => clearInterval(timer);
}

function content(items) {
  const rows = items.map((p) => [
    h('td', { 'data-process-role': p.role }, h('span', { class: 'badge role-' + p.role }, p.role)),
    h('td', {}, p.name || (p.namespace ? `namespace ${p.namespace}` : '—')),
    h('td', {}, p.host, ':', String(p.pid)),
    h('td', { class: 'queues' }, p.queues.length
      ? p.queues.map((q, i) => [i ? ', ' : '', h('a', { href: `#/jobs?queue=${encodeURIComponent(q.name)}` }, q.name), ` (${q.slots})`])
      : p.declares.length ? h('span', { class: 'muted', title: p.declares.join('\n') }, `declares ${p.declares.length}`) : '—'),
    h('td', { class: 'small' }, p.version || '—'),
    time(p.started_at),
    h('td', {}, h('time', { datetime: p.last_seen_at, title: `${p.last_seen_at}; expires ${p.expires_at} without another heartbeat` }, ago(p.last_seen_at)),
      h('span', { class: 'small muted' }, ` / ${duration(p.liveness_timeout_seconds)}`)),
  ]);
  const workers = items.filter((p) => p.role === 'worker');
  const slots = workers.reduce((n, p) => n + p.queues.reduce((m, q) => m + q.slots, 0), 0);
  return [
    h('p', {}, `${items.length} live ${items.length === 1 ? 'process' : 'processes'}: ${workers.length} ${workers.length === 1 ? 'worker' : 'workers'} with ${slots} slots in all.`),
    table('Live processes', ['Role', 'Name', 'Host:pid', 'Queues (slots)', 'Version', 'Started', 'Last seen / timeout'], rows,
      'No live process: no client, scheduler or dispatcher has started against this database (or their entries expired).'),
    h('p', { class: 'muted small' }, 'Each process heartbeats every quarter of its liveness timeout; a stopped one is gone at once, a killed one once its timeout has passed since its last heartbeat.'),
  ];
}
