// API keys (issue 3): 401 with OpenAI's invalid_api_key body for a missing,
// wrong or malformed key; a group's own upstream credential replaces the
// client's; and the client's Bearer key never leaves sluice: not to a
// backend (headers or body), not to its stdout/stderr (at debug level), not
// to the audit file, not in any answer (headers or body), wrong keys
// included. The test greps every one of those for every key it sent.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';

import { chat_body, is_openai_error, start_mock_vllm, start_sluice, stop_all } from './lib/harness.mjs';
import { gateway_config, header_of, post_fresh, read_audit, recorded_requests } from './lib/gateway.mjs';

const valid_key = 'sk-live-SECRETa1b2c3d4e5f6-alice';
const limited_key = 'sk-live-SECRETq9r8s7t6u5-bob';
const wrong_keys = [
  'sk-wrong-SECRETdeadbeef0001',
  valid_key.slice(0, -1),          // a prefix of the valid key
  `${valid_key}x`,                 // the valid key plus one byte
  valid_key.toUpperCase(),
];
const upstream_key = 'upstream-SECRET-7c7c7c7c';
const upstream_env = 'SLUICE_IT_UPSTREAM_KEY';

// Strings that must not appear anywhere outside sluice's config: the keys
// and their distinctive middles (a log that prints a key cut or masked at
// the ends still leaks its middle).
const client_secrets = [valid_key, limited_key, ...wrong_keys, 'SECRETa1b2c3d4e5f6', 'SECRETq9r8s7t6u5', 'SECRETdeadbeef0001'];

function leaks(text, secrets) {
  const lower = text.toLowerCase();
  return secrets.filter((s) => lower.includes(s.toLowerCase()));
}

