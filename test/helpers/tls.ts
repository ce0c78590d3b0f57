import { execFileSync } from 'node:child_process';
import { readFileSync, renameSync } from 'node:fs';
import { join } from 'node:path';
import { X509Certificate } from 'node:crypto';

/** openssl makes the certificates: node:crypto reads X.509 but cannot issue it. */
export const OPENSSL = '/usr/bin/openssl';

export interface TestCert {
  certFile: string;
  keyFile: string;
  /** The PEM certificate: self-signed, so it is also the CA a client trusts. */
  cert: string;
  /** The PEM private key, for a test that presents the certificate as a client. */
  key: string;
  fingerprint: string;
}

/**
 * A self-signed P-256 certificate for localhost / 127.0.0.1, written as `name`.crt / `name`.key in
 * `dir`. With `as`, the files are then renamed over `as`.crt / `as`.key (each appears whole, as
 * when a Secret volume is updated), for a test of a certificate renewal.
 */
export function makeCert(dir: string, name: string, as?: string): TestCert {
  const keyFile = join(dir, `${name}.key`);
  const certFile = join(dir, `${name}.crt`);
  execFileSync(OPENSSL, ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-days', '1', '-subj', `/CN=ebb-test-${name}`, '-addext', 'subjectAltName=DNS:localhost,IP:127.0.0.1', '-keyout', keyFile, '-out', certFile], { stdio: 'ignore' });
  const cert = readFileSync(certFile, 'utf8');
  const out = { certFile, keyFile, cert, key: readFileSync(keyFile, 'utf8'), fingerprint: new X509Certificate(cert).fingerprint256 };
  if (as === undefined) return out;
  const target = { keyFile: join(dir, `${as}.key`), certFile: join(dir, `${as}.crt`) };
  renameSync(keyFile, target.keyFile);
  renameSync(certFile, target.certFile);
  return { ...out, ...target };
}
