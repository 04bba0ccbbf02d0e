// Schedules: spec, time zone, the next five fires, the last fires with
// their outcome, and pause / resume / trigger now / backfill a past fire.
import { api } from './api.js';
import { h, badge, time, zonedTime, viewerZone, json, table } from './dom.js';
import { action } from './app.js';

export async function render(view, ctx) {
  const note = h('div', { 'aria-live': 'polite' });
  const body = h('div', {});
  view.replaceChildren(h('h1', {}, 'Schedules'), note, body);
  const load = async () => {
    const res = await api('GET', 'v1/schedules?next=5&last=10');
    if (ctx.stale()) return;
    body.replaceChildren(...(res.items.length ? res.items.map((s) => schedule(s, ctx, note, load))
      : [h('p', { class: 'muted' }, 'No schedules: they are declared in code (scheduler package) and stored when a scheduler starts.')]));
  };
  await load();
}

function schedule(s, ctx, note, reload) {
  const id = 'sched-' + s.name.replace(/[^A-Za-z0-9_-]/g, '_');
  const status = s.disabled_at ? h('span', { class: 'badge paused', title: `not declared by the latest process since ${s.disabled_at}` }, 'disabled')
    : s.paused ? h('span', { class: 'badge paused' }, 'paused') : h('span', { class: 'badge state-succeeded' }, 'active');
  const buttons = [];
  if (ctx.canWrite) {
    const mk = (act, label, done) => {
      const b = h('button', { type: 'button', class: act === 'trigger' ? '' : 'secondary', 'data-schedule-action': act }, label);
      b.addEventListener('click', () => action(b, note, done,
        () => api('POST', `v1/schedules/${encodeURIComponent(s.name)}/${act}`), reload));
      return b;
    };
    buttons.push(s.paused ? mk('resume', 'Resume', `Schedule ${s.name} resumed.`) : mk('pause', 'Pause', `Schedule ${s.name} paused.`));
    buttons.push(mk('trigger', 'Trigger now', (r) => [`Schedule ${s.name} triggered: `, h('a', { href: `#/jobs/${r.job_id}` }, `job ${r.job_id}`), '.']));
    // Backfill: fire a past fire time once (the fire's key holds).
    const at = h('input', { type: 'text', id: id + '-backfill-at', autocomplete: 'off', size: 26,
      placeholder: '2026-10-31T02:00:00-04:00', 'aria-label': `Past fire time of ${s.name} to backfill (RFC 3339)` });
    const bf = h('button', { type: 'button', class: 'secondary', 'data-schedule-action': 'backfill' }, 'Backfill');
    bf.addEventListener('click', () => action(bf, note,
      (r) => [r.existing ? `That fire of ${s.name} had already enqueued ` : `Schedule ${s.name} backfilled for ${r.fire_time}: `,
        r.job_id ? h('a', { href: `#/jobs/${r.job_id}` }, `job ${r.job_id}`) : 'its job', '.'],
      () => api('POST', `v1/schedules/${encodeURIComponent(s.name)}/backfill`, { fire_time: at.value.trim() }), reload));
    buttons.push(h('span', { class: 'backfill' }, at, ' ', bf));
  }
  const fires = s.last_fires.map((f) => [zonedTime(f.fire_time, s.time_zone), badge(f.outcome, 'outcome'),
    f.job_id ? h('a', { href: `#/jobs/${f.job_id}` }, String(f.job_id)) : '—', time(f.recorded_at)]);
  return h('section', { class: 'schedule', id, 'aria-labelledby': id + '-h' },
    h('h2', { id: id + '-h' }, s.name, ' ', status),
    h('dl', { class: 'fields' },
      h('dt', {}, 'Spec'), h('dd', {}, h('code', {}, s.spec)),
      h('dt', {}, 'Time zone'), h('dd', { 'data-schedule-zone': s.time_zone }, s.time_zone,
        s.time_zone !== viewerZone ? h('span', { class: 'muted small' }, ` (fire times are shown in it, then in yours: ${viewerZone})`) : null),
      h('dt', {}, 'Job'), h('dd', {}, h('code', {}, s.kind), ' on queue ', h('a', { href: `#/jobs?queue=${encodeURIComponent(s.queue)}` }, s.queue)),
      h('dt', {}, 'Catch-up / overlap'), h('dd', {}, `${s.catch_up} / ${s.overlap}`),
      h('dt', {}, 'Args'), h('dd', {}, json(s.args))),
    buttons.length ? h('div', { class: 'actions' }, buttons) : null,
    h('div', { class: 'cols' },
      h('section', {}, h('h3', {}, 'Next fires'),
        s.next_fires.length ? h('ol', { class: 'next-fires' }, s.next_fires.map((t) => h('li', {}, zonedTime(t, s.time_zone)))) : h('p', { class: 'muted' }, '—')),
      h('section', {}, h('h3', {}, 'Last fires'),
        table(`Last fires of ${s.name}`, ['Fire time', 'Outcome', 'Job', 'Recorded'], fires, 'No fire yet.'))));
}
