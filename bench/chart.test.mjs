// bench/chart.mjs and bench/report-figures.mjs: the SVG of bench/compare's
// figures. Run by tools/test (node --test bench/*.test.mjs); no build, no
// load.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chart_from_figures, escape_xml, format_value, parse_figures } from './chart.mjs';
import { figures_from_markdown, figures_tsv } from './report-figures.mjs';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const fixture = readFileSync(join(root, 'tests/fixtures/bench/figures.tsv'), 'utf8');
const report_fixture = readFileSync(join(root, 'tests/fixtures/bench/report.md'), 'utf8');

// A small XML check, enough for what chart.mjs writes: every tag closes in
// order, attribute values are quoted and hold no '<', text holds no bare
// '<' or '&'. Returns: the elements as { name, attrs, text } in document
// order (text: the text within the element, its children's included,
// entities decoded).
function parse_xml(s) {
  const body = s.replace(/^<\?xml[^?]*\?>\s*/, '');
  const stack = [];
  const elements = [];
  let i = 0;
  let roots = 0;
  const decode = (t) => {
    assert.doesNotMatch(t, /&(?!(amp|lt|gt|quot|apos|#\d+);)/, `bare & in ${JSON.stringify(t)}`);
    return t.replace(/&(amp|lt|gt|quot|apos);/g, (_, e) => ({ amp: '&', lt: '<', gt: '>', quot: '"', apos: "'" })[e]);
  };
  while (i < body.length) {
    const lt = body.indexOf('<', i);
    const text = body.slice(i, lt < 0 ? body.length : lt);
    if (text.trim() !== '') {
      assert.ok(stack.length > 0, `text outside the root: ${JSON.stringify(text)}`);
      const t = decode(text);
      for (const open of stack) open.text += t;
    }
    if (lt < 0) break;
    const gt = body.indexOf('>', lt);
    assert.ok(gt > lt, 'a tag that does not end');
    const tag = body.slice(lt + 1, gt);
    assert.doesNotMatch(tag, /</, `'<' inside a tag: ${tag}`);
    if (tag.startsWith('/')) {
      const open = stack.pop();
      assert.ok(open, `</${tag.slice(1)}> closes nothing`);
      assert.equal(tag.slice(1), open.name, `</${tag.slice(1)}> closes <${open.name}>`);
    } else {
      const m = /^([A-Za-z][\w:-]*)((?:\s+[\w:-]+="[^"]*")*)\s*(\/?)$/.exec(tag);
      assert.ok(m, `malformed tag <${tag}>`);
      const attrs = {};
      for (const a of m[2].matchAll(/([\w:-]+)="([^"]*)"/g)) {
        assert.ok(!(a[1] in attrs), `attribute ${a[1]} twice in <${m[1]}>`);
        attrs[a[1]] = decode(a[2]);
      }
      const el = { name: m[1], attrs, text: '' };
      elements.push(el);
      if (stack.length === 0) ++roots;
      if (m[3] !== '/') stack.push(el);
    }
    i = gt + 1;
  }
  assert.equal(stack.length, 0, `unclosed: ${stack.map((e) => e.name).join(', ')}`);
  assert.equal(roots, 1, 'one root element');
  return elements;
}

const bars_of = (els) => els.filter((e) => e.name === 'rect' && e.attrs.class === 'bar');
const texts_of = (els) => els.filter((e) => e.name === 'text').map((e) => e.text);
const key = (b) => `${b.attrs['data-layout']} ${b.attrs['data-workload']} ${b.attrs['data-target']}`;

test('the chart of the sample figures is well-formed SVG on its own white background', () => {
  const els = parse_xml(chart_from_figures(fixture));
  assert.equal(els[0].name, 'svg');
  assert.equal(els[0].attrs.xmlns, 'http://www.w3.org/2000/svg');
  assert.match(els[0].attrs.viewBox, /^0 0 \d+ \d+$/);
  const bg = els.find((e) => e.attrs.class === 'background');
  assert.equal(bg.attrs.fill, '#ffffff');
  assert.equal(bg.attrs.width, String(Number(els[0].attrs.width) - 1));
});

test('one bar per layout, workload and target that has the headline figure', () => {
  const bars = bars_of(parse_xml(chart_from_figures(fixture)));
  assert.deepEqual(bars.map(key), [
    // pinned (a): proxy CPU per request; direct has none ("-")
    'pinned a nginx', 'pinned a haproxy', 'pinned a sluice', 'pinned a sluice-quota',
    // pinned (c): CPU per event; (d): p50; (b) has only p99, so no group
    'pinned c nginx', 'pinned c sluice',
    'pinned d direct', 'pinned d sluice',
    // shared (a): req/s; (c): CPU per event
    'shared a direct', 'shared a nginx', 'shared a haproxy', 'shared a sluice',
    'shared c sluice',
  ]);
  const value = (k) => Number(bars.find((b) => key(b) === k).attrs['data-value']);
  assert.equal(value('pinned a sluice'), 16.5);
  assert.equal(value('shared a sluice'), 63024.5);
  assert.equal(value('pinned c sluice'), 11.8);
});

test('bars are as long as their values on the group axis', () => {
  const bars = bars_of(parse_xml(chart_from_figures(fixture)));
  const width = (k) => Number(bars.find((b) => key(b) === k).attrs.width);
  // shared (a): 121,707.5 req/s is the longest; 63,024.5 about half of it
  assert.ok(width('shared a direct') > width('shared a sluice'));
  assert.ok(Math.abs(width('shared a sluice') / width('shared a direct') - 63024.5 / 121707.5) < 0.01);
  // pinned (a): sluice-quota (11.1) shorter than nginx (16.9)
  assert.ok(Math.abs(width('pinned a sluice-quota') / width('pinned a nginx') - 11.1 / 16.9) < 0.01);
});

test('every bar has its value written beside it, sluice also its ratio to nginx and HAProxy', () => {
  const texts = texts_of(parse_xml(chart_from_figures(fixture)));
  for (const v of ['16.9', '17.1', '12.4', '19', '44', '121,708', '49,912', '48,904', '14.9']) {
    assert.ok(texts.includes(v), `a label "${v}" in ${JSON.stringify(texts)}`);
  }
  assert.ok(texts.includes('16.5 (0.98× nginx, 0.96× HAProxy)'));
  assert.ok(texts.includes('63,025 (1.26× nginx, 1.29× HAProxy)'));
  assert.ok(texts.includes('11.1 (0.66× nginx, 0.65× HAProxy)'));
  assert.ok(texts.includes('11.8 (0.95× nginx)'));  // (c) had no HAProxy
});

test('title with date and machine, which way is better per group, legend of the targets shown', () => {
  const els = parse_xml(chart_from_figures(fixture));
  const all = els.filter((e) => e.name === 'text').map((e) => e.text).join('\n');
  assert.match(all, /sluice bench\/compare · 2026-12-01 12:00 UTC/);
  assert.match(all, /machine: Test CPU, nproc 2, kernel 6\.1/);
  assert.ok(els.some((e) => e.name === 'title' && e.text === 'sluice bench/compare · 2026-12-01 12:00 UTC · Test CPU, nproc 2, kernel 6.1'));
  assert.match(all, /commit abc1234; 3 rounds × 5s per target/);
  assert.match(all, /\(a\) non-stream chat completion, 32 connections — proxy CPU µs per request, ↓ lower is better/);
  assert.match(all, /\(a\) non-stream chat completion, 32 connections — requests per second, ↑ higher is better/);
  assert.match(all, /\(c\) token trickle.* — proxy CPU µs per SSE event, ↓ lower is better/);
  assert.match(all, /pinned: /);
  assert.match(all, /shared: /);
  const legend = els.filter((e) => e.name === 'g' && e.attrs.class === 'legend').map((e) => e.attrs['data-target']);
  assert.deepEqual(legend, ['direct', 'nginx', 'haproxy', 'sluice', 'sluice-quota']);
  // a target keeps its colour in every group
  const fills = new Map();
  for (const b of bars_of(els)) {
    const t = b.attrs['data-target'];
    if (fills.has(t)) assert.equal(b.attrs.fill, fills.get(t), t);
    fills.set(t, b.attrs.fill);
  }
});

test('names with <, & and > are escaped and the SVG stays well-formed', () => {
  const tsv = [
    'meta\tstarted\t2026-12-01 <now> & "then"',
    "meta\tmachine\tA&B <cpu> 'x'",
    'workload\ta\t(a) <script>alert(1)</script> & more',
    'figure\tpinned\ta\t<a&b>\tproxy_cpu_us_per_req\t10',
    'figure\tpinned\ta\tnginx\tproxy_cpu_us_per_req\t20',
  ].join('\n');
  const svg = chart_from_figures(tsv);
  assert.ok(!svg.includes('<a&b>'));
  assert.ok(!svg.includes('<script>'));
  assert.ok(svg.includes('&lt;a&amp;b&gt;'));
  const els = parse_xml(svg);
  assert.ok(!els.some((e) => e.name === 'script' || e.name === 'a'));
  const bars = bars_of(els);
  assert.deepEqual(bars.map((b) => b.attrs['data-target']), ['<a&b>', 'nginx']);
  const texts = texts_of(els);
  assert.ok(texts.includes('<a&b>'));
  assert.ok(els.some((e) => e.name === 'tspan' && e.text === '(a) <script>alert(1)</script> & more'));
  assert.ok(els.some((e) => e.name === 'title' && e.text.includes(`A&B <cpu> 'x'`)));
  assert.equal(escape_xml(`<&>"'`), '&lt;&amp;&gt;&quot;&apos;');
});

test('values are formatted for reading', () => {
  assert.equal(format_value(121707.5), '121,708');
  assert.equal(format_value(16.94), '16.9');
  assert.equal(format_value(27), '27');
  assert.equal(format_value(4.6), '4.6');
  assert.equal(format_value(0.852), '0.85');
});

test('lines that are not figures, and figures that are not numbers, are left out', () => {
  const parsed = parse_figures('# comment\n\nfigure\tpinned\ta\tx\tp50_us\t-\nfigure\tpinned\ta\ty\tp50_us\t\n' +
    'junk line\nfigure\tpinned\ta\tz\tp50_us\t7\r\n');
  assert.deepEqual(parsed.figures, [{ layout: 'pinned', workload: 'a', target: 'z', metric: 'p50_us', value: 7 }]);
});

test("a compare report's tables become figures: layouts, workloads, numeric cells only", () => {
  const parsed = figures_from_markdown(report_fixture, { section: '2026-11-30 17:23 UTC' });
  assert.equal(parsed.meta.started, '2026-11-30 17:23 UTC');
  assert.match(parsed.meta.source, /commit fc61861/);
  assert.deepEqual([...parsed.workloads.keys()], ['a', 'd']);
  const get = (l, w, t, m) => parsed.figures.find((f) => f.layout === l && f.workload === w && f.target === t && f.metric === m)?.value;
  assert.equal(get('pinned', 'a', 'sluice', 'proxy_cpu_us_per_req'), 16.5);
  assert.equal(get('pinned', 'a', 'direct', 'proxy_cpu_us_per_req'), undefined);  // "-"
  assert.equal(get('pinned', 'a', 'sluice', 'req_per_s'), 56277);
  assert.equal(get('pinned', 'd', 'sluice', 'p50_us'), 44);
  assert.equal(get('shared', 'a', 'sluice', 'req_per_s'), 63024.5);  // "**63,024.5**"
  // the older run below the section is not read
  assert.ok(!parsed.figures.some((f) => f.value === 99999));
  // and the round trip through the figures file gives the same chart input
  const again = parse_figures(figures_tsv(parsed));
  assert.deepEqual(again.figures, parsed.figures);
  assert.deepEqual([...again.workloads], [...parsed.workloads]);
  assert.equal(again.meta.started, parsed.meta.started);
});

test("a saved report's own started/machine/commit lines are its meta", () => {
  const report = [
    '# bench/compare', '',
    'started: 2026-12-02 01:00 UTC; machine: Some CPU, nproc 2, kernel 6.1',
    'commit: abc1234; 3 rounds × 5s per target, medians', '',
    '## shared: no pinning, 2 workers each', '',
    '### (a) non-stream chat completion, 32 connections', '',
    '| target | req/s | p50 µs |', '|---|---:|---:|',
    '| nginx | 1,000 | 50 |', '| sluice | 2000 | pending |', '',
  ].join('\n');
  const parsed = figures_from_markdown(report);
  assert.deepEqual(parsed.meta, {
    started: '2026-12-02 01:00 UTC',
    machine: 'Some CPU, nproc 2, kernel 6.1',
    source: 'abc1234; 3 rounds × 5s per target, medians',
  });
  assert.deepEqual(parsed.figures.map((f) => `${f.target} ${f.metric} ${f.value}`),
    ['nginx req_per_s 1000', 'nginx p50_us 50', 'sluice req_per_s 2000']);
});

test('the chart RESULTS.md shows is the chart of the figures next to it', () => {
  const figures = readFileSync(join(root, 'bench/chart.tsv'), 'utf8');
  const svg = readFileSync(join(root, 'bench/chart.svg'), 'utf8');
  assert.equal(svg, chart_from_figures(figures), 'rerun: node bench/chart.mjs bench/chart.tsv');
  const bars = bars_of(parse_xml(svg));
  const n = parse_figures(figures).figures.filter((f) => f.layout === 'shared' && f.workload === 'a' && f.metric === 'req_per_s').length;
  assert.equal(bars.filter((b) => b.attrs['data-layout'] === 'shared' && b.attrs['data-workload'] === 'a').length, n);
});

// bench/compare's own results files (the columns its measure functions
// write), through the figures function it runs after its report.
test("compare's figures file holds the medians of its results, and charts", () => {
  const dir = mkdtempSync(join(tmpdir(), 'chart-test-'));
  try {
    const tsv = (rows) => rows.map((r) => r.join('\t') + '\n').join('');
    // layout, workload, target, round, req/s, p50, p99, errors, bytes/req,
    // proxy µs/req, CPU 1 µs/req, foreign %, try, proxy user µs/req
    writeFileSync(join(dir, 'r.tsv'), tsv([
      ['pinned', 'a', 'direct', 1, 100, 10, 20, 0, 700, '-', '-', 0, 1, '-'],
      ['pinned', 'a', 'nginx', 1, 80, 12, 30, 0, 700, 20, 21, 0, 1, 5],
      ['pinned', 'a', 'sluice', 1, 90, 11, 21, 0, 700, 16, 17, 0, 1, 3],
      ['pinned', 'a', 'sluice', 2, 80, 12, 22, 0, 700, 18, 19, 50, 3, 4],
    ]));
    // (c): ... proxy µs/event in column 11
    writeFileSync(join(dir, 'c.tsv'), tsv([
      ['shared', 'c', 'nginx', 1, 25000, 75000, 256, 0, 0, 255, 12.5, '-', 9950, 12000, 0, 1, 5, 7.5],
    ]));
    writeFileSync(join(dir, 'e.tsv'), '');
    // (h): ... proxy µs/req in column 11
    writeFileSync(join(dir, 'h.tsv'), tsv([
      ['shared', 'h', 'sluice', 1, 79622, 3000, 100, 9000, 0, 400000, 13.3, '-', 0, 1, 'h2', 'TLS_AES_128_GCM_SHA256'],
    ]));
    // (f): ... KiB per stream in column 11
    writeFileSync(join(dir, 'f.tsv'), tsv([
      ['pinned', 'f', 'sluice', 1, 10000, 10000, 9961, 0, 11224, 70276, 5.9, 2, 1630],
    ]));
    const script = `set -euo pipefail
      source bench/lib.sh; source bench/compare-cef.sh; source bench/compare-figures.sh
      RESULTS=$D/r.tsv RESULTS_C=$D/c.tsv RESULTS_E=$D/e.tsv RESULTS_H=$D/h.tsv RESULTS_F=$D/f.tsv
      layouts=(pinned shared) want_workloads=(a c f h) all_targets=(direct nginx haproxy sluice)
      started="2026-12-02 01:00 UTC" machine="Test CPU, nproc 2" commit=abc1234 rounds=2 duration=5 max_foreign=10
      workload_desc() { echo "($1) the workload $1"; }
      print_figures`;
    const out = execFileSync('bash', ['-c', script], { cwd: root, env: { ...process.env, D: dir }, encoding: 'utf8' });
    const parsed = parse_figures(out);
    assert.deepEqual(parsed.meta, {
      started: '2026-12-02 01:00 UTC',
      machine: 'Test CPU, nproc 2',
      source: 'bench/compare at commit abc1234, 2 rounds × 5s per target',
      note: '1 of 6 runs were disturbed by other load: see the report.',
    });
    assert.deepEqual([...parsed.workloads.keys()], ['a', 'c', 'f', 'h']);
    const get = (l, w, t, m) => parsed.figures.find((f) => f.layout === l && f.workload === w && f.target === t && f.metric === m)?.value;
    assert.equal(get('pinned', 'a', 'sluice', 'proxy_cpu_us_per_req'), 17);  // median of 16 and 18
    assert.equal(get('pinned', 'a', 'sluice', 'req_per_s'), 85);
    assert.equal(get('pinned', 'a', 'sluice', 'proxy_user_us_per_req'), 3.5);
    assert.equal(get('pinned', 'a', 'direct', 'req_per_s'), 100);
    assert.equal(get('pinned', 'a', 'direct', 'proxy_cpu_us_per_req'), undefined);  // "-": no line
    assert.equal(get('shared', 'c', 'nginx', 'proxy_cpu_us_per_event'), 12.5);
    assert.equal(get('shared', 'c', 'nginx', 'cpu1_us_per_event'), undefined);
    assert.equal(get('shared', 'h', 'sluice', 'proxy_cpu_us_per_req'), 13.3);
    assert.equal(get('shared', 'h', 'sluice', 'req_per_s'), 79622);
    assert.equal(get('pinned', 'f', 'sluice', 'kib_per_stream'), 5.9);
    const bars = bars_of(parse_xml(chart_from_figures(out)));
    assert.deepEqual(bars.map(key), [
      'pinned a nginx', 'pinned a sluice', 'pinned f sluice',
      'shared c nginx', 'shared h sluice',
    ]);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('long titles and sources are cut into lines that fit the card', () => {
  const long = 'x'.repeat(60);
  const tsv = [
    `meta\tsource\t${Array(40).fill('word').join(' ')}`,
    `workload\tg\t(g) ${long} ${long}`,
    'figure\tpinned\tg\tsluice\tproxy_cpu_us_per_req\t12.5',
  ].join('\n');
  const els = parse_xml(chart_from_figures(tsv));
  const texts = els.filter((e) => e.name === 'text');
  const source = texts.filter((e) => e.text.startsWith('word'));
  assert.ok(source.length >= 2, 'the source on several lines');
  assert.equal(source.map((e) => e.text).join(' '), Array(40).fill('word').join(' '));
  const title = texts.findIndex((e) => e.text === `(g) ${long} ${long}`);
  assert.ok(title >= 0, 'the group title alone on its line');
  assert.equal(texts[title + 1].text, 'proxy CPU µs per request, ↓ lower is better');
  assert.ok(Number(texts[title + 1].attrs.y) > Number(texts[title].attrs.y));
});
