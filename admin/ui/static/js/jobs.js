// Jobs: a filterable list with keyset paging (the API's opaque cursor),
// and bulk actions on the filter with a dry-run count first.
import { api, query } from './api.js';
import { tagList, tagText } from './tags.js';
import { h, table, badge, time, problemBox, okBox, viewerZone } from './dom.js';

const STATES = ['queued', 'claimed', 'succeeded', 'dead', 'cancelled'];
const FILTERS = ['state', 'queue', 'kind', 'ordering_key', 'created_after', 'created_before', 'finalized_after', 'finalized_before'];
const BULK = { requeue: ['dead', 'cancelled'], cancel: ['queued', 'claimed'], delete: ['succeeded', 'dead', 'cancelled'] };

// flash is a bulk action's outcome, shown once by the re-rendered list.
let flash = null;


export async function render(view, ctx) {
  const f = Object.fromEntries(FILTERS.map((k) => [k, ctx.params.get(k) || '']));
  f.tag = ctx.params.getAll('tag').filter(Boolean);
  const cursor = ctx.params.get('cursor') || '';
  const limit = Math.min(500, Math.max(1, parseInt(ctx.params.get('limit'), 10) || 50));
  const keep = limit === 50 ? f : { ...f, limit }; // the filter and page size, kept across pages
  const page = await api('GET', 'v1/jobs' + query({ ...f, cursor, limit }));
  if (ctx.stale()) return;

  const note = h('div', { 'aria-live': 'polite' }, flash);
  flash = null;
  const rows = page.items.map((j) => [
    h('a', { href: `#/jobs/${j.id}`, 'data-job-id': j.id }, String(j.id)),
    h('td', {}, j.kind, (j.tags || []).length ? h('div', { class: 'tags' }, j.tags.map((t) =>
      h('a', { class: 'tag', href: '#/jobs' + query({ tag: t }), 'data-tag': t }, t))) : null),
    j.queue, badge(j.state), `${j.attempt}/${j.max_attempts}`,
    time(j.created_at), time(j.finalized_at || (j.state === 'queued' ? j.run_at : j.attempted_at)),
    h('td', { class: j.state === 'dead' ? 'err' : 'err muted' }, j.last_error ? firstLine(j.last_error) : ''),
  ]);
  const pager = h('div', { class: 'pager' },
    cursor ? h('a', { class: 'button secondary', id: 'first-page', href: '#/jobs' + query(keep) }, '« First page') : null,
    page.next_cursor ? h('a', { class: 'button secondary', id: 'next-page', href: '#/jobs' + query({ ...keep, cursor: page.next_cursor }) }, 'Next page »') : null,
    h('span', { class: 'muted small', id: 'page-count' }, `${page.items.length} job${page.items.length === 1 ? '' : 's'} on this page`,
      page.next_cursor && page.items.length < limit
        ? ' (a filtered page examines at most 10,000 jobs; the next page searches on)' : ''));

  view.replaceChildren(...[
    h('h1', {}, 'Jobs'),
    filterForm(f, ctx),
    note,
    ctx.canWrite ? bulkForm(f, note, ctx) : null,
    table('Jobs', ['ID', 'Kind', 'Queue', 'State', 'Attempts', 'Created', 'Ran / finished / due', 'Last error'], rows,
      'No job matches this filter.'),
    pager].filter(Boolean));
}

function firstLine(s) {
  const line = s.split('\n')[0];
  return line.length > 160 ? line.slice(0, 160) + '…' : line;
}

function field(id, label, input) {
  return h('div', {}, h('label', { for: id }, label), input);
}

// toLocal turns an RFC 3339 instant into a datetime-local value, and
// fromLocal back.
const pad = (n) => String(n).padStart(2, '0');
function toLocal(iso) {
  if (!iso) return '';
  const d = new Date(iso);
  return isNaN(d) ? '' : `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}`;
}
const fromLocal = (v) => (v ? new Date(v).toISOString() : '');

