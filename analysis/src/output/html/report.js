// mtrace's HTML report: draws the data the analyzer embedded (see mod.rs
// beside this file). No network access, no libraries. The page's own
// self-check ends in #status (data-ok="1"), which the tests read; a
// script error lands in #errors.
'use strict';

const errors = [];
window.addEventListener('error', (e) => {
  errors.push(String(e.message));
  const box = document.getElementById('errors');
  if (box) box.textContent = errors.join('\n');
});

const D = JSON.parse(document.getElementById('data').textContent);
const R = D.report;
const NEVER = 4294967295;
const COSTS = [
  { key: 0, label: 'Not freed at the end', unit: 'bytes' },
  { key: 1, label: 'Bytes allocated', unit: 'bytes' },
  { key: 2, label: 'Allocation calls', unit: 'calls' },
  { key: 3, label: 'At the peak', unit: 'bytes' },
];

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'class') e.className = v;
    else if (k === 'text') e.textContent = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const k of kids) if (k != null) e.append(k);
  return e;
}
const svg = (tag, attrs) => {
  const e = document.createElementNS('http://www.w3.org/2000/svg', tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  return e;
};
const num = (n) => Number(n).toLocaleString('en-US');
function bytes(n) {
  const units = ['bytes', 'KiB', 'MiB', 'GiB', 'TiB'];
  let v = Number(n), i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return i === 0 ? num(v) + ' bytes' : v.toFixed(1) + ' ' + units[i];
}
const secs = (ns) => (ns / 1e9).toFixed(3) + ' s';
// An argument as a shell would need it (as the text report's command:
// line): empty or with special characters, in single quotes.
const shellWord = (a) => (/^[A-Za-z0-9_@%+=:,.\/-]+$/.test(a) ? a : `'${a.replace(/'/g, "'\\''")}'`);
// "1 block", "2 blocks", as the text report says them.
const plural = (n, one, many) => `${num(n)} ${Number(n) === 1 ? one : many}`;
// Time-axis labels: a step of 1, 2 or 5 times a power of ten, in the unit
// the run's length reads best in, with the decimals the step needs (a
// 2 ms run reads "0 ms 0.5 ms 1 ms …", not "0.000 s 0.000 s 0.001 s").
function timeTicks(endNs) {
  const [unit, div] = endNs >= 1e9 ? ['s', 1e9] : endNs >= 1e6 ? ['ms', 1e6] : ['µs', 1e3];
  const end = endNs / div;
  const raw = end / 5;
  const p = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map((m) => m * p).find((v) => v >= raw);
  const decimals = Math.max(0, -Math.floor(Math.log10(step) + 1e-9));
  const out = [];
  for (let v = 0; v <= end + step * 1e-9; v += step) out.push([v * div, `${v.toFixed(decimals)} ${unit}`]);
  return out;
}
const amount = (v, unit) => (unit === 'bytes' ? bytes(v) : num(v) + ' ' + unit);
const frameName = (i) => D.names[D.frames[i][0]];
const frameLoc = (i) => D.locs[D.frames[i][1]];

function frameLines(frames) {
  return frames.map((f, j) => {
    const at = j === 0 ? 'at' : 'by';
    const fn = f.function || '???';
    const loc = f.file ? `${f.file}${f.line ? ':' + f.line : ''}` : `${f.module}+${f.offset}`;
    return `${at} ${f.address}: ${fn} (${loc})${f.inlined ? ' (inlined)' : ''}`;
  }).join('\n');
}

// ---- summary ----
function summary(app) {
  const s = R.summary;
  // As the text report: the name the user ran where it is not the executable's.
  const base = p => p.split('/').pop();
  const arg0 = R.cmdline[0] || '';
  const title = arg0 && base(arg0) !== base(R.program)
    ? `${arg0} (${R.program}, pid ${R.pid})` : `${R.program} (pid ${R.pid})`;
  app.append(el('h1', { text: `mtrace report for ${title}` }));
  const rows = [
    ['command', R.cmdline.map(shellWord).join(' ')],
    ['trace', R.trace],
    ['duration', secs(s.duration_ns)],
    ['allocation calls', `${num(s.allocations)} (${bytes(s.bytes_allocated)} in total)`],
    ['frees', num(s.frees) + (s.realloc_frees ? ` (and ${plural(s.realloc_frees, 'block', 'blocks')} replaced by realloc)` : '')],
    ['peak', `${bytes(s.peak_bytes)} in ${plural(s.peak_blocks, 'block', 'blocks')} at ${secs(s.peak_time_ns)}`],
    ['not freed', `${bytes(s.leaked_bytes)} in ${plural(s.leaked_blocks, 'block', 'blocks')}` +
      (s.leaked_stderr ? ` (± ${bytes(s.leaked_stderr[0])}, ± ${plural(s.leaked_stderr[1], 'block', 'blocks')}: one standard error)` : '')],
    ['ended by', s.ended_by ? s.ended_by + (s.exit_status != null ? `, status ${s.exit_status}` : s.exec ? ` of ${s.exec}` : '')
      : 'no end record (the process was killed?)'],
  ];
  if (s.sample_rate) rows.splice(3, 0, ['sampled', `one allocation per ${bytes(s.sample_rate)} allocated, on average: every byte and block count is an estimate`]);
  if (R.kinds) {
    for (const k of ['definite', 'indirect', 'possible', 'reachable']) {
      const t = R.kinds[k];
      const name = { definite: 'definitely lost', indirect: 'indirectly lost', possible: 'possibly lost', reachable: 'still reachable' }[k];
      rows.push([name, `${bytes(t.bytes)} in ${plural(t.blocks, 'block', 'blocks')}`]);
    }
    const m = R.kinds.mappings;
    if (m && m.blocks) rows.push(['not classified', `${bytes(m.bytes)} in ${plural(m.blocks, 'mapping', 'mappings')} the program made (mmap; roots of the scan)`]);
    const a = R.kinds.allocator_mappings;
    if (a && a.blocks) rows.push(['not classified', `${bytes(a.bytes)} in ${plural(a.blocks, 'mapping', 'mappings')} the allocator made for its own use (not roots of the scan)`]);
  }
  for (const a of R.allocators.filter((x) => x.seen)) rows.push(['allocator', `${a.name === 'malloc' ? "the program's own malloc" : a.name} in ${a.module} (${a.how})`]);
  for (const n of R.notices) rows.push(['warning', n]);
  if (s.bad_frees + s.mismatched_frees > 0) rows.push(['wrong frees', `${num(s.bad_frees)} double or invalid, ${num(s.mismatched_frees)} mismatched`]);
  if (s.unmatched_frees > 0) rows.push(['frees of blocks from before tracing', num(s.unmatched_frees)]);
  if (s.error) rows.push(['warning', s.error]);
  const t = el('table', { class: 'summary', id: 'summary' });
  for (const [k, v] of rows) t.append(el('tr', {}, el('td', { text: k }), el('td', { text: v })));
  app.append(t);
}

// ---- flamegraph ----
// A tree of frames by name, outermost at the root, from per-stack values.
function tree(values) {
  const root = { name: 'all', loc: '', v: 0, kids: new Map(), parent: null };
  D.stacks.forEach((st, i) => {
    const v = values[i];
    if (!(v > 0)) return;
    root.v += v;
    let n = root;
    for (const f of st.f) {
      const name = frameName(f);
      let k = n.kids.get(name);
      if (!k) { k = { name, loc: frameLoc(f), v: 0, kids: new Map(), parent: n }; n.kids.set(name, k); }
      k.v += v;
      n = k;
    }
  });
  return root;
}

function hue(name) {
  let h = 0;
  for (let i = 0; i < name.length; i++) h = (h * 31 + name.charCodeAt(i)) >>> 0;
  return h;
}

class Flame {
  constructor(box, unit) {
    this.box = box;
    this.unit = unit;
    this.icicle = false;
    this.query = '';
    this.root = null;
    this.top = null;
    this.drawn = 0;
  }
  set(values, unit) {
    this.unit = unit;
    this.root = tree(values);
    this.top = this.root;
    this.draw();
  }
  zoom(n) { this.top = n; this.draw(); }
  draw() {
    const box = this.box, ROW = 18, MIN = 0.0005;
    box.textContent = '';
    this.drawn = 0;
    if (!this.root || this.root.v <= 0) {
      box.style.height = '';
      box.append(el('div', { class: 'empty', text: `Nothing to draw: 0 ${this.unit}.` }));
      return;
    }
    const total = this.root.v;
    const q = this.query.toLowerCase();
    let matched = 0;
    const rows = [];
    // The path to the zoomed frame, full width.
    const up = [];
    for (let n = this.top; n; n = n.parent) up.unshift(n);
    up.forEach((n, d) => rows.push([n, 0, 1, d, n !== this.top]));
    const walk = (n, x, w, d) => {
      let cx = x;
      const kids = [...n.kids.values()].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
      for (const k of kids) {
        const kw = (w * k.v) / n.v;
        if (kw >= MIN) { rows.push([k, cx, kw, d, false]); walk(k, cx, kw, d + 1); }
        cx += kw;
      }
    };
    walk(this.top, 0, 1, up.length);
    const depth = rows.reduce((m, r) => Math.max(m, r[3]), 0) + 1;
    box.style.height = depth * ROW + 2 + 'px';
    for (const [n, x, w, d, isUp] of rows) {
      const div = el('div', { class: 'n' + (isUp ? ' up' : '') });
      div.style.left = x * 100 + '%';
      div.style.width = w * 100 + '%';
      div.style[this.icicle ? 'top' : 'bottom'] = d * ROW + 'px';
      const h = hue(n.name);
      div.style.background = `hsl(${h % 40 + 10}, ${60 + (h >> 8) % 30}%, ${62 + (h >> 16) % 14}%)`;
      div.textContent = n.name;
      const pct = ((100 * n.v) / total).toFixed(2);
      div.title = `${n.name}${n.loc ? ' (' + n.loc + ')' : ''}\n${amount(n.v, this.unit)} (${pct}%)`;
      div.dataset.name = n.name;
      div.addEventListener('click', () => this.zoom(n));
      if (q && n.name.toLowerCase().includes(q)) {
        div.classList.add('match');
        if (!isUp) matched += n.v;
      }
      box.append(div);
      this.drawn++;
    }
    this.matched = matched;
  }
}

function flameSection(app, title, id) {
  const sec = el('section', { id });
  sec.append(el('h2', { text: title }));
  const bar = el('div', { class: 'toolbar' });
  const box = el('div', { class: 'fg' });
  const f = new Flame(box, 'bytes');
  const search = el('input', { type: 'search', placeholder: 'search a function', 'aria-label': 'search' });
  const found = el('span', { class: 'muted' });
  search.addEventListener('input', () => {
    f.query = search.value;
    f.draw();
    found.textContent = f.query ? `matched: ${((100 * f.matched) / Math.max(1, f.root.v)).toFixed(1)}%` : '';
  });
  const dir = el('button', { text: 'icicle', title: 'roots at the top' });
  dir.addEventListener('click', () => { f.icicle = !f.icicle; dir.classList.toggle('on', f.icicle); f.draw(); });
  const reset = el('button', { text: 'reset zoom' });
  reset.addEventListener('click', () => f.zoom(f.root));
  bar.append(search, found, dir, reset);
  sec.append(bar, box);
  app.append(sec);
  return { sec, bar, f };
}

function flames(app) {
  const { bar, f } = flameSection(app, 'Flamegraphs', 'flames');
  const tabs = COSTS.map((c) => {
    const b = el('button', { text: c.label, 'data-cost': String(c.key) });
    b.addEventListener('click', () => show(c));
    return b;
  });
  bar.prepend(...tabs);
  const show = (c) => {
    tabs.forEach((t) => t.classList.toggle('on', t.dataset.cost === String(c.key)));
    f.set(D.stacks.map((s) => s.v[c.key]), c.unit);
  };
  show(COSTS[0]);
  return { f, show, tabs };
}

// ---- memory over time, and the range picked on it ----
function chart(app, onRange) {
  const sec = el('section', { id: 'memory' });
  sec.append(el('h2', { text: 'Memory over time' }));
  const W = 1000, H = 260, L = 60, B = 22, T = 10;
  const end = Math.max(D.duration_ns, 1);
  // The samples stop before the last frees (at exit): the heap's last
  // point is what was not freed at the end, RSS held at its last sample.
  const pts = D.timeline.slice();
  const last = pts[pts.length - 1];
  if (last && last[0] < D.duration_ns && R.summary.since_marker == null) {
    pts.push([D.duration_ns, last[1], Math.max(0, R.summary.leaked_bytes)]);
  }
  const top = Math.max(1, ...pts.map((p) => Math.max(p[1], p[2])), R.summary.peak_bytes);
  const x = (t) => L + ((W - L - 8) * t) / end;
  const y = (b) => H - B - ((H - B - T) * b) / top;
  const s = svg('svg', { id: 'chart', viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: 'none' });
  for (let i = 0; i <= 4; i++) {
    const b = (top * i) / 4;
    s.append(svg('line', { x1: L, x2: W, y1: y(b), y2: y(b), stroke: '#e3e6ee' }));
    const t = svg('text', { x: 4, y: y(b) + 4 });
    t.textContent = bytes(b);
    s.append(t);
  }
  const ticks = timeTicks(end);
  ticks.forEach(([at, label], i) => {
    // The last label ends at its tick, so that it is not cut at the edge.
    const anchor = i === 0 ? 'start' : x(at) > W - 40 ? 'end' : 'middle';
    const t = svg('text', { x: x(at), y: H - 6, 'text-anchor': anchor });
    t.textContent = label;
    s.append(t);
  });
  const line = (k) => pts.map((p) => `${x(p[0]).toFixed(1)},${y(p[k]).toFixed(1)}`).join(' ');
  if (pts.length) {
    const area = `${x(pts[0][0])},${y(0)} ${line(2)} ${x(pts[pts.length - 1][0])},${y(0)}`;
    s.append(svg('polygon', { class: 'heap-area', points: area }));
    s.append(svg('polyline', { class: 'heap', points: line(2) }));
    s.append(svg('polyline', { class: 'rss', points: line(1) }));
  }
  for (const [t, name] of D.markers) {
    s.append(svg('line', { class: 'marker', x1: x(t), x2: x(t), y1: T, y2: H - B }));
    const l = svg('text', { x: x(t) + 3, y: T + 10 });
    l.textContent = name;
    s.append(l);
  }
  const peak = svg('circle', { cx: x(R.summary.peak_time_ns), cy: y(R.summary.peak_bytes), r: 4, fill: '#c0392b' });
  const pt = svg('title');
  pt.textContent = `peak: ${bytes(R.summary.peak_bytes)} at ${secs(R.summary.peak_time_ns)}`;
  peak.append(pt);
  s.append(peak);
  const sel = svg('rect', { class: 'sel', x: 0, y: T, width: 0, height: H - B - T, visibility: 'hidden' });
  s.append(sel);
  const tOf = (ev) => {
    const r = s.getBoundingClientRect();
    const px = ((ev.clientX - r.left) / r.width) * W;
    return Math.min(end, Math.max(0, ((px - L) / (W - L - 8)) * end));
  };
  let from = null;
  const mark = (a, b) => {
    sel.setAttribute('x', x(Math.min(a, b)));
    sel.setAttribute('width', Math.max(1, Math.abs(x(b) - x(a))));
    sel.setAttribute('visibility', 'visible');
  };
  s.addEventListener('pointerdown', (ev) => { from = tOf(ev); s.setPointerCapture(ev.pointerId); mark(from, from); });
  s.addEventListener('pointermove', (ev) => { if (from !== null) mark(from, tOf(ev)); });
  s.addEventListener('pointerup', (ev) => {
    if (from === null) return;
    const to = tOf(ev);
    const [a, b] = from < to ? [from, to] : [to, from];
    from = null;
    onRange(a, b);
  });
  const legend = el('div', { class: 'legend muted' });
  legend.innerHTML = '<span><i style="background:#2e86c1"></i>RSS</span><span><i style="background:#c0392b"></i>live heap (blocks and mappings)</span>' +
    '<span>drag across the chart: what was allocated in that time and is still live at its end (to the nearest ms, or coarser in long runs)</span>';
  sec.append(s, legend);
  app.append(sec);
  return { select: (a, b) => { mark(a, b); onRange(a, b); } };
}

// Bytes per stack allocated in [a, b] (ns) and still live at b.
function rangeValues(a, b) {
  const q = D.quantum_ns;
  const ba = Math.floor(a / q), bb = Math.floor(b / q);
  const v = new Float64Array(D.stacks.length);
  for (const [s, i, j, by] of D.life) {
    if (i >= ba && i <= bb && (j === NEVER || j > bb)) v[s] += by;
  }
  return v;
}

function rangeSection(app) {
  const { sec, f } = flameSection(app, 'Time range', 'range');
  sec.hidden = true;
  const head = el('p', { class: 'muted', id: 'range-what' });
  sec.querySelector('h2').after(head);
  const table = el('table', { id: 'range-table' });
  sec.append(table);
  return (a, b) => {
    sec.hidden = false;
    const v = rangeValues(a, b);
    let sum = 0;
    v.forEach((x) => { sum += x; });
    head.textContent = `Allocated between ${secs(a)} and ${secs(b)} and still live at ${secs(b)}: ${bytes(sum)}`;
    f.set(Array.from(v), 'bytes');
    const order = [...v.keys()].filter((i) => v[i] > 0).sort((x, y) => v[y] - v[x]).slice(0, 30);
    table.textContent = '';
    table.append(el('tr', {}, el('th', { class: 'num', text: 'bytes' }), el('th', { text: 'backtrace (innermost first)' })));
    for (const i of order) {
      const frames = [...D.stacks[i].f].reverse().map((fi) => `${frameName(fi)} (${frameLoc(fi)})`);
      const d = el('details', {}, el('summary', { text: frames[0] || '?' }), el('div', { class: 'frames', text: frames.join('\n') }));
      const fn = frameName(D.stacks[i].f[D.stacks[i].f.length - 1]);
      table.append(el('tr', { 'data-function': fn, 'data-bytes': String(v[i]) }, el('td', { class: 'num', text: bytes(v[i]) }), el('td', {}, d)));
    }
    sec.dataset.rows = String(order.length);
  };
}

// ---- tables ----
function leaks(app) {
  const sec = el('section', { id: 'leaks' });
  const scanned = !!R.kinds;
  const title = scanned ? 'Leaks, by backtrace' : 'Not freed, by backtrace';
  sec.append(el('h2', { text: `${title} (${num(D.leaks_total)})` }));
  if (D.leaks.length < D.leaks_total) sec.append(el('p', { class: 'muted', text: `The first ${num(D.leaks.length)} are shown; the JSON report has all.` }));
  if (!D.leaks_total) {
    // Said as the text report says it, rather than an empty table.
    const s = R.summary;
    const why = s.leaked_blocks === 0 ? 'No block was left: every block mtrace saw allocated was freed.'
      : scanned ? 'No leaks: every block not freed is still reachable, or a mapping the program made; the flamegraph "Not freed at the end" shows them (mtrace report --show-reachable lists them).'
      : 'Nothing to list.';
    sec.append(el('p', { class: 'muted', id: 'no-leaks', text: why }));
    app.append(sec);
    return;
  }
  const cols = [
    ['bytes', (e) => e.bytes, true],
    ['blocks', (e) => e.blocks, true],
    ['allocations', (e) => e.total_allocations, true],
    ['family', (e) => e.family, false],
  ];
  if (scanned) cols.push(['kind', (e) => e.kind || '', false]);
  const table = el('table', { id: 'leak-table' });
  let rows = D.leaks.slice();
  let sortBy = 0, desc = true;
  const head = el('tr');
  cols.forEach(([name, , n], i) => {
    const th = el('th', { class: 'sortable' + (n ? ' num' : ''), text: name });
    th.addEventListener('click', () => { desc = sortBy === i ? !desc : true; sortBy = i; render(); });
    head.append(th);
  });
  head.append(el('th', { text: 'where (innermost first)' }));
  const render = () => {
    const get = cols[sortBy][1];
    rows.sort((a, b) => { const x = get(a), y = get(b); return (x < y ? -1 : x > y ? 1 : 0) * (desc ? -1 : 1); });
    table.textContent = '';
    table.append(head);
    for (const e of rows) {
      // The program's own frame (report::own_code::headline), not the
      // first with a line: glibc's start had one where the program had none.
      const first = e.f[e.at] ?? e.f[0];
      const label = first == null ? '[no backtrace]' : `${frameName(first)} (${frameLoc(first).split('/').pop()})`;
      const tr = el('tr', { 'data-function': first == null ? '' : frameName(first), 'data-bytes': String(e.bytes) });
      for (const [name, get2, n] of cols) {
        const v = get2(e);
        const td = el('td', { class: n ? 'num' : name === 'kind' ? 'kind-' + v : '', text: name === 'bytes' ? bytes(v) : n ? num(v) : v });
        tr.append(td);
      }
      const lines = e.f.map((f, j) => `${j ? 'by' : 'at'} ${frameName(f)} (${frameLoc(f)})`).join('\n');
      tr.append(el('td', {}, el('details', {}, el('summary', { text: label }), el('div', { class: 'frames', text: lines }))));
      table.append(tr);
    }
  };
  render();
  sec.append(table);
  app.append(sec);
}

function wrongFrees(app) {
  if (!R.errors.length) return;
  const sec = el('section', { id: 'wrong-frees' });
  sec.append(el('h2', { text: `Wrong frees (${R.errors.length})` }));
  const t = el('table');
  t.append(el('tr', {}, el('th', { text: 'kind' }), el('th', { class: 'num', text: 'times' }), el('th', { text: 'where' })));
  for (const e of R.errors) {
    const parts = [];
    if (e.free_frames.length) parts.push('freed:\n' + frameLines(e.free_frames));
    if (e.block) parts.push(`address ${e.address} is ${e.block.offset} bytes inside a block of ${e.block.size} bytes (${e.block.family})${e.block.freed ? ', freed before' : ''}`);
    if (e.first_free_frames.length) parts.push('first freed:\n' + frameLines(e.first_free_frames));
    if (e.alloc_frames.length) parts.push('allocated:\n' + frameLines(e.alloc_frames));
    t.append(el('tr', {}, el('td', { text: `${e.kind.replace('_', ' ')} (${e.call})` }), el('td', { class: 'num', text: num(e.count) }),
      el('td', {}, el('div', { class: 'frames', text: parts.join('\n') }))));
  }
  sec.append(t);
  app.append(sec);
}

function sections(app) {
  const x = R.sections;
  if (!x) return;
  const entries = (id, title, list, what, withBytes = true) => {
    const sec = el('section', { id });
    sec.append(el('h2', { text: title }));
    if (!list.length) {
      sec.append(el('p', { class: 'muted', text: 'None.' }));
      app.append(sec);
      return;
    }
    const t = el('table');
    t.append(el('tr', {}, el('th', { class: 'num', text: what }), withBytes ? el('th', { class: 'num', text: 'bytes' }) : null, el('th', { text: 'where' })));
    for (const e of list) {
      const f = e.frames[e.at] || e.frames[0];
      t.append(el('tr', {}, el('td', { class: 'num', text: num(e.count) }), withBytes ? el('td', { class: 'num', text: bytes(e.bytes) }) : null,
        el('td', {}, el('details', {}, el('summary', { text: f ? f.function || '???' : '?' }), el('div', { class: 'frames', text: frameLines(e.frames) })))));
    }
    sec.append(t);
    app.append(sec);
  };
  entries('temporary', `Temporary allocations (freed before the thread allocated again): ${num(x.temporary_total)} of ${num(R.summary.allocations)}`, x.temporary, 'temporary', false);
  entries('most-calls', 'Most allocation calls', x.most_calls, 'calls');
  entries('peak-consumers', `Peak memory consumers (at ${secs(R.summary.peak_time_ns)})`, x.peak_consumers, 'blocks');
  const sec = el('section', { id: 'histogram' });
  sec.append(el('h2', { text: 'Allocation sizes' }));
  const t = el('table');
  const most = Math.max(1, ...x.histogram.map((b) => b.calls));
  t.append(el('tr', {}, el('th', { text: 'size' }), el('th', { class: 'num', text: 'calls' }), el('th', { class: 'num', text: 'bytes' }), el('th', { text: 'calls, against the most' })));
  for (const b of x.histogram) {
    const bar = el('span', { class: 'bar' });
    bar.style.width = (200 * b.calls) / most + 'px';
    t.append(el('tr', {}, el('td', { text: b.max_size == null ? 'larger' : '≤ ' + bytes(b.max_size) }), el('td', { class: 'num', text: num(b.calls) }),
      el('td', { class: 'num', text: bytes(b.bytes) }), el('td', {}, bar)));
  }
  sec.append(t);
  app.append(sec);
}

// ---- the page ----
// `#range=A,B`: select that range on load (seconds, or marker names).
function rangeFromHash() {
  const m = /range=([^&]+)/.exec(decodeURIComponent(location.hash));
  if (!m) return null;
  const at = (s) => {
    const mk = D.markers.find((k) => k[1] === s);
    return mk ? mk[0] : Number(s) * 1e9;
  };
  const [a, b] = m[1].split(',').map(at);
  return Number.isFinite(a) && Number.isFinite(b) ? [a, b] : null;
}

function main() {
  const app = document.getElementById('app');
  app.textContent = '';
  summary(app);
  const onRange = rangeSection(app);
  const c = chart(app, onRange);
  // The range's section goes after the chart.
  app.append(document.getElementById('range'));
  const fl = flames(app);
  leaks(app);
  wrongFrees(app);
  sections(app);
  app.append(el('pre', { id: 'errors' }));
  // Self-check: every flamegraph of a cost with a total draws.
  const drawn = COSTS.map((cost) => {
    fl.show(cost);
    const total = D.stacks.reduce((s, st) => s + st.v[cost.key], 0);
    return total === 0 || fl.f.drawn > 0;
  });
  fl.show(COSTS[0]);
  const r = rangeFromHash();
  if (r) c.select(r[0], r[1]);
  const status = el('div', { id: 'status', class: 'muted' });
  const ok = drawn.every(Boolean) && document.querySelectorAll('#chart polyline').length >= (D.timeline.length ? 2 : 0) && !errors.length;
  status.dataset.ok = ok ? '1' : '0';
  status.dataset.flames = drawn.map((d) => (d ? 1 : 0)).join('');
  status.dataset.leakRows = String(document.querySelectorAll('#leak-table tr').length - 1);
  // From the start of the page's load to drawn, ms.
  status.dataset.ms = String(Math.round(performance.now()));
  status.textContent = ok ? `Page drawn in ${num(Math.round(performance.now()))} ms.` : 'Not everything could be drawn (see the errors above).';
  app.append(status);
}

try {
  main();
} catch (e) {
  errors.push(String(e && e.stack || e));
  const box = document.getElementById('errors') || document.body.appendChild(document.createElement('pre'));
  box.id = 'errors';
  box.textContent = errors.join('\n');
}
