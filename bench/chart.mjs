// bench/compare's chart: reads the figures file compare writes next to its
// report (bench/out/compare-DATE.tsv) and writes an SVG of each layout's
// headline figure, one group of bars per workload, one bar per target.
//
//   node bench/chart.mjs bench/out/compare-DATE.tsv [--out FILE.svg]
//
// Without --out the SVG goes next to the figures file (same basename,
// .svg). The figures file is tab-separated, one record a line:
//
//   meta      KEY  VALUE                          started, machine, source, note
//   workload  ID   TITLE                          e.g. a  (a) non-stream chat …
//   figure    LAYOUT  WORKLOAD  TARGET  METRIC  VALUE    a median over rounds
//
// Lines starting with '#' and empty lines are skipped. Each workload keeps
// its own scale (req/s of (a) and (b) differ by 3x, µs by 10x), so a group
// is read against its own axis; the figure drawn is the layout's headline
// (HEADLINE below), and a bar of sluice is also labelled with its ratio to
// nginx and HAProxy. The card has its own white background: GitHub shows an
// SVG through <img> on a light or a dark page alike.
import { readFileSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { parse_args } from './args.mjs';

// What each metric is and which way is better.
export const METRICS = {
  proxy_cpu_us_per_req: { label: 'proxy CPU µs per request', better: 'lower' },
  proxy_cpu_us_per_event: { label: 'proxy CPU µs per SSE event', better: 'lower' },
  req_per_s: { label: 'requests per second', better: 'higher' },
  p50_us: { label: 'p50 latency µs', better: 'lower' },
  mean_us: { label: 'mean latency µs', better: 'lower' },
  kib_per_stream: { label: 'KiB per idle stream', better: 'lower' },
};

// The headline figure of a workload in a layout ('*': the layout's
// default). Pinned runs give each proxy one CPU of its own, so what they
// tell is its CPU per request; shared runs give all of them the machine, so
// what they tell is the throughput. Where the client fixes the rate ((c)
// 256 streams paced at 100 events/s, (e) 1,000 req/s) req/s says nothing,
// and one connection ((d), (k)) measures latency; (f) is memory.
export const HEADLINE = {
  pinned: { '*': 'proxy_cpu_us_per_req', c: 'proxy_cpu_us_per_event', d: 'p50_us', k: 'p50_us', f: 'kib_per_stream' },
  shared: { '*': 'req_per_s', c: 'proxy_cpu_us_per_event', d: 'p50_us', e: 'mean_us', k: 'p50_us', f: 'kib_per_stream' },
};

export const LAYOUT_TITLES = {
  pinned: 'pinned: load + mock-vllm on CPU 0, each proxy alone on CPU 1 (1 worker)',
  shared: 'shared: no pinning, 2 workers each',
};

// Fixed colours for the usual targets (the same in every chart), the rest
// from a palette in order of appearance; all readable on white.
const TARGET_COLORS = {
  direct: '#8c8c8c',
  nginx: '#2e8b57',
  haproxy: '#3465a4',
  sluice: '#e8710a',
};
const PALETTE = ['#c0392b', '#8e44ad', '#b8860b', '#16a085', '#d63384', '#5d6d7e', '#a0522d', '#2c3e50'];

export function escape_xml(s) {
  return String(s).replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&apos;' })[c]);
}

// Returns: { meta: {key: value}, workloads: Map id -> title,
// figures: [{layout, workload, target, metric, value}] } in file order.
// A figure whose value is not a number is left out ("-": not measured).
export function parse_figures(text) {
  const meta = {};
  const workloads = new Map();
  const figures = [];
  for (const raw of text.split('\n')) {
    const line = raw.replace(/\r$/, '');
    if (line === '' || line.startsWith('#')) continue;
    const f = line.split('\t');
    if (f[0] === 'meta' && f.length >= 3) {
      // several notes add up; other keys: the last one wins
      meta[f[1]] = f[1] === 'note' && meta.note ? `${meta.note}\n${f.slice(2).join(' ')}` : f.slice(2).join(' ');
    } else if (f[0] === 'workload' && f.length >= 3) {
      workloads.set(f[1], f.slice(2).join(' '));
    } else if (f[0] === 'figure' && f.length >= 6) {
      const value = Number(f[5]);
      if (f[5].trim() === '' || !Number.isFinite(value)) continue;
      figures.push({ layout: f[1], workload: f[2], target: f[3], metric: f[4], value });
    }
  }
  return { meta, workloads, figures };
}

function headline_metric(layout, workload, available) {
  const rules = HEADLINE[layout];
  const want = rules ? (rules[workload] ?? rules['*']) : undefined;
  if (want && available.has(want)) return want;
  if (rules) return undefined;
  // a layout without rules: CPU if measured, else throughput
  return ['proxy_cpu_us_per_req', 'req_per_s'].find((m) => available.has(m));
}

// The chart's content, before any drawing: per layout the groups (one per
// workload with a headline figure), each with its bars in target order.
export function chart_model(parsed) {
  const layouts = [];
  const targets = [];
  const workload_order = [...parsed.workloads.keys()];
  for (const f of parsed.figures) {
    if (!layouts.includes(f.layout)) layouts.push(f.layout);
    if (!targets.includes(f.target)) targets.push(f.target);
    if (!workload_order.includes(f.workload)) workload_order.push(f.workload);
  }
  const sections = [];
  for (const layout of layouts) {
    const groups = [];
    for (const workload of workload_order) {
      const mine = parsed.figures.filter((f) => f.layout === layout && f.workload === workload);
      const metric = headline_metric(layout, workload, new Set(mine.map((f) => f.metric)));
      if (!metric) continue;
      const bars = [];
      for (const target of targets) {
        const f = mine.find((x) => x.target === target && x.metric === metric);
        if (f) bars.push({ target, value: f.value });
      }
      groups.push({
        workload,
        title: parsed.workloads.get(workload) ?? `(${workload})`,
        metric,
        label: METRICS[metric]?.label ?? metric,
        better: METRICS[metric]?.better,
        bars,
      });
    }
    if (groups.length) sections.push({ layout, title: LAYOUT_TITLES[layout] ?? layout, groups });
  }
  const colors = {};
  let next = 0;
  for (const t of targets) colors[t] = TARGET_COLORS[t] ?? PALETTE[next++ % PALETTE.length];
  const shown = targets.filter((t) => sections.some((s) => s.groups.some((g) => g.bars.some((b) => b.target === t))));
  return { meta: parsed.meta, sections, targets: shown, colors };
}

// 1234.5 -> "1,235"; 16.94 -> "16.9"; 4.6 -> "4.6"; 0.852 -> "0.85"
export function format_value(v) {
  const a = Math.abs(v);
  if (a >= 1000) return Math.round(v).toLocaleString('en-US');
  const s = v.toFixed(a < 10 ? 2 : 1);
  return s.includes('.') ? s.replace(/\.?0+$/, '') : s;
}

// An axis from 0 to a round number at or above max, with 3-6 ticks.
function nice_axis(max) {
  if (!(max > 0)) return { top: 1, step: 0.25 };
  const raw = max / 4;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw);
  return { top: Math.ceil(max / step - 1e-9) * step, step };
}

