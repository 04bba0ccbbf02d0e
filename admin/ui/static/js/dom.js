// DOM helpers. Text goes in through textContent only: nothing from the API
// is ever parsed as HTML.

// h builds an element: h('a', {href: '#/'}, 'text', child, …). Attributes
// starting with "on" are event listeners; false/null/undefined are skipped.
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === false || v === null || v === undefined) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    else el.setAttribute(k, v === true ? '' : v);
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

const SVG = 'http://www.w3.org/2000/svg';

// s builds an SVG element.
export function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  for (const c of children) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}

// badge is a state or outcome pill.
export function badge(value, prefix = 'state') {
  return h('span', { class: `badge ${prefix}-${value}`, 'data-state': value }, value);
}

// viewerZone is the browser's time zone (an IANA name), in which every
// time is shown unless a page names another.
export const viewerZone = Intl.DateTimeFormat().resolvedOptions().timeZone || 'UTC';

const formatters = new Map();

// inZone formats an instant as "2026-12-03 03:00:00" in zone, with the
// zone's short name at that instant ("UTC", "CET", "GMT+5:30").
export function inZone(d, zone) {
  let f = formatters.get(zone);
  if (!f) {
    f = new Intl.DateTimeFormat('en-US', { timeZone: zone, year: 'numeric', month: '2-digit', day: '2-digit',
      hour: '2-digit', minute: '2-digit', second: '2-digit', hourCycle: 'h23', timeZoneName: 'short' });
    formatters.set(zone, f);
  }
  const p = Object.fromEntries(f.formatToParts(d).map((x) => [x.type, x.value]));
  return { text: `${p.year}-${p.month}-${p.day} ${p.hour}:${p.minute}:${p.second}`, zone: p.timeZoneName };
}

// time shows an instant in the browser's time zone, labelled with it
// ("2026-12-01 23:12:11 UTC"), with the exact value, the zone's name and
// the relative age in the title of a <time> element.
export function time(iso) {
  if (!iso) return h('span', { class: 'muted' }, '—');
  const d = new Date(iso);
  if (isNaN(d)) return h('span', { class: 'muted' }, String(iso));
  const v = inZone(d, viewerZone);
  return h('time', { datetime: iso, title: `${iso} (${ago(iso)}; shown in ${viewerZone}, your browser's time zone)` },
    v.text, ' ', h('span', { class: 'tz' }, v.zone));
}

// zonedTime shows an instant in a named zone (a schedule's) and, when the
// browser's differs, in the browser's too: "2026-12-03 03:00:00
// Europe/Paris · 07:30:00 GMT+5:30 your time".
export function zonedTime(iso, zone) {
  const d = new Date(iso);
  if (!zone || isNaN(d)) return time(iso);
  let own;
  try { own = inZone(d, zone); } catch { return time(iso); } // a zone this browser does not know
  const mine = inZone(d, viewerZone);
  const same = own.text === mine.text;
  return h('span', { class: 'zoned' },
    h('time', { datetime: iso, title: `${iso} (${ago(iso)})`, 'data-zone': zone }, own.text, ' ', h('span', { class: 'tz' }, zone)),
    same ? null : h('span', { class: 'muted small', 'data-viewer-time': '' }, ' · ',
      mine.text.slice(0, 10) === own.text.slice(0, 10) ? mine.text.slice(11) : mine.text, ' ',
      h('span', { class: 'tz' }, mine.zone), ' your time'));
}

// ago is "3 min ago" / "in 2 h".
export function ago(iso) {
  const secs = (Date.now() - new Date(iso).getTime()) / 1000;
  const d = duration(Math.abs(secs));
  return secs >= 0 ? `${d} ago` : `in ${d}`;
}

// duration formats seconds: "850 ms", "12 s", "4 min 3 s", "2 h 5 min".
export function duration(secs) {
  if (secs < 1) return `${Math.round(secs * 1000)} ms`;
  if (secs < 60) return `${secs < 10 ? secs.toFixed(1) : Math.round(secs)} s`;
  if (secs < 3600) return `${Math.floor(secs / 60)} min ${Math.round(secs % 60)} s`;
  if (secs < 86400) return `${Math.floor(secs / 3600)} h ${Math.round((secs % 3600) / 60)} min`;
  return `${Math.floor(secs / 86400)} d ${Math.round((secs % 86400) / 3600)} h`;
}

// json pretty-prints a JSON value in a <pre>.
export function json(v) {
  let text;
  try { text = JSON.stringify(v, null, 2); } catch { text = String(v); }
  return h('pre', { class: 'mono' }, text === undefined ? 'null' : text);
}

// problemBox shows a refused or failed call: its title, status, detail and
// field errors, as the API sent them.
export function problemBox(err, what) {
  const p = err.problem || { title: 'Error', detail: String(err.message || err) };
  const errs = Array.isArray(p.errors) ? p.errors : [];
  return h('div', { class: 'notice problem', role: 'alert', 'data-problem-status': p.status || err.status || '' },
    h('h2', {}, `${what ? what + ': ' : ''}${p.title || 'Error'}${p.status ? ` (${p.status})` : ''}`),
    p.detail ? h('p', { class: 'problem-detail' }, p.detail) : null,
    errs.length ? h('ul', {}, errs.map((e) => h('li', {}, `${e.location ? e.location + ': ' : ''}${e.message}`))) : null);
}

// okBox is a success notice.
export function okBox(text) {
  return h('div', { class: 'notice ok', role: 'status' }, text);
}

// table builds a table in a scrolling wrapper; head is a list of column
// names (a name ending in "#" is numeric), rows a list of cell lists.
// opts.narrow lists the columns (by index) a narrow screen (a phone) hides,
// so that the others fit its width.
export function table(caption, head, rows, empty, opts) {
  if (!rows.length) return h('p', { class: 'muted' }, empty || 'Nothing here.');
  const narrow = new Set((opts && opts.narrow) || []);
  const cls = (i, base) => [base, narrow.has(i) ? 'hide-small' : null].filter(Boolean).join(' ') || null;
  const cell = (c, i) => {
    if (!(c instanceof Node && c.tagName === 'TD')) return h('td', { class: cls(i, head[i].endsWith('#') ? 'num' : null) }, c);
    if (narrow.has(i)) c.classList.add('hide-small');
    return c;
  };
  return h('div', { class: 'table-wrap' },
    h('table', {},
      caption ? h('caption', { class: 'sr-only' }, caption) : null,
      h('thead', {}, h('tr', {}, head.map((c, i) => h('th', { scope: 'col', class: cls(i, c.endsWith('#') ? 'num' : null) }, c.replace(/#$/, ''))))),
      h('tbody', {}, rows.map((r) => h('tr', {}, r.map(cell))))));
}
