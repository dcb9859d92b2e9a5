// The figures file of bench/chart.mjs from a bench/compare report in
// Markdown: a saved bench/out/compare-DATE.md, or a run's tables pasted
// into bench/RESULTS.md (reports older than the figures file, or runs
// whose raw output is gone). No load is run: the medians are read from the
// report's tables.
//
//   node bench/report-figures.mjs REPORT.md [--section TEXT] [--out FILE]
//        [--started S] [--machine M] [--source S] [--note N]
//
// --section: only the part under the first heading that contains TEXT (up
// to the next heading of its level or above). The layout comes from the
// headings ("pinned: …", "shared: …"), the workload from "(a) …" headings,
// the figures from each "| target | …" table: the columns listed in
// COLUMNS, cells that are not numbers ("-", "pending") left out. started,
// machine and source come from the report's "started: …; machine: …" and
// "commit: …" lines, or from the section's heading; the flags override.
import { readFileSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { parse_args } from './args.mjs';

// table header -> metric of the figures file
export const COLUMNS = {
  'req/s': 'req_per_s',
  'events/s': 'events_per_s',
  'p50 µs': 'p50_us',
  'p99 µs': 'p99_us',
  'mean µs': 'mean_us',
  'added p50 µs': 'added_p50_us',
  'added mean µs': 'added_mean_us',
  'proxy CPU µs/req': 'proxy_cpu_us_per_req',
  'proxy CPU µs/event': 'proxy_cpu_us_per_event',
  'CPU 1 µs/req': 'cpu1_us_per_req',
  'CPU 1 µs/event': 'cpu1_us_per_event',
  'KiB per stream': 'kib_per_stream',
};

const heading_of = (line) => /^(#+)\s+(.*)$/.exec(line);

function section_lines(lines, section) {
  if (section === undefined) return lines;
  const start = lines.findIndex((l) => heading_of(l) && l.includes(section));
  if (start < 0) throw new Error(`no heading holds "${section}"`);
  const level = heading_of(lines[start])[1].length;
  let end = start + 1;
  while (end < lines.length) {
    const h = heading_of(lines[end]);
    if (h && h[1].length <= level) break;
    ++end;
  }
  return lines.slice(start, end);
}

const cells = (line) => line.trim().replace(/^\|/, '').replace(/\|$/, '').split('|').map((c) => c.trim());

// Returns: { meta, workloads: Map id -> title, figures: [...] } as
// chart.mjs's parse_figures reads them.
export function figures_from_markdown(text, { section } = {}) {
  const lines = section_lines(text.split('\n').map((l) => l.replace(/\r$/, '')), section);
  const meta = {};
  const workloads = new Map();
  const figures = [];
  const first = heading_of(lines[0] ?? '');
  if (section !== undefined && first) {
    const when = /^\d{4}-\d\d-\d\d(?: \d\d:\d\d UTC)?/.exec(first[2]);
    if (when) meta.started = when[0];
    meta.source = first[2];
  }
  let layout;
  let workload;
  for (let i = 0; i < lines.length; ++i) {
    const line = lines[i];
    const started = /^started: ([^;]*); machine: (.*)$/.exec(line);
    if (started) {
      meta.started = started[1];
      meta.machine = started[2];
      continue;
    }
    if (/^commit: /.test(line)) {
      meta.source = line.slice('commit: '.length);
      continue;
    }
    const h = heading_of(line);
    if (h) {
      const layout_word = /^(pinned|shared):/.exec(h[2]);
      if (layout_word) {
        layout = layout_word[1];
        workload = undefined;
      }
      const w = /^\(([a-z])\)\s/.exec(h[2]);
      if (w) {
        workload = w[1];
        if (!workloads.has(workload)) workloads.set(workload, h[2]);
      }
      continue;
    }
    if (!line.startsWith('| target |') || !layout || !workload) continue;
    const header = cells(line);
    for (i += 2; i < lines.length && lines[i].startsWith('|'); ++i) {
      const row = cells(lines[i]);
      const target = row[0];
      header.forEach((name, c) => {
        const metric = COLUMNS[name];
        if (!metric || c >= row.length) return;
        const v = row[c].replace(/\*/g, '').replace(/,/g, '');
        if (!/^-?\d+(\.\d+)?$/.test(v)) return;
        figures.push({ layout, workload, target, metric, value: Number(v) });
      });
    }
    --i;
  }
  return { meta, workloads, figures };
}

const clean = (s) => String(s).replace(/[\t\r\n]+/g, ' ');

export function figures_tsv({ meta, workloads, figures }) {
  const out = ['# bench/compare figures (bench/chart.mjs reads them): medians over rounds'];
  for (const [k, v] of Object.entries(meta)) {
    for (const part of String(v).split('\n')) out.push(`meta\t${clean(k)}\t${clean(part)}`);
  }
  for (const [id, title] of workloads) out.push(`workload\t${clean(id)}\t${clean(title)}`);
  for (const f of figures) {
    out.push(['figure', f.layout, f.workload, f.target, f.metric, String(f.value)].map(clean).join('\t'));
  }
  return out.join('\n') + '\n';
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const args = parse_args(process.argv.slice(2));
  if (args._.length !== 1) {
    process.stderr.write('usage: node bench/report-figures.mjs REPORT.md [--section TEXT] [--out FILE] ' +
      '[--started S] [--machine M] [--source S] [--note N]\n');
    process.exit(2);
  }
  const parsed = figures_from_markdown(readFileSync(args._[0], 'utf8'), { section: args.section });
  for (const k of ['started', 'machine', 'source', 'note']) if (args[k] !== undefined) parsed.meta[k] = args[k];
  if (!parsed.figures.length) {
    process.stderr.write('report-figures.mjs: no figure found\n');
    process.exit(1);
  }
  const tsv = figures_tsv(parsed);
  if (args.out) writeFileSync(args.out, tsv);
  else process.stdout.write(tsv);
}
