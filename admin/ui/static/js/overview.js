// Overview: every queue's backlog, running jobs, oldest wait, and its
// finishes per minute over the last 15 minutes; paused queues marked; a
// warning for each queue with runnable jobs and no live process serving it;
// the dead jobs to look at.
import { api } from './api.js';
import { h, s, table, duration, time } from './dom.js';
import { action } from './app.js';

const WINDOW = 15;

export async function render(view, ctx) {
  const note = h('div', { 'aria-live': 'polite' });
  const body = h('div', {});
  view.replaceChildren(h('h1', {}, 'Overview'), note, body);
  const load = async () => {
    const [queues, blocked, runs] = await Promise.all([
      api('GET', `v1/queues?window_minutes=${WINDOW}`),
      api('GET', 'v1/outbox/blocked-keys?limit=100'),
      api('GET', 'v1/workflows/stats'),
    ]);
    if (ctx.stale()) return;
    body.replaceChildren(...content(queues.items, blocked.items, runs, ctx, note, load),
      h('p', { class: 'muted small' }, ['Updated ', time(new Date().toISOString()), '; refreshes every 10 s.']));
  };
  await load();
  // Refresh; a token that expired meanwhile sends the tab back to sign-in.
  const timer = setInterval(() => load().catch((e) => { if (e.status === 401) ctx.reload(); }), 10000);
  return () => clearInterval(timer);
}

function content(queues, blocked, runs, ctx, note, reload) {
  const sum = (f) => queues.reduce((n, q) => n + f(q), 0);
  const dead = sum((q) => q.dead);
  const paused = queues.filter((q) => q.paused).length;
  // A queue whose runnable jobs no live process serves waits for ever; a
  // paused queue's jobs wait by choice and count in neither.
  const unserved = queues.filter((q) => q.runnable > 0 && !q.paused && q.processes === 0);
  const cards = h('div', { class: 'cards' },
    card('Dead jobs', dead, '#/jobs?state=dead', dead > 0, 'card-dead'),
    card('Runnable', sum((q) => (q.paused ? 0 : q.runnable)), '#/jobs?state=queued', false, 'card-runnable'),
    card('Running', sum((q) => q.running), '#/jobs?state=claimed'),
    card(`Succeeded (${WINDOW} min)`, sum((q) => q.succeeded),
      '#/jobs?state=succeeded&finalized_after=' + encodeURIComponent(new Date(Date.now() - WINDOW * 60000).toISOString())),
    card(`Failed (${WINDOW} min)`, sum((q) => q.failed),
      '#/jobs?state=dead&finalized_after=' + encodeURIComponent(new Date(Date.now() - WINDOW * 60000).toISOString()), sum((q) => q.failed) > 0),
    card('Blocked ordering keys', blocked.length, '#/outbox', blocked.length > 0),
    card('Failed workflow runs', runs.failed >= runs.cap ? `${runs.cap}+` : runs.failed, '#/workflows?state=failed', runs.failed > 0, 'card-failed-runs'),
    runs.running > 0 ? card('Running workflow runs', runs.running >= runs.cap ? `${runs.cap}+` : runs.running, '#/workflows?state=running') : null,
    paused ? card('Paused queues', paused, null, true) : null);

  const rows = queues.map((q) => {
    const cells = [
      h('td', {}, h('a', { href: `#/jobs?queue=${encodeURIComponent(q.name)}` }, q.name), ' ',
        q.paused ? h('span', { class: 'badge paused', title: `paused by ${q.paused_by || '?'} at ${q.paused_at}` }, 'paused') : null,
        unserved.includes(q) ? h('span', { class: 'badge unserved', title: 'no live process serves this queue' }, 'no process') : null),
      q.runnable, q.scheduled, q.running,
      q.oldest_runnable_age_seconds > 0 ? duration(q.oldest_runnable_age_seconds) : '—',
      h('td', {}, chart(q)),
      h('td', { class: 'num' }, q.dead > 0 ? h('a', { href: `#/jobs?state=dead&queue=${encodeURIComponent(q.name)}` }, String(q.dead)) : '0'),
    ];
    if (ctx.canWrite) {
      const b = h('button', { type: 'button', class: 'secondary', 'data-queue-action': q.paused ? 'resume' : 'pause', 'data-queue': q.name },
        q.paused ? 'Resume' : 'Pause');
      b.addEventListener('click', () => action(b, note,
        `Queue ${q.name} ${q.paused ? 'resumed' : 'paused'}.`,
        () => api('POST', `v1/queues/${encodeURIComponent(q.name)}/${q.paused ? 'resume' : 'pause'}`), reload));
      cells.push(h('td', {}, b));
    }
    return cells;
  });
  const head = ['Queue', 'Runnable#', 'Scheduled#', 'Running#', 'Oldest runnable#', `Finished per minute, last ${WINDOW} min`, 'Dead#'];
  if (ctx.canWrite) head.push('Actions');
  const warnings = unserved.map((q) => h('div', { class: 'notice problem', role: 'alert', 'data-unserved-queue': q.name },
    `No live process serves queue ${q.name}: ${q.runnable} runnable ${q.runnable === 1 ? 'job waits' : 'jobs wait'}. `,
    h('a', { href: '#/processes' }, 'Live processes')));
  return [
    cards,
    ...warnings,
    h('h2', {}, 'Queues'),
    h('p', { class: 'legend' }, 'Chart: one column per minute, oldest left;', h('span', { class: 'sw s' }), 'succeeded (above the line)',
      h('span', { class: 'sw f' }), 'failed (dead; below the line, on a scale of its own so that a few failures show).'),
    // On a phone the queue, its runnable, running and dead counts and its
    // action stay; scheduled, the oldest wait and the chart go.
    table('Queues', head, rows, 'No queue has jobs, recent finishes or a pause.', { narrow: [2, 4, 5] }),
  ];
}

