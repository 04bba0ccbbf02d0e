// Workflow runs: a list by workflow, state and creation time, with keyset
// paging (the API's opaque cursor).
import { api, query } from './api.js';
import { h, table, badge, time, duration } from './dom.js';
import { tagList, tagText } from './tags.js';

export const STATES = ['pending', 'running', 'compensating', 'completed', 'failed', 'compensated', 'cancelled', 'terminated'];
const FILTERS = ['workflow', 'state', 'created_after', 'created_before', 'tag'];

const withTags = (params) => {
  const { tag, ...rest } = params;
  const q = new URLSearchParams(query(rest).slice(1));
  for (const t of tagList(tag || '')) q.append('tag', t);
  const s = q.toString();
  return s ? '?' + s : '';
};

// runHref is the page of run id (a child's id holds a slash: escaped).
export const runHref = (id) => '#/workflows/run/' + encodeURIComponent(id);

export async function render(view, ctx) {
  const f = Object.fromEntries(FILTERS.map((k) => [k, ctx.params.get(k) || '']));
  const cursor = ctx.params.get('cursor') || '';
  const limit = Math.min(500, Math.max(1, parseInt(ctx.params.get('limit'), 10) || 50));
  const keep = limit === 50 ? f : { ...f, limit };
  const page = await api('GET', 'v1/workflows/runs' + withTags({ ...f, cursor, limit }));
  if (ctx.stale()) return;

  const rows = page.items.map((r) => [
    h('a', { href: runHref(r.id), 'data-run-id': r.id }, r.id),
    h('a', { href: '#/workflows' + query({ workflow: r.workflow }) }, r.workflow),
    badge(r.state),
    time(r.created_at),
    time(r.finished_at),
    r.duration_ms != null ? duration(r.duration_ms / 1000) : '—',
    r.parent_id ? h('a', { href: runHref(r.parent_id) }, r.parent_id) : '',
    h('span', { class: 'tags' }, (r.tags || []).map((t) => h('a', { class: 'tag', href: '#/workflows' + query({ tag: tagText(t) }) }, t))),
    h('td', { class: ['failed', 'compensated', 'terminated'].includes(r.state) ? 'err' : 'err muted' }, r.error ? r.error.split('\n')[0].slice(0, 160) : ''),
  ]);
  const pager = h('div', { class: 'pager' },
    cursor ? h('a', { class: 'button secondary', id: 'first-page', href: '#/workflows' + query(keep) }, '« First page') : null,
    page.next_cursor ? h('a', { class: 'button secondary', id: 'next-page', href: '#/workflows' + query({ ...keep, cursor: page.next_cursor }) }, 'Next page »') : null,
    h('span', { class: 'muted small' }, `${page.items.length} run${page.items.length === 1 ? '' : 's'} on this page`));
  view.replaceChildren(
    h('h1', {}, 'Workflow runs'),
    filterForm(f, ctx),
    table('Workflow runs', ['Run', 'Workflow', 'State', 'Created', 'Finished', 'Took#', 'Parent', 'Tags', 'Error'], rows,
      'No run matches this filter.'),
    pager);
}

const pad = (n) => String(n).padStart(2, '0');
function toLocal(iso) {
  if (!iso) return '';
  const d = new Date(iso);
  return isNaN(d) ? '' : `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}`;
}
const fromLocal = (v) => (v ? new Date(v).toISOString() : '');

function filterForm(f, ctx) {
  const field = (id, label, input) => h('div', {}, h('label', { for: id }, label), input);
  const wf = h('input', { id: 'wf-workflow', type: 'search', autocomplete: 'off', value: f.workflow });
  const state = h('select', { id: 'wf-state' }, h('option', { value: '' }, 'any'),
    STATES.map((s) => h('option', { value: s, selected: f.state === s }, s)));
  const ca = h('input', { id: 'wf-created_after', type: 'datetime-local', value: toLocal(f.created_after) });
  const cb = h('input', { id: 'wf-created_before', type: 'datetime-local', value: toLocal(f.created_before) });
  const tag = h('input', { id: 'wf-tag', type: 'search', autocomplete: 'off', value: f.tag, placeholder: 'tenant:acme, order:123',
    title: 'Runs carrying every tag (comma-separated; a tag holding a comma in double quotes)' });
  const form = h('form', { class: 'filters', role: 'search', 'aria-label': 'Filter workflow runs' },
    field('wf-workflow', 'Workflow', wf),
    field('wf-state', 'State', state),
    field('wf-created_after', 'Created from', ca),
    field('wf-created_before', 'Created before', cb),
    field('wf-tag', 'Tags', tag),
    h('div', {}, h('button', { type: 'submit', id: 'apply-filter' }, 'Apply')),
    h('div', {}, h('a', { href: '#/workflows', class: 'button secondary' }, 'Clear')));
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    ctx.go('/workflows', { workflow: wf.value.trim(), state: state.value,
      created_after: fromLocal(ca.value), created_before: fromLocal(cb.value), tag: tag.value.trim() });
  });
  return form;
}
