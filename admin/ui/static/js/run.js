// A workflow run: its fields, input and output, its step timeline as a
// Gantt chart (one row per step, each attempt of its function a segment
// of its own, failed ones red; sleeps, signal waits and child waits drawn
// as hatched gaps; compensation steps marked),
// its child runs nested and linked, the signals it set aside (their
// payload did not decode), and cancel / retry / signal. While the
// run is unfinished the page refreshes itself, so a retried or signalled
// run is seen to finish.
import { api } from './api.js';
import { h, s, badge, time, json, duration, table, problemBox } from './dom.js';
import { action } from './app.js';
import { runHref } from './workflows.js';

const FINAL = ['completed', 'failed', 'compensated', 'cancelled', 'terminated'];
const WAITS = ['sleep', 'signal', 'child'];

export async function render(view, ctx) {
  let id = ctx.id;
  try { id = decodeURIComponent(ctx.id); } catch { /* shown as given */ }
  const note = h('div', { 'aria-live': 'polite' });
  const body = h('div', {});
  let timer = null;
  let last = '';
  const load = async () => {
    const r = await api('GET', 'v1/workflows/runs/' + encodeURIComponent(id));
    if (ctx.stale()) return;
    const sig = JSON.stringify(r);
    if (sig !== last) { // keep open steps and typed signals when nothing changed
      last = sig;
      body.replaceChildren(...content(r, ctx, note, load));
    }
    clearTimeout(timer);
    if (!FINAL.includes(r.state)) timer = setTimeout(() => load().catch((e) => { if (e.status === 401) ctx.reload(); }), 1500);
  };
  view.replaceChildren(
    h('p', { class: 'small' }, h('a', { href: '#/workflows' }, '« Workflow runs')),
    h('h1', {}, 'Run ', h('code', {}, id)), note, body);
  await load();
  return () => clearTimeout(timer);
}

function content(r, ctx, note, reload) {
  const fields = [
    ['State', h('span', { id: 'run-state', 'data-run-state': r.state }, badge(r.state),
      r.cancel_requested && !FINAL.includes(r.state) ? ' (cancel requested)' : '')],
    ['Workflow', h('a', { href: '#/workflows?workflow=' + encodeURIComponent(r.workflow) }, r.workflow)],
    ['Queue', r.queue],
    r.parent_id ? ['Parent run', h('a', { href: runHref(r.parent_id), id: 'run-parent' }, r.parent_id)] : null,
    ['Created', time(r.created_at)],
    ['Started', time(r.started_at)],
    ['Finished', r.finished_at ? [time(r.finished_at), r.duration_ms != null ? ` (took ${duration(r.duration_ms / 1000)})` : ''] : null],
    ['Executions', String(r.executions) + (r.generation ? `, generation ${r.generation}` : '')],
    r.job_id ? ['Job', h('a', { href: `#/jobs/${r.job_id}` }, String(r.job_id))] : null,
    r.trace_id ? ['Trace', r.trace_url && /^https?:\/\//.test(r.trace_url)
      ? h('a', { href: r.trace_url, rel: 'noopener noreferrer', target: '_blank' }, h('code', {}, r.trace_id)) : h('code', {}, r.trace_id)] : null,
  ].filter((f) => f && f[1] !== null);
  const out = [h('dl', { class: 'fields' }, fields.map(([k, v]) => [h('dt', {}, k), h('dd', {}, v)]))];
  if (ctx.canWrite) out.push(...actions(r, note, reload));
  if (r.error) out.push(h('h2', {}, ['failed', 'compensated'].includes(r.state) ? 'Why it failed' : r.state === 'terminated' ? 'Why it was terminated' : 'Error'), h('pre', { class: 'mono', id: 'run-error' }, r.error));
  out.push(
    h('h2', {}, `Step timeline (${r.steps.length})`),
    r.steps.length ? timeline(r) : h('p', { class: 'muted' }, 'No step recorded yet.'),
    h('h2', {}, `Child runs (${r.children.length})`),
    table('Child runs', ['Run', 'Workflow', 'State', 'On parent close', 'Created', 'Finished'], r.children.map((c) => [
      h('a', { href: runHref(c.id), 'data-child-run': c.id }, c.id), c.workflow, badge(c.state),
      h('span', { 'data-parent-close': c.parent_close || '' }, c.parent_close || ''), time(c.created_at), time(c.finished_at)]),
    'No child runs.'),
    ...setAside(r),
    ...updates(r),
    h('div', { class: 'cols' },
      h('section', {}, h('h2', {}, 'Input'), json(r.input)),
      h('section', {}, h('h2', {}, 'Output'), r.output !== undefined ? json(r.output) : h('p', { class: 'muted' }, 'None (set once completed).'))));
  return out;
}