// ratio of a sluice bar to nginx's and HAProxy's in the same group
function ratio_note(group, bar) {
  if (!bar.target.startsWith('sluice')) return '';
  const parts = [];
  for (const other of ['nginx', 'haproxy']) {
    const o = group.bars.find((b) => b.target === other);
    if (o && o.value !== 0) parts.push(`${(bar.value / o.value).toFixed(2)}× ${other === 'haproxy' ? 'HAProxy' : other}`);
  }
  return parts.length ? ` (${parts.join(', ')})` : '';
}

const W = 960;
const LEFT = 150;       // target names right-aligned at LEFT - 8
const PLOT = 520;       // bar area
const BAR_H = 16;
const BAR_GAP = 5;
const FONT = "font-family=\"-apple-system, 'Segoe UI', Helvetica, Arial, sans-serif\"";

// Whether a line of text fits the card at a font size, and a text cut at
// spaces into lines that do: estimated at 0.6 em per character (SVG text
// does not wrap, and its width is known only to the renderer).
const fits = (s, font_px) => s.length * font_px * 0.6 <= W - 48;
function wrap(s, font_px) {
  const lines = [];
  let line = '';
  for (const word of s.split(' ').filter(Boolean)) {
    const next = line ? `${line} ${word}` : word;
    if (line && !fits(next, font_px)) {
      lines.push(line);
      line = word;
    } else {
      line = next;
    }
  }
  if (line) lines.push(line);
  return lines;
}

