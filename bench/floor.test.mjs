// bench/compare-floor.sh: issue 20's table from bench/compare's results
// files -- ratios within rounds, their median, range and how many rounds
// met the target. Run by tools/test (node --test bench/*.test.mjs); no
// build, no load.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const tsv = (rows) => rows.map((r) => r.join('\t') + '\n').join('');

// Runs `body` in bash with compare-floor.sh sourced and the results files
// of `files` (name -> rows) in a fresh folder as $D/name.
function run_floor(files, body) {
  const dir = mkdtempSync(join(tmpdir(), 'floor-test-'));
  try {
    for (const [name, rows] of Object.entries(files)) writeFileSync(join(dir, name), tsv(rows));
    const script = `set -euo pipefail
      source bench/compare-floor.sh
      RESULTS=$D/r.tsv RESULTS_C=$D/c.tsv RESULTS_H=$D/h.tsv
      ${body}`;
    return execFileSync('bash', ['-c', script], { cwd: root, env: { ...process.env, D: dir }, encoding: 'utf8' });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

// The main results: layout, workload, target, round, req/s, p50, p99,
// errors, bytes/req, proxy µs/req, CPU 1 µs/req, foreign %, try, user µs/req.
const main_row = (l, w, t, round, rps, cpu) => [l, w, t, round, rps, 500, 900, 0, 761, cpu, '-', 0, 1, 1];
// (c): ... proxy µs/event in column 11.
const c_row = (t, round, us) => ['pinned', 'c', t, round, 2000, 50000, 256, 0, 0, 256, us, '-', 900, 1100, 0, 1, 0.5, 1];
// (h), (i), (j): ... req/s in column 5.
const h_row = (t, round, rps) => ['shared', 'i', t, round, rps, 9000, 100, 20000, 0, rps * 5, 30, '-', 0, 1, 'h2c', '-'];

function table_rows(out) {
  return out.split('\n').filter((l) => l.startsWith('| (')).map((l) => l.split('|').slice(1, -1).map((c) => c.trim()));
}

test("issue 20's table: the median of the ratios within rounds decides; range and rounds met beside it", () => {
  const files = {
    'r.tsv': [
      // (b) pinned: 1.15, 1.25, 1.21 -> median 1.21, over 1.20
      main_row('pinned', 'b', 'relay', 1, 900, 20), main_row('pinned', 'b', 'sluice', 1, 900, 23),
      main_row('pinned', 'b', 'relay', 2, 900, 20), main_row('pinned', 'b', 'sluice', 2, 900, 25),
      main_row('pinned', 'b', 'relay', 3, 900, 20), main_row('pinned', 'b', 'sluice', 3, 900, 24.2),
      // nginx in the same rounds changes nothing
      main_row('pinned', 'b', 'nginx', 1, 700, 40),
      // (a) pinned: 1.09, 1.15, 1.10 -> median 1.10: the bound itself is met
      main_row('pinned', 'a', 'relay', 1, 9000, 10), main_row('pinned', 'a', 'sluice', 1, 9000, 10.9),
      main_row('pinned', 'a', 'relay', 2, 9000, 10), main_row('pinned', 'a', 'sluice', 2, 9000, 11.5),
      main_row('pinned', 'a', 'relay', 3, 9000, 10), main_row('pinned', 'a', 'sluice', 3, 9000, 11),
      // a round sluice alone ran (the relay failed) is no ratio
      main_row('pinned', 'a', 'sluice', 4, 9000, 30),
      // (a) shared, req/s: 0.92, 0.95, 0.90 -> median 0.92, met; round 3's
      // ratio is taken from the numbers of that round, not from medians
      main_row('shared', 'a', 'relay', 1, 100, 14), main_row('shared', 'a', 'sluice', 1, 92, 17),
      main_row('shared', 'a', 'relay', 2, 200, 14), main_row('shared', 'a', 'sluice', 2, 190, 17),
      main_row('shared', 'a', 'relay', 3, 50, 14), main_row('shared', 'a', 'sluice', 3, 45, 17),
    ],
    'c.tsv': [c_row('relay', 1, 2), c_row('sluice', 1, 2.2)],
    // (i) against nginx: 2.60, 2.40 -> median 2.50, met; 1 of 2 rounds alone
    'h.tsv': [h_row('nginx', 1, 100), h_row('sluice', 1, 260), h_row('nginx', 2, 200), h_row('sluice', 2, 480)],
  };
  const out = run_floor(files, `layouts=(pinned shared) want_workloads=(a b c i)
    print_floor_summary`);
  assert.match(out, /## Issue 20's table: sluice against the floor \(bench-relay\) and nginx/);
  assert.deepEqual(table_rows(out), [
    ['(b) 41 KB SSE pinned: proxy CPU per response ÷ floor', '1.21', '1.15–1.25', '1/3', '≤ 1.20', 'NOT met'],
    ['(a) JSON pinned: proxy CPU per request ÷ floor', '1.10', '1.09–1.15', '2/3', '≤ 1.10', 'met'],
    ['(a) JSON shared: req/s ÷ floor', '0.92', '0.90–0.95', '2/3', '≥ 0.92', 'met'],
    ['(c) token trickle pinned: proxy CPU per event ÷ floor', '1.10', '1.10–1.10', '1/1', '≤ 1.15', 'met'],
    ['(i) h2c SSE shared: req/s ÷ nginx', '2.50', '2.40–2.60', '1/2', '≥ 2.5', 'met'],
  ]);
});

test("issue 20's table: rows only for what ran; a row with no pair of rounds says so", () => {
  const files = {
    'r.tsv': [main_row('pinned', 'a', 'sluice', 1, 9000, 11)],  // no relay
    'c.tsv': [],
    'h.tsv': [],
  };
  const out = run_floor(files, `layouts=(pinned) want_workloads=(a i)
    print_floor_summary`);
  // shared and (b), (c) did not run: no rows; (i) is shared only
  assert.deepEqual(table_rows(out), [
    ['(a) JSON pinned: proxy CPU per request ÷ floor', '-', '-', '-', '≤ 1.10', 'not measured'],
  ]);
  const none = run_floor(files, `layouts=(shared) want_workloads=(b c)
    print_floor_summary; echo "[done]"`);
  assert.equal(none.trim(), '[done]');  // nothing to say: no heading either
});

test('round_ratio_in: the median of the ratios within rounds, "-" without a pair', () => {
  const files = {
    'r.tsv': [
      main_row('pinned', 'a', 'relay', 1, 100, 10), main_row('pinned', 'a', 'sluice', 1, 100, 12),
      main_row('pinned', 'a', 'relay', 2, 100, 10), main_row('pinned', 'a', 'sluice', 2, 100, 11),
    ],
    'c.tsv': [],
    'h.tsv': [],
  };
  const out = run_floor(files, `round_ratio pinned a sluice relay 10
    round_ratio pinned a sluice relay 5
    round_ratio pinned b sluice relay 10
    round_ratio_in "$RESULTS" pinned a relay sluice 10`);
  assert.deepEqual(out.trim().split('\n'), ['1.15', '1.00', '-', '0.87']);
});
