import { EbbError } from '../protocol/errors.js';

/**
 * AdmissionReview v1 (admission.k8s.io/v1), the part a validating webhook reads and answers:
 * https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/#request
 * The API server sends one review per call and needs the request's uid echoed in the response.
 */

export const ADMISSION_API_VERSION = 'admission.k8s.io/v1';

export interface GroupVersionResource {
  group: string;
  version: string;
  resource: string;
}

export interface AdmissionRequest {
  uid: string;
  resource: GroupVersionResource;
  subResource?: string;
  name?: string;
  namespace?: string;
  operation: string;
  userInfo?: { username?: string; uid?: string; groups?: string[] };
  dryRun?: boolean;
  object?: unknown;
}

/** The answer to one review: allowed, or refused with the Status the API server passes to its caller. */
export type Verdict = { allowed: true } | { allowed: false; code: number; reason: string; message: string };

export interface AdmissionReviewResponse {
  apiVersion: typeof ADMISSION_API_VERSION;
  kind: 'AdmissionReview';
  response: {
    uid: string;
    allowed: boolean;
    status?: { status: 'Failure'; code: number; reason: string; message: string };
  };
}

const isObj = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

const bad = (message: string) => new EbbError('invalid_request', `not an AdmissionReview ${ADMISSION_API_VERSION}: ${message}`);

/**
 * The request of a review, checked as far as the guard relies on it; anything else is a 400
 * (the API server never sends it: whoever did is not the API server, or not a v1 one).
 */
export function parseAdmissionReview(body: unknown): AdmissionRequest {
  if (!isObj(body)) throw bad('the body is not a JSON object');
  if (body.apiVersion !== ADMISSION_API_VERSION || body.kind !== 'AdmissionReview') throw bad(`apiVersion/kind is ${JSON.stringify(body.apiVersion)}/${JSON.stringify(body.kind)}`);
  const r = body.request;
  if (!isObj(r)) throw bad('no request');
  if (typeof r.uid !== 'string' || r.uid === '') throw bad('request.uid is missing');
  if (typeof r.operation !== 'string') throw bad('request.operation is missing');
  const res = r.resource;
  if (!isObj(res) || typeof res.resource !== 'string') throw bad('request.resource is missing');
  for (const f of ['subResource', 'name', 'namespace'] as const) if (r[f] !== undefined && typeof r[f] !== 'string') throw bad(`request.${f} is not a string`);
  if (r.dryRun !== undefined && typeof r.dryRun !== 'boolean') throw bad('request.dryRun is not a boolean');
  if (r.userInfo !== undefined && !isObj(r.userInfo)) throw bad('request.userInfo is not an object');
  return r as unknown as AdmissionRequest;
}

export function admissionResponse(uid: string, verdict: Verdict): AdmissionReviewResponse {
  const response: AdmissionReviewResponse['response'] = { uid, allowed: verdict.allowed };
  if (!verdict.allowed) response.status = { status: 'Failure', code: verdict.code, reason: verdict.reason, message: verdict.message };
  return { apiVersion: ADMISSION_API_VERSION, kind: 'AdmissionReview', response };
}