export function render_svg(model) {
  const out = [];
  let y = 0;
  const text = (x, yy, s, attrs = '') => `<text x="${x}" y="${yy}"${attrs ? ' ' + attrs : ''}>${escape_xml(s)}</text>`;
  const meta = model.meta;
  const title = ['sluice bench/compare', meta.started, meta.machine].filter(Boolean).join(' · ');

  y = 34;
  out.push(text(24, y, ['sluice bench/compare', meta.started].filter(Boolean).join(' · '),
    'class="title" font-size="18" font-weight="bold"'));
  if (meta.machine) {
    y += 20;
    out.push(text(24, y, `machine: ${meta.machine}`, 'class="subtitle" font-size="13"'));
  }
  for (const line of wrap(meta.source ?? '', 12)) {
    y += 17;
    out.push(text(24, y, line, 'class="subtitle" font-size="12" fill="#444"'));
  }
  // legend: one swatch per target shown
  y += 26;
  let lx = 24;
  for (const t of model.targets) {
    out.push(`<g class="legend" data-target="${escape_xml(t)}"><rect x="${lx}" y="${y - 11}" width="12" height="12" rx="2" fill="${model.colors[t]}"/>` +
      text(lx + 17, y, t, 'font-size="12"') + '</g>');
    lx += 17 + Math.max(40, t.length * 7.2) + 18;
    if (lx > W - 140) { lx = 24; y += 18; }
  }
  y += 14;

  for (const section of model.sections) {
    y += 22;
    out.push(`<line x1="24" y1="${y - 16}" x2="${W - 24}" y2="${y - 16}" stroke="#d0d7de"/>`);
    out.push(text(24, y, section.title, 'class="section" font-size="15" font-weight="bold"'));
    for (const g of section.groups) {
      y += 26;
      const arrow = g.better === 'lower' ? '↓ lower is better' : g.better === 'higher' ? '↑ higher is better' : '';
      const metric = `${g.label}${arrow ? ', ' + arrow : ''}`;
      if (fits(`${g.title} — ${metric}`, 13)) {
        out.push(`<text x="24" y="${y}" font-size="13"><tspan font-weight="bold">${escape_xml(g.title)}</tspan>` +
          `<tspan fill="#444"> — ${escape_xml(metric)}</tspan></text>`);
      } else {
        out.push(`<text x="24" y="${y}" font-size="13"><tspan font-weight="bold">${escape_xml(g.title)}</tspan></text>`);
        y += 16;
        out.push(`<text x="24" y="${y}" font-size="13"><tspan fill="#444">${escape_xml(metric)}</tspan></text>`);
      }
      y += 8;
      const max = Math.max(0, ...g.bars.map((b) => b.value));
      const axis = nice_axis(max);
      const x_of = (v) => LEFT + (Math.max(0, v) / axis.top) * PLOT;
      const top = y;
      for (const b of g.bars) {
        const w = Math.max(0, x_of(b.value) - LEFT);
        out.push(text(LEFT - 8, y + BAR_H - 4, b.target, 'font-size="12" text-anchor="end"'));
        out.push(`<rect class="bar" data-layout="${escape_xml(section.layout)}" data-workload="${escape_xml(g.workload)}" ` +
          `data-target="${escape_xml(b.target)}" data-value="${b.value}" x="${LEFT}" y="${y}" width="${w.toFixed(1)}" ` +
          `height="${BAR_H}" fill="${model.colors[b.target]}"><title>${escape_xml(`${b.target}: ${format_value(b.value)} ${g.label}`)}</title></rect>`);
        out.push(text((LEFT + w + 6).toFixed(1), y + BAR_H - 4, format_value(b.value) + ratio_note(g, b),
          'class="value" font-size="11"'));
        y += BAR_H + BAR_GAP;
      }
      // the group's axis
      const base = y + 2;
      out.push(`<line x1="${LEFT}" y1="${top - 2}" x2="${LEFT}" y2="${base}" stroke="#57606a"/>`);
      out.push(`<line x1="${LEFT}" y1="${base}" x2="${LEFT + PLOT}" y2="${base}" stroke="#57606a"/>`);
      for (let v = 0; v <= axis.top + axis.step / 2; v += axis.step) {
        const x = x_of(v).toFixed(1);
        out.push(`<line x1="${x}" y1="${base}" x2="${x}" y2="${base + 4}" stroke="#57606a"/>`);
        out.push(text(x, base + 15, format_value(v), 'class="tick" font-size="10" fill="#57606a" text-anchor="middle"'));
      }
      y = base + 18;
    }
  }
  y += 22;
  const notes = ['Bars: medians over rounds; each workload has its own axis. sluice bars also give sluice ÷ nginx and ÷ HAProxy.'];
  if (model.targets.includes('direct')) {
    notes.push('direct: mock-vllm reached with no proxy between, the reference; it has no proxy CPU, so no bar in those groups.');
  }
  if (meta.note) notes.push(...meta.note.split('\n'));
  for (const n of notes) {
    for (const line of wrap(n, 11)) {
      out.push(text(24, y, line, 'class="note" font-size="11" fill="#444"'));
      y += 15;
    }
  }
  const h = Math.ceil(y + 8);
  return `<?xml version="1.0" encoding="UTF-8"?>\n` +
    `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${h}" viewBox="0 0 ${W} ${h}" ${FONT} fill="#1f2328" role="img">\n` +
    `<title>${escape_xml(title)}</title>\n` +
    `<rect class="background" x="0.5" y="0.5" width="${W - 1}" height="${h - 1}" rx="8" fill="#ffffff" stroke="#d0d7de"/>\n` +
    out.join('\n') + '\n</svg>\n';
}

export function chart_from_figures(text) {
  return render_svg(chart_model(parse_figures(text)));
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const args = parse_args(process.argv.slice(2));
  if (args._.length !== 1) {
    process.stderr.write('usage: node bench/chart.mjs FIGURES.tsv [--out FILE.svg]\n');
    process.exit(2);
  }
  const input = args._[0];
  const output = args.out ?? input.replace(/\.[^./]*$/, '') + '.svg';
  const model = chart_model(parse_figures(readFileSync(input, 'utf8')));
  if (!model.sections.length) {
    process.stderr.write(`chart.mjs: ${input} holds no headline figure\n`);
    process.exit(1);
  }
  writeFileSync(output, render_svg(model));
  process.stderr.write(`chart.mjs: wrote ${output}\n`);
}