function card(label, n, href, alert, id) {
  const num = h('span', { class: 'n' }, String(n));
  return h('div', { class: 'card' + (alert ? ' alert' : ''), id },
    href ? h('a', { href }, num, label) : [num, label]);
}

// chart is an inline SVG of finishes per minute, one column per minute of
// the window (minutes without finishes are absent from the API's list and
// drawn empty): succeeded bars in the upper panel, failed ones in a lower
// panel on an axis of their own, so that 2 failures beside 100 successes
// are a bar an operator sees, not a sliver stacked on a tall one. Any
// minute with a failure is at least 3 px tall there; each panel's peak is
// in the label.
function chart(q) {
  const W = 150, HS = 26, GAP = 3, HF = 13, H = HS + GAP + HF, n = q.window_minutes || WINDOW;
  const bw = W / n;
  const now = Math.floor(Date.now() / 60000);
  const per = new Array(n).fill(null).map(() => ({ s: 0, f: 0 }));
  for (const m of q.minutes) {
    const i = n - 1 - (now - Math.floor(new Date(m.minute).getTime() / 60000));
    if (i >= 0 && i < n) { per[i].s += m.succeeded; per[i].f += m.failed; }
  }
  const maxS = Math.max(1, ...per.map((p) => p.s));
  const maxF = Math.max(1, ...per.map((p) => p.f));
  const label = `${q.name}: ${q.succeeded} succeeded, ${q.failed} failed in the last ${n} minutes ` +
    `(peaks ${maxS} succeeded and ${maxF} failed per minute, each on its own scale)`;
  const svg = s('svg', { class: 'spark', width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': label,
    'data-queue-chart': q.name }, s('title', {}, label));
  per.forEach((p, i) => {
    const x = (i * bw + 0.5).toFixed(1), w = Math.max(1, bw - 1.5).toFixed(1);
    const hs = (p.s / maxS) * (HS - 1);
    if (p.s > 0) svg.append(s('rect', { class: 's', x, y: (HS - hs).toFixed(1), width: w, height: Math.max(1, hs).toFixed(1) }));
    if (p.f > 0) {
      const hf = Math.max(3, (p.f / maxF) * HF);
      svg.append(s('rect', { class: 'f', x, y: (HS + GAP).toFixed(1), width: w, height: hf.toFixed(1), 'data-failed': p.f },
        s('title', {}, `${p.f} failed in this minute`)));
    }
  });
  svg.append(s('line', { class: 'base', x1: 0, y1: HS + 0.5, x2: W, y2: HS + 0.5 }));
  const rate = (n, v) => (n > 0 ? `${n} (${v >= 10 ? v.toFixed(0) : Number(v.toPrecision(2))}/s)` : '0');
  return h('div', {}, svg, h('span', { class: 'small muted' },
    `${rate(q.succeeded, q.succeeded_per_second)} ok · ${rate(q.failed, q.failed_per_second)} failed`));
}

