// The semantic router (issue 18): `model: "auto"` picks the group by what
// the prompt means, with the classifier trained at start from the examples
// in tests/data/router. One mock-vllm backend per group (backend i answers
// as model "backend-i"), so each answer names the group that served it; the
// x-sluice-group header and the audit line say it too. Sticky sessions: a
// conversation with an X-Session-ID keeps the group of its first message
// even when its later turns, alone, classify elsewhere.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';

import { bound_ms, program, repo_root, start_sluice, stop_all } from './lib/harness.mjs';
import { backend_of, gateway_config, poll, post_fresh, read_audit, run_pool, samples, scrape, start_backends } from './lib/gateway.mjs';

const key = 'sk-router-semantic-71c0';
const data = path.join(repo_root, 'tests', 'data', 'router');
const groups = ['code', 'math', 'translation', 'chat', 'vision'];

// A fixed set, each prompt with the group it must reach (not trained on:
// they are from the evaluation set).
const fixed = [
  ['code', 'my python script crashes with KeyError when the key is missing'],
  ['code', 'what is the difference between let and var in JavaScript'],
  ['code', '怎么用 JavaScript 发送一个 POST 请求'],
  ['math', 'solve 5x - 3 = 2x + 9'],
  ['math', 'what is the integral of 1 over x'],
  ['math', '求解方程组 x + y = 7, x - y = 1'],
  ['translation', 'translate to English: je ne sais pas'],
  ['translation', 'please translate this paragraph into German'],
  ['translation', '把这段话翻译成英文'],
  ['chat', 'hello! how is your day going'],
  ['chat', 'what should I have for lunch'],
  ['chat', '中午吃什么好'],
];

// Sticky sessions: first messages and, per first group, later turns of
// another group.
const firsts = {
  code: ['my Java program throws ConcurrentModificationException while iterating', 'write a Python class for a bank account with deposit and withdraw methods', '帮我写一个二分查找的代码', 'how can I speed up this slow SQL query with an index', 'my python script crashes with KeyError when the key is missing'],
  math: ['find the derivative of ln of x squared', 'prove that the sum of two even numbers is even', '计算三角形的面积，底是8，高是5', 'calculate the area of a triangle with base 10 and height 6', 'solve 5x - 3 = 2x + 9'],
  translation: ['translate into French: the library opens at nine', 'translate "I am hungry" into Japanese', '请翻译成中文：Good morning, everyone', 'what does "bonjour" mean in English', 'how do you say where is the bathroom in Spanish'],
  chat: ['tell me a funny story', 'give me gift ideas for my dad\'s birthday', '早上好，今天过得怎么样', 'what\'s a fun thing to do on a rainy day', 'what do you like to do for fun'],
};
const later_of = { code: 'chat', math: 'translation', translation: 'code', chat: 'math' };

const config = (examples_of = (name) => name) => gateway_config({
  tables: { router: { semantic: 'classifier', default_group: 'chat', min_confidence: 0.5, group_header: true } },
  groups: groups.map((name, i) => ({
    name,
    models: [name],
    backends: [backends[i].url],
    examples_file: name === 'vision' ? undefined : path.join(data, `${examples_of(name)}.txt`),
  })),
  keys: [{ id: 'all', key, groups: ['*'] }],
}) + '\n[[rule]]\ngroup = "vision"\nhas_images = true\npriority = "before"\n';

let backends = [];
let sluice;

const body = (messages) => ({ model: 'auto', messages, max_tokens: 2 });
async function send(messages, headers = {}) {
  const r = await post_fresh(sluice.url, body(messages), { key, headers });
  assert.equal(r.status, 200, r.text.slice(0, 300));
  const b = backend_of(r.text);
  assert.ok(b >= 0, r.text.slice(0, 200));
  return { group: groups[b], header: r.headers['x-sluice-group'], request_id: r.headers['x-request-id'] };
}