describe('API keys', () => {
  let backends;
  let sluice;
  const answers = [];   // every response: {what, status, headers, text}

  const send = async (what, body, { key, headers = {} } = {}) => {
    const r = await post_fresh(sluice.url, body, { key, headers });
    answers.push({ what, ...r });
    return r;
  };

  before(async () => {
    // backend 1 wants the group's own credential, as a vLLM started with --api-key.
    backends = [await start_mock_vllm({ model: 'backend-0' })];
    backends.push(await start_mock_vllm({ model: 'backend-1', api_key: upstream_key }));
    sluice = await start_sluice({
      env: { [upstream_env]: upstream_key },
      extra_args: ['--log-level', 'debug'],
      config: gateway_config({
        groups: [
          { name: 'open', models: ['open-model'], backends: [backends[0].url] },
          { name: 'creds', models: ['creds-model'], api_key_env: upstream_env, backends: [backends[1].url] },
        ],
        keys: [
          { id: 'alice', key: valid_key, groups: ['*'] },
          { id: 'bob', key: limited_key, groups: ['open'], requests_per_minute: 1 },
        ],
      }),
    });
  });
  after(() => stop_all(sluice, ...(backends ?? [])));

  it('a missing, wrong or malformed key gets 401 invalid_api_key and reaches no backend', async () => {
    for (const b of backends) await b.clear_requests();
    const cases = [
      ['no authorization', {}],
      ['empty bearer', { authorization: 'Bearer ' }],
      ['no scheme', { authorization: valid_key }],
      ['basic scheme', { authorization: `Basic ${valid_key}` }],
      ['a wrong key in x-api-key', { 'x-api-key': 'sk-not-a-key' }],
      ...wrong_keys.map((k, i) => [`wrong key ${i}`, { authorization: `Bearer ${k}` }]),
    ];
    for (const [what, headers] of cases) {
      const r = await send(what, chat_body({ model: 'open-model' }), { headers });
      assert.equal(r.status, 401, `${what}: ${r.text}`);
      const json = JSON.parse(r.text);
      assert.ok(is_openai_error(json), `${what}: ${r.text}`);
      assert.equal(json.error.code, 'invalid_api_key', what);
      assert.equal(json.error.type, 'invalid_request_error', what);
    }
    assert.deepEqual(await recorded_requests(backends), [], 'nothing reached a backend');
  });

  it('a valid key is served; the backend sees no client key but the group\'s own credential', async () => {
    for (const b of backends) await b.clear_requests();
    const bodies = [
      ['open non-stream', chat_body({ model: 'open-model' }), 'x-open-1'],
      ['open stream', chat_body({ model: 'open-model', stream: true }), 'x-open-2'],
      ['creds non-stream', chat_body({ model: 'creds-model' }), 'x-creds-1'],
      ['creds stream', chat_body({ model: 'creds-model', stream: true, include_usage: true }), 'x-creds-2'],
    ];
    // Send all, then assert: the last test greps every answer.
    const replies = [];
    for (const [what, body, id] of bodies) replies.push(await send(what, body, { key: valid_key, headers: { 'x-request-id': id } }));
    for (const [i, r] of replies.entries()) assert.equal(r.status, 200, `${bodies[i][0]}: ${r.text}`);
    const seen = await recorded_requests(backends);
    assert.equal(seen.length, 4);
    for (const q of seen) {
      const auth = header_of(q, 'authorization');
      if (q.backend === 1) assert.equal(auth, `Bearer ${upstream_key}`, 'the group credential replaces the client\'s');
      else assert.equal(auth, undefined, 'a group without a credential sends no Authorization');
      assert.deepEqual(leaks(JSON.stringify(q), client_secrets), [], `request ${header_of(q, 'x-request-id')} at backend ${q.backend}`);
    }
  });

  it('error answers of every kind carry no key', async () => {
    // 404 (unknown model), 404 (model of a group the key may not use), 400
    // (bad JSON), 400 (bad max_tokens), 429 (requests_per_minute = 1).
    const cases = [
      ['unknown model', chat_body({ model: 'nope' }), valid_key, 404],
      ['other group', chat_body({ model: 'creds-model' }), limited_key, 404],
      ['bad json', `{"model":"open-model","messages":[{"role":"user","content":"${valid_key}"}`, valid_key, 400],
      ['bad max_tokens', chat_body({ model: 'open-model', max_tokens: -5 }), valid_key, 400],
      ['first of bob', chat_body({ model: 'open-model' }), limited_key, 200],
      ['second of bob', chat_body({ model: 'open-model' }), limited_key, 429],
    ];
    const replies = [];
    for (const [what, body, key] of cases) replies.push(await send(what, body, { key }));
    for (const [i, r] of replies.entries()) {
      const [what, , , status] = cases[i];
      assert.equal(r.status, status, `${what}: ${r.text}`);
      if (status !== 200) assert.ok(is_openai_error(JSON.parse(r.text)), `${what}: ${r.text}`);
    }
  });

  it('no key (valid or wrong) appears in any answer, in sluice\'s output or in the audit file', async () => {
    assert.equal(answers.length, 9 + 4 + 6, 'the tests above sent their requests');
    for (const a of answers) {
      assert.deepEqual(leaks(JSON.stringify(a.headers) + a.text, client_secrets), [], `answer to "${a.what}" (${a.status})`);
      assert.deepEqual(leaks(JSON.stringify(a.headers) + a.text, [upstream_key]), [], `answer to "${a.what}" shows the upstream key`);
    }
    // SIGTERM flushes the audit file; read it before the dir goes.
    const exit = await sluice.proc.stop();
    assert.equal(exit.code, 0, sluice.proc.output());
    const output = sluice.proc.output();
    assert.ok(output.length > 0);
    assert.deepEqual(leaks(output, [...client_secrets, upstream_key]), [], 'sluice stdout/stderr');
    const audit_file = path.join(sluice.dir, 'sluice-audit.jsonl');
    const audit_text = fs.readFileSync(audit_file, 'utf8');
    // The "bad json" body quotes the valid key as message content; the
    // audit line records no content, so it must not show up there either.
    assert.deepEqual(leaks(audit_text, [...client_secrets, upstream_key]), [], 'audit file');
    const lines = read_audit(audit_file);
    assert.equal(lines.length, answers.length, 'one audit line per answer');
    assert.deepEqual([...new Set(lines.map((l) => l.key_id))].sort(), ['alice', 'bob', null].sort());
  });
});