function filterForm(f, ctx) {
  const state = h('select', { id: 'f-state', name: 'state' }, h('option', { value: '' }, 'any'),
    STATES.map((s) => h('option', { value: s, selected: f.state === s }, s)));
  const text = (k) => h('input', { id: `f-${k}`, name: k, value: f[k], type: 'search', autocomplete: 'off' });
  const when = (k) => h('input', { id: `f-${k}`, type: 'datetime-local', value: toLocal(f[k]) });
  const ca = when('created_after'), cb = when('created_before'), fa = when('finalized_after'), fb = when('finalized_before');
  const form = h('form', { class: 'filters', role: 'search', 'aria-label': 'Filter jobs' },
    field('f-state', 'State', state),
    field('f-queue', 'Queue', text('queue')),
    field('f-kind', 'Kind', text('kind')),
    field('f-ordering_key', 'Ordering key', text('ordering_key')),
    field('f-tag', 'Tags (all of)', h('input', { id: 'f-tag', name: 'tag', value: f.tag.map(tagText).join(', '), type: 'search',
      autocomplete: 'off', placeholder: 'tenant:acme, vip' })),
    field('f-created_after', 'Created from', ca),
    field('f-created_before', 'Created before', cb),
    field('f-finalized_after', 'Finished from', fa),
    field('f-finalized_before', 'Finished before', fb),
    h('p', { class: 'muted small', id: 'filter-zone' }, `Times are in your browser's time zone, ${viewerZone}.`),
    h('div', {}, h('button', { type: 'submit', id: 'apply-filter' }, 'Apply')),
    h('div', {}, h('a', { href: '#/jobs', class: 'button secondary' }, 'Clear')));
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const v = (k) => form.querySelector(`#f-${k}`).value.trim();
    ctx.go('/jobs', { state: v('state'), queue: v('queue'), kind: v('kind'), ordering_key: v('ordering_key'), tag: tagList(v('tag')),
      created_after: fromLocal(ca.value), created_before: fromLocal(cb.value),
      finalized_after: fromLocal(fa.value), finalized_before: fromLocal(fb.value) });
  });
  return form;
}

// bulkForm acts on every job of the filter: a dry run counts them, and the
// confirmation changes at most that many.
function bulkForm(f, note, ctx) {
  const filter = {};
  for (const k of FILTERS) if (f[k]) filter[k] = f[k];
  if (f.tag.length) filter.tags = f.tag;
  const sel = h('select', { id: 'bulk-action' },
    Object.keys(BULK).map((a) => h('option', { value: a, selected: (a === 'requeue' && ['dead', 'cancelled'].includes(f.state)) }, a)));
  const count = h('button', { type: 'submit', class: 'secondary', id: 'bulk-count' }, 'Count matching jobs (dry run)');
  const form = h('form', { class: 'filters', 'aria-label': 'Bulk action on the filter' },
    field('bulk-action', 'Bulk action on this filter', sel),
    h('div', {}, count),
    h('p', { class: 'muted small' }, `Applies to ${Object.keys(filter).length ? 'the filter above' : 'every job'} in the states the action allows: `,
      Object.entries(BULK).map(([a, st]) => `${a}: ${st.join('/')}`).join('; '), '.'));
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const act = sel.value;
    count.disabled = true;
    note.replaceChildren();
    try {
      const dry = await api('POST', 'v1/jobs/bulk', { action: act, filter, dry_run: true });
      if (dry.matched === 0) {
        note.replaceChildren(okBox(`No job matches: nothing to ${act}.`));
        return;
      }
      const yes = h('button', { type: 'button', class: act === 'requeue' ? '' : 'danger', id: 'bulk-confirm' },
        `${act[0].toUpperCase() + act.slice(1)} ${dry.matched} job${dry.matched === 1 ? '' : 's'}`);
      const no = h('button', { type: 'button', class: 'secondary' }, 'Cancel');
      const box = h('div', { class: 'notice confirm', role: 'alertdialog', 'aria-labelledby': 'bulk-q' },
        h('p', { id: 'bulk-q', 'data-matched': dry.matched }, `Dry run: ${dry.matched} job${dry.matched === 1 ? '' : 's'} would be ${act === 'cancel' ? 'cancelled' : act + 'd'}. Go ahead?`),
        h('div', { class: 'actions' }, yes, no));
      no.addEventListener('click', () => { note.replaceChildren(); count.focus(); });
      yes.addEventListener('click', async () => {
        yes.disabled = true;
        try {
          const r = await api('POST', 'v1/jobs/bulk', { action: act, filter, max: dry.matched });
          flash = okBox(`${act}: ${r.changed} changed, ${r.skipped} skipped (moved on meanwhile), in ${r.batches} batch${r.batches === 1 ? '' : 'es'}.` +
            (r.done === false ? ' The time budget ran out before the end: count and run it again to continue.' : ''));
          ctx.go('/jobs', f);
        } catch (e) {
          note.replaceChildren(problemBox(e, 'Refused'));
        }
      });
      note.replaceChildren(box);
      yes.focus();
    } catch (e) {
      note.replaceChildren(problemBox(e, 'Refused'));
    } finally {
      count.disabled = false;
    }
  });
  return form;
}