// setAside lists the signals the run set aside (their payload did not
// decode into the type its WaitSignal asks for), when there are any.
function setAside(r) {
  const sigs = r.set_aside_signals || [];
  if (!sigs.length) return [];
  return [
    h('h2', {}, `Set-aside signals (${sigs.length})`),
    h('p', { class: 'muted' }, 'Their payload did not decode into the type the run waits for: the run did not receive them and waited on.'),
    table('Set-aside signals', ['Signal', 'Sent', 'Set aside', 'Why', 'Payload'], sigs.map((sg) => [
      h('span', { 'data-set-aside-signal': sg.name }, sg.name), time(sg.sent_at), time(sg.set_aside_at),
      h('pre', { class: 'mono' }, sg.decode_error),
      sg.payload !== undefined ? json(sg.payload) : h('span', { class: 'muted' }, `${sg.payload_bytes} bytes (not shown)`)]))];
}

// updates lists the run's update requests (workflow.Update), newest
// first, when there are any: pending until the run answers.
function updates(r) {
  const ups = r.updates || [];
  if (!ups.length) return [];
  return [
    h('h2', {}, `Updates (${ups.length})`),
    table('Updates', ['Update', 'State', 'Sent', 'Handled', 'Error'], ups.map((u) => [
      h('span', { 'data-update': u.name, 'data-update-state': u.state }, u.name), badge(u.state), time(u.sent_at), time(u.handled_at),
      u.error ? h('pre', { class: 'mono' }, u.error) : '']))];
}

const ms = (iso) => new Date(iso).getTime();
// real is an instant that can be on the time axis: a zero time
// (0001-01-01, a value stored without its time) or no time is not, else
// the axis would start two thousand years ago.
const real = (t) => Number.isFinite(t) && t > 0;

// spans places each step on the run's time axis. The workflow package
// writes a successful step's row when it completes, so a step's bar starts
// where the previous step ended (or at its first failed attempt, if
// earlier); a wait starts when it was recorded. A step with an attempt log
// (the latest 20 attempts, timed by the worker that ran them) starts at its
// first logged attempt. An unfinished step runs to now.
function spans(r) {
  const now = Date.now();
  let prevEnd = ms(r.started_at || r.created_at);
  return r.steps.map((st) => {
    const log = WAITS.includes(st.kind) ? [] : (st.attempt_log || []).filter((a) => real(ms(a.started_at)) && real(ms(a.finished_at)));
    const started = real(ms(st.started_at)) ? ms(st.started_at) : prevEnd;
    const start = log.length ? Math.min(started, ms(log[0].started_at))
      : WAITS.includes(st.kind) ? started : Math.min(prevEnd, started);
    const end = Math.max(st.finished_at ? ms(st.finished_at) : Math.max(now, start), ...log.map((a) => ms(a.finished_at)));
    prevEnd = Math.max(prevEnd, end);
    return { st, log, start, end, open: !st.finished_at };
  });
}

// attemptText is one logged attempt, for its segment's title and the
// step's detail.
function attemptText(a) {
  const took = duration(Math.max(0, ms(a.finished_at) - ms(a.started_at)) / 1000);
  return `attempt ${a.attempt}: ${a.error ? 'failed' : 'succeeded'} after ${took}${a.error ? ': ' + a.error : ''}`;
}