describe('semantic router', () => {
  before(async () => {
    backends = await start_backends(groups.length);
    sluice = await start_sluice({ config: config() });
  });
  after(async () => { await stop_all(sluice, ...backends); });

  it('routes a fixed set by meaning; the header and the audit line name the group, how and the confidence', async () => {
    const got = await run_pool(fixed.length, 4, async (i) => send([{ role: 'user', content: fixed[i][1] }]));
    for (const [i, [want, prompt]] of fixed.entries()) {
      assert.equal(got[i].group, want, `${prompt}: served by ${got[i].group}`);
      assert.equal(got[i].header, want);
    }
    const ids = new Set(got.map((g) => g.request_id));
    const lines = await poll(() => {
      const l = read_audit(path.join(sluice.dir, 'sluice-audit.jsonl')).filter((x) => ids.has(x.request_id));
      return l.length === fixed.length ? l : null;
    }, { what: 'the audit lines of the fixed set' });
    for (const l of lines) {
      assert.equal(l.model, 'auto');
      assert.equal(l.route, 'classifier');
      assert.ok(l.route_confidence >= 0.5 && l.route_confidence <= 1, JSON.stringify(l));
      assert.equal(l.group, got.find((g) => g.request_id === l.request_id).group);
    }
    const m = await scrape(sluice.admin_url);
    const code = samples(m.parsed, 'sluice_router_decisions_total', { group: 'code', how: 'classifier' });
    assert.equal(code.length, 1);
    assert.ok(code[0].value >= 3);
  });

  it('--explain-route prints the group, how and the confidence, and exits', () => {
    const toml = path.join(data, 'router.toml');
    const out = execFileSync(program('sluice'), ['--config', toml, '--explain-route', 'my function returns None, why?'], { encoding: 'utf8' });
    assert.match(out, /^group: code\nhow: classifier\nconfidence: (0|1)\.\d{3}\nclassifier \(naive Bayes and nearest examples over 200 examples of 4 groups, min_confidence 0\.500\): code /);
    // The config's groups name their built-in topics: the hits per topic follow.
    assert.match(out, /\ntopics \(topic_weight 2\.00 a hit, at most 2 counted\): code 0 math 0 translation 0 chat 0\n$/);
    const tool = execFileSync(program('sluice'), ['--config', toml, '--explain-route', 'webpack build dies with a segfault'], { encoding: 'utf8' });
    assert.match(tool, /^group: code\n[^]*\ntopics \(topic_weight 2\.00 a hit, at most 2 counted\): code 2 math 0 translation 0 chat 0\n$/);
    const lines = execFileSync(program('sluice'), ['--config', toml, '--explain-route', '-'],
      { encoding: 'utf8', input: '求解方程 x^2 = 4\n\n' });
    assert.match(lines, /^math\tclassifier\t(0|1)\.\d{3}\nchat\tdefault\t-\n$/);
    // A pick on the examples alone under its threshold: it yields to the
    // most probable group a topic backs, or (none matched) to the default;
    // a note says which (the held-out setting: 25 examples a group).
    const heldout = path.join(repo_root, 'tests', 'data', 'router-heldout', 'router.toml');
    const yielded = execFileSync(program('sluice'), ['--config', heldout, '--explain-route', '标准差怎么算'], { encoding: 'utf8' });
    assert.match(yielded, /^group: math\nhow: classifier\n[^]*\nclassifier [^\n]*: chat 0\.\d{3} math /);
    assert.match(yielded, /\nnote: chat 0\.\d{3} has no term of its topic and is under 0\.500: the most probable group a topic backs takes it \(math\)\n$/);
    const fell = execFileSync(program('sluice'), ['--config', heldout, '--explain-route', "what's the difference between an NDA and a non-compete"], { encoding: 'utf8' });
    assert.match(fell, /^group: chat\nhow: default\n/);
    assert.match(fell, /\nnote: code 0\.(5|6|7)\d{2} has no term of its topic and is under 0\.750, and no group's topic matched: the rules, then default_group\n$/);
  });

  it('a has_images rule with priority "before" decides ahead of the classifier', async () => {
    const r = await send([{ role: 'user', content: [
      { type: 'text', text: 'solve 5x - 3 = 2x + 9' },
      { type: 'image_url', image_url: { url: 'data:image/png;base64,iVBORw0KGgo=' } },
    ] }]);
    assert.equal(r.group, 'vision');
  });

  it('an empty or unsure prompt goes to the default group; 1 MiB of one character and an image alone are routed', async () => {
    assert.equal((await send([{ role: 'user', content: '' }])).group, 'chat');
    assert.equal((await send([{ role: 'user', content: 'qqqq zzzz' }])).group, 'chat');
    // 1 MiB of one character: the classifier reads semantic_bytes of it.
    const big = await send([{ role: 'user', content: 'a'.repeat(1 << 20) }]);
    assert.ok(groups.includes(big.group));
    // Only an image: the before-rule.
    assert.equal((await send([{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'data:image/png;base64,iVBORw0KGgo=' } }] }])).group, 'vision');
  });

  it('sticky: 20 sessions x 5 turns keep their first group although the later turns alone classify elsewhere', async () => {
    const sessions = [];
    for (const first of Object.keys(firsts)) {
      for (const [j, content] of firsts[first].entries()) sessions.push({ id: `s-${first}-${j}`, first, content });
    }
    assert.equal(sessions.length, 20);
    const later_prompts = (g) => firsts[later_of[g]].slice(0, 4);
    // The later turns, alone (no session), go to the other group.
    for (const g of Object.keys(firsts)) {
      for (const p of later_prompts(g)) {
        assert.equal((await send([{ role: 'user', content: p }])).group, later_of[g], p);
      }
    }
    const results = await run_pool(sessions.length, 5, async (i) => {
      const s = sessions[i];
      const history = [{ role: 'user', content: s.content }];
      const served = [];
      for (let turn = 0; turn < 5; ++turn) {
        if (turn > 0) {
          history.push({ role: 'assistant', content: 'Sure.' });
          history.push({ role: 'user', content: later_prompts(s.first)[turn - 1] });
        }
        served.push((await send(history, { 'x-session-id': s.id })).group);
      }
      return served;
    });
    for (const [i, served] of results.entries()) {
      assert.deepEqual(served, new Array(5).fill(sessions[i].first), `session ${sessions[i].id}`);
    }
    const m = await scrape(sluice.admin_url);
    const sticky = samples(m.parsed, 'sluice_router_decisions_total', { how: 'sticky' }).reduce((a, s) => a + s.value, 0);
    assert.equal(sticky, 20 * 4);
  });

  // Last: it changes the running config.
  it('SIGHUP retrains: with code and math examples swapped, a math prompt goes to the code group', async () => {
    const prompt = [{ role: 'user', content: 'solve 5x - 3 = 2x + 9' }];
    assert.equal((await send(prompt)).group, 'math');
    const swap = { code: 'math', math: 'code' };
    fs.writeFileSync(path.join(sluice.dir, 'sluice.toml'), config((name) => swap[name] ?? name));
    const from = sluice.proc.mark();
    sluice.proc.child.kill('SIGHUP');
    const said = await sluice.proc.wait_for_line(/SIGHUP: (reloaded|.*the running config stays)/, { from, timeout_ms: bound_ms(10000) });
    assert.match(said.line.text, /SIGHUP: reloaded/);
    await sluice.proc.wait_for_line(/router: classifier naive Bayes and nearest examples over 200 examples of 4 groups/, { from, timeout_ms: bound_ms(5000) });
    // Every shard takes the new snapshot at its next loop turn; the
    // connections are fresh, so they spread over the shards.
    await poll(async () => {
      const got = await run_pool(8, 4, async () => (await send(prompt)).group);
      return got.every((g) => g === 'code');
    }, { what: 'every shard routing by the retrained model' });
  });
});
