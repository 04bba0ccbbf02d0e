// Outbox: events by state (pending / dispatched), and the ordering keys
// blocked by a dead head job, linked.
import { api, query } from './api.js';
import { h, badge, time, json, table } from './dom.js';
import { action } from './app.js';

// flash is an action's outcome, shown once by the re-rendered page.
let flash = null;

export async function render(view, ctx) {
  const state = ctx.params.get('state') || '';
  const cursor = ctx.params.get('cursor') || '';
  const [blocked, events] = await Promise.all([
    api('GET', 'v1/outbox/blocked-keys?limit=100'),
    api('GET', 'v1/outbox/events' + query({ state, cursor, limit: 50 })),
  ]);
  if (ctx.stale()) return;
  const note = h('div', { 'aria-live': 'polite' }, flash);
  flash = null;

  // A key the outbox made is shown as the events' key and the subscriber
  // whose jobs it orders, not in its stored form (kind|endpoint|key).
  const keys = blocked.items.map((k) => [k.queue,
    h('td', { 'data-blocked-key': k.key },
      h('code', {}, k.event_key || k.key),
      k.event_key ? h('div', { class: 'muted small' }, 'events of this key, for ', h('code', {}, k.subscriber)) : null),
    String(k.waiting),
    h('a', { href: `#/jobs/${k.head.id}`, 'data-blocked-head': k.head.id }, `job ${k.head.id}`), k.head.kind || '',
    h('td', { class: 'err' }, (k.head.last_error || '').split('\n')[0])]);

  const tabs = h('nav', { 'aria-label': 'Event state', class: 'actions' }, [['', 'All'], ['pending', 'Pending'], ['dispatched', 'Dispatched'], ['failed', 'Failed']]
    .map(([v, label]) => h('a', { href: '#/outbox' + query({ state: v }), class: 'button' + (v === state ? '' : ' secondary'),
      'aria-current': v === state ? 'page' : null }, label)));

  const rows = events.items.map((e) => {
    const cells = [String(e.id), h('code', {}, e.topic), e.key ? h('code', {}, e.key) : '—', badge(e.state),
      time(e.published_at), time(e.dispatched_at), String(e.jobs), delivery(e),
      h('td', {}, h('details', {}, h('summary', {}, 'payload'), json(e.payload)))];
    if (ctx.canWrite) {
      let b = null;
      if (e.state === 'dispatched' || e.state === 'failed') {
        b = h('button', { type: 'button', class: 'secondary', 'data-redispatch': e.id }, 'Redispatch');
        b.addEventListener('click', () => action(b, note, `Event ${e.id} is pending again.`,
          () => api('POST', `v1/outbox/events/${e.id}/redispatch`), () => { flash = note.firstChild; ctx.go('/outbox', { state }); }));
      }
      cells.push(h('td', {}, b));
    }
    return cells;
  });
  const head = ['ID#', 'Topic', 'Key', 'State', 'Published', 'Dispatched', 'Jobs#', 'Delivery', 'Payload'];
  if (ctx.canWrite) head.push('Actions');

  view.replaceChildren(
    h('h1', {}, 'Outbox'), note,
    h('h2', {}, 'Blocked ordering keys'),
    h('p', { class: 'muted small' }, 'A dead job at the head of an ordering key holds back every later job of the key: requeue or cancel it.'),
    table('Blocked ordering keys', ['Queue', 'Key', 'Waiting#', 'Dead head', 'Kind', 'Error'], keys, 'No key is blocked.'),
    h('h2', {}, 'Events'), tabs,
    table('Outbox events', head, rows, 'No events.'),
    h('div', { class: 'pager' },
      cursor ? h('a', { class: 'button secondary', href: '#/outbox' + query({ state }) }, '« First page') : null,
      events.next_cursor ? h('a', { class: 'button secondary', href: '#/outbox' + query({ state, cursor: events.next_cursor }) }, 'Next page »') : null));
}

// delivery is what went wrong with an event's dispatch: set aside with no
// jobs (failed: a stored value did not decode; fix the row and
// redispatch), or dispatched without the part that did not decode.
function delivery(e) {
  if (!e.dispatch_error) return h('td', { class: 'muted' }, e.state === 'pending' ? 'waiting for the dispatcher' : 'ok');
  return h('td', { class: 'err', 'data-delivery-error': e.id },
    e.state === 'failed' ? 'not delivered, set aside: ' : 'delivered without it: ', e.dispatch_error,
    e.failed_at ? [' (', time(e.failed_at), ')'] : null);
}