// timeline draws the Gantt chart: one row per step, a <details> whose
// summary holds the step's name, its bar and its duration, and whose body
// its attempts, error and output.
function timeline(r) {
  const rows = spans(r);
  const t0 = Math.min(ms(r.created_at), ...rows.map((x) => x.start).filter(real));
  const t1 = Math.max(r.finished_at ? ms(r.finished_at) : Date.now(), ...rows.map((x) => x.end).filter(real), t0 + 1);
  const W = 1000, H = 18;
  const x = (t) => ((t - t0) / (t1 - t0)) * W;
  const kids = new Map(r.children.map((c) => [c.id, c]));
  const list = h('ol', { class: 'gantt', id: 'timeline', 'aria-label': `Step timeline over ${duration((t1 - t0) / 1000)}` });
  for (const { st, log, start, end, open } of rows) {
    const wait = WAITS.includes(st.kind);
    const cls = ['bar', wait ? 'wait' : 'work', `st-${st.state}`, st.compensation ? 'comp' : '', log.length ? 'track' : ''].join(' ');
    const bx = x(start), bw = Math.max(2, x(end) - bx);
    const took = (end - start) / 1000;
    const failures = log.filter((a) => a.error).length;
    const label = `${st.key}: ${st.kind} ${st.state}, ${st.attempts} attempt${st.attempts === 1 ? '' : 's'}` +
      (failures ? ` (${failures} of the ${log.length} logged failed)` : '') + `, ${open ? 'so far ' : ''}${duration(took)}`;
    const svg = s('svg', { class: 'gbar', viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: 'none', role: 'img', 'aria-label': label },
      s('title', {}, label),
      s('rect', { class: cls, x: bx.toFixed(1), y: log.length ? 7 : 2, width: bw.toFixed(1), height: log.length ? 4 : H - 4 }));
    // Each logged attempt is a segment of its own, at its own times, over
    // the step's bar (left as a thin track: the retry delays between
    // attempts). Steps recorded before the log existed keep their ticks,
    // which split the bar evenly by the attempt count.
    for (const a of log) {
      const ax = x(ms(a.started_at)), aw = Math.max(5, x(ms(a.finished_at)) - ax);
      svg.append(s('rect', {
        class: `attempt ${a.error ? 'att-failed' : 'att-ok'}${st.compensation ? ' comp' : ''}`, 'data-attempt': a.attempt,
        x: ax.toFixed(1), y: 2, width: aw.toFixed(1), height: H - 4,
      }, s('title', {}, attemptText(a))));
    }
    for (let i = 1; !wait && !log.length && i < st.attempts; i++) {
      const tx = (bx + (bw * i) / st.attempts).toFixed(1);
      svg.append(s('line', { class: 'tick', x1: tx, y1: 0, x2: tx, y2: H }));
    }
    const child = st.child_id ? kids.get(st.child_id) : null;
    const summary = h('summary', {},
      h('span', { class: 'gname' },
        st.compensation ? h('span', { class: 'badge comp', title: 'compensation: undoes an earlier step' }, 'comp') : null,
        h('code', {}, st.key), ' ', h('span', { class: 'muted small' }, st.kind)),
      svg,
      h('span', { class: 'gdur small' }, badge(st.state), ' ', open ? '…' : duration(took)));
    const detail = h('div', {},
      h('p', { class: 'small' }, `${st.attempts} attempt${st.attempts === 1 ? '' : 's'}; recorded `, time(st.started_at),
        st.finished_at ? [', finished ', time(st.finished_at)] : '',
        st.wake_at ? [', wakes ', time(st.wake_at)] : ''),
      log.length ? h('ol', { class: 'attempts small', start: log[0].attempt, 'aria-label': 'Attempts' },
        log.map((a) => h('li', { class: a.error ? 'att-failed' : 'att-ok', 'data-attempt': a.attempt }, time(a.started_at), ' — ', attemptText(a)))) : null,
      log.length && log[0].attempt > 1 ? h('p', { class: 'small muted' }, `The latest ${log.length} attempts are logged.`) : null,
      st.heartbeat ? [h('p', { class: 'small', 'data-heartbeat-attempt': st.heartbeat.attempt }, `Latest heartbeat: attempt ${st.heartbeat.attempt}, `, time(st.heartbeat.at),
        st.heartbeat.details === undefined ? ` (details: ${st.heartbeat.details_bytes} bytes, too large to show)` : ''),
        st.heartbeat.details !== undefined ? json(st.heartbeat.details) : null] : null,
      st.error ? h('pre', { class: 'mono err-pre' }, st.error) : null,
      st.output !== undefined ? [h('p', { class: 'small muted' }, `Output (${st.output_bytes} bytes)`), json(st.output)]
        : st.output_bytes ? h('p', { class: 'small muted' }, `Output: ${st.output_bytes} bytes (too large to show)`) : null);
    const li = h('li', { 'data-step-key': st.key, 'data-step-state': st.state, 'data-step-kind': st.kind, class: st.compensation ? 'comp' : null },
      h('details', { class: 'wstep' }, summary, detail));
    if (st.child_id) {
      li.append(h('div', { class: 'nested' }, '↳ child run ',
        h('a', { href: runHref(st.child_id), 'data-child-run': st.child_id }, st.child_id), ' ',
        child ? [badge(child.state), ' ', h('span', { class: 'muted small' }, child.workflow)] : null));
    }
    list.append(li);
  }
  return h('div', {},
    h('p', { class: 'legend' }, 'One bar per step, on the run\'s time axis (', time(new Date(t0).toISOString()), ' to ',
      time(new Date(t1).toISOString()), '):', h('span', { class: 'sw work' }), 'step', h('span', { class: 'sw wait' }),
      'sleep / signal / child wait (a gap: nothing runs)', h('span', { class: 'sw failed' }), 'failed',
      h('span', { class: 'sw comp' }), 'compensation. Each attempt of a step is a segment at its own times (',
      h('span', { class: 'sw att-failed' }), 'failed attempt; the thin track between is the retry delay). Open a step for its attempts, error and output.'),
    list);
}

