// A throwaway certificate authority for the TLS tests, made with the
// `openssl` CLI in a fresh temp dir: a CA key and self-signed certificate,
// and a server key and certificate for 127.0.0.1 / localhost signed by it
// (what NODE_EXTRA_CA_CERTS, curl --cacert and tls.connect({ca}) trust).
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

function openssl(args, cwd) {
  try {
    return execFileSync('openssl', args, { cwd, stdio: ['ignore', 'pipe', 'pipe'], timeout: 30000 });
  } catch (err) {
    throw new Error(`openssl ${args.join(' ')} failed: ${err.stderr?.toString() ?? err.message}`);
  }
}

// Returns {dir, ca_cert, ca_key, cert, key, chain (cert then CA), ca_pem
// (Buffer), remove()}; paths are absolute. `days` < 0 is not offered: an
// expired certificate is the client's problem (issue 16).
export function make_test_ca({ cn = 'localhost', ips = ['127.0.0.1'], dns = ['localhost'] } = {}) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sluice-ca-'));
  const p = (name) => path.join(dir, name);
  openssl(['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes',
    '-keyout', p('ca.key'), '-out', p('ca.crt'), '-days', '2', '-subj', '/CN=sluice test CA',
    '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign'], dir);
  openssl(['req', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes',
    '-keyout', p('server.key'), '-out', p('server.csr'), '-subj', `/CN=${cn}`], dir);
  const san = [...ips.map((ip) => `IP:${ip}`), ...dns.map((d) => `DNS:${d}`)].join(',');
  fs.writeFileSync(p('server.ext'), [
    `subjectAltName=${san}`, 'basicConstraints=critical,CA:FALSE',
    'keyUsage=critical,digitalSignature,keyEncipherment', 'extendedKeyUsage=serverAuth', '',
  ].join('\n'));
  openssl(['x509', '-req', '-in', p('server.csr'), '-CA', p('ca.crt'), '-CAkey', p('ca.key'), '-CAcreateserial',
    '-out', p('server.crt'), '-days', '2', '-extfile', p('server.ext')], dir);
  fs.writeFileSync(p('chain.pem'), Buffer.concat([fs.readFileSync(p('server.crt')), fs.readFileSync(p('ca.crt'))]));
  return {
    dir,
    ca_cert: p('ca.crt'),
    ca_key: p('ca.key'),
    cert: p('server.crt'),
    key: p('server.key'),
    chain: p('chain.pem'),
    ca_pem: fs.readFileSync(p('ca.crt')),
    remove() { if (!process.env.SLUICE_KEEP_TMP) fs.rmSync(dir, { recursive: true, force: true }); },
  };
}