// actions are the run's buttons: cancel while unfinished, retry when
// failed, a signal form and a terminate form (its reason required) while
// unfinished. A refused one shows the problem.
function actions(r, note, reload) {
  const id = encodeURIComponent(r.id);
  const out = [];
  const buttons = [];
  if (!FINAL.includes(r.state)) {
    const b = h('button', { type: 'button', class: 'danger', id: 'run-cancel' }, 'Cancel run');
    b.addEventListener('click', () => {
      if (!confirm(`Cancel run ${r.id}? Its compensations run.`)) return;
      action(b, note, 'Cancel requested: the run stops at its next step and compensates.', () => api('POST', `v1/workflows/runs/${id}/cancel`), reload);
    });
    buttons.push(b);
  }
  if (r.state === 'failed') {
    const failed = r.steps.find((st) => st.state === 'failed');
    const b = h('button', { type: 'button', id: 'run-retry' }, failed ? `Retry from step ${failed.key}` : 'Retry');
    b.addEventListener('click', () => action(b, note, 'Retried: a new execution is queued.', () => api('POST', `v1/workflows/runs/${id}/retry`), reload));
    buttons.push(b);
  }
  if (buttons.length) out.push(h('div', { class: 'actions', role: 'group', 'aria-label': 'Run actions' }, buttons));
  const failedChild = r.state === 'failed' && r.steps.find((st) => st.state === 'failed' && st.kind === 'child' && st.child_id);
  if (failedChild) {
    out.push(h('p', { class: 'notice confirm small' }, 'This run failed because its child run ',
      h('a', { href: runHref(failedChild.child_id) }, failedChild.child_id),
      ' did: retry the child first (if it failed), then this run, which waits for it again.'));
  }
  if (!FINAL.includes(r.state)) {
    const waiting = r.steps.find((st) => st.kind === 'signal' && st.state === 'waiting');
    const name = h('input', { id: 'signal-name', required: true, autocomplete: 'off',
      value: waiting ? waiting.key.replace(/^signal:/, '').replace(/#\d+$/, '') : '' });
    const payload = h('textarea', { id: 'signal-payload', rows: 3, spellcheck: 'false' });
    payload.value = 'null';
    const send = h('button', { type: 'submit', id: 'signal-send' }, 'Send signal');
    const form = h('form', { class: 'filters', id: 'signal-form', 'aria-label': 'Send a signal' },
      h('div', {}, h('label', { for: 'signal-name' }, 'Signal name'), name),
      h('div', { class: 'grow' }, h('label', { for: 'signal-payload' }, 'Payload (JSON)'), payload),
      h('div', {}, send));
    form.addEventListener('submit', (ev) => {
      ev.preventDefault();
      let value;
      try { value = JSON.parse(payload.value || 'null'); } catch (e) {
        note.replaceChildren(problemBox({ problem: { title: 'Not JSON', detail: `The payload is not JSON: ${e.message}` } }));
        payload.focus();
        return;
      }
      action(send, note, `Signal ${name.value} sent.`,
        () => api('POST', `v1/workflows/runs/${id}/signal`, { name: name.value.trim(), payload: value }), reload);
    });
    out.push(form);
    // Terminate: the hammer, no compensation; the reason is stored as the
    // run's error and in the audit log.
    const reason = h('input', { id: 'terminate-reason', required: true, maxlength: 1024, autocomplete: 'off' });
    const term = h('button', { type: 'submit', class: 'danger', id: 'run-terminate' }, 'Terminate run');
    const tform = h('form', { class: 'filters', id: 'terminate-form', 'aria-label': 'Terminate the run' },
      h('div', { class: 'grow' }, h('label', { for: 'terminate-reason' }, 'Reason to terminate (ends the run now; its compensations do not run)'), reason),
      h('div', {}, term));
    tform.addEventListener('submit', (ev) => {
      ev.preventDefault();
      if (!reason.value.trim()) { reason.focus(); return; }
      action(term, note, 'Terminated: the run ended now, without compensating.',
        () => api('POST', `v1/workflows/runs/${id}/terminate`, { reason: reason.value.trim() }), reload);
    });
    out.push(tform);
  }
  return out;
}
